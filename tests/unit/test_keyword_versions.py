"""The owner's storage and publication: versions kept as diffs with periodic full copies and a
retention, read back byte for byte; the current records exported and rebuilt; versions of any
size published whole, once, and in order, whatever crashes in between."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from _kw import lookup
from _party_world import apply_batch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from morphogen.keyword import KeywordTable, build_table
from morphogen.keyword.descriptor import Descriptor
from morphogen.keyword.owner import Change, OwnerTable, create_owner_dir
from morphogen.keyword.publishing import ROTATE_ABOVE, PublishError, publish
from morphogen.keyword.records import RecordError
from morphogen.keyword.versions import VersionGone
from morphogen.snapshot.reader import Snapshot

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


def _records(n: int, seed: int) -> dict[bytes, bytes]:
    rng = random.Random(seed)
    return {rng.randbytes(20): rng.randbytes(32) for _ in range(n)}


def _owner_dir(tmp_path: Path, recs: dict[bytes, bytes], **options: int
               ) -> tuple[KeywordTable, Path]:
    """The records built into a table and written as version 1 of the owner directory
    `tmp_path/o`; returns the table and the directory."""
    table = build_table(recs.items(), value_size=32, signing_key=KEY, load=0.7)
    create_owner_dir(table, tmp_path / "o", **options)
    return table, tmp_path / "o"


def _lookup(pages: np.ndarray, keys: list[bytes]) -> list[bytes | None]:
    desc = Descriptor.from_page(pages[-1].tobytes(), KEY.public_key())
    return lookup(pages, desc, keys, whole=1)


def _changes(rng: random.Random, recs: dict[bytes, bytes], n: int) -> list[Change]:
    out = [Change("put", rng.randbytes(20), rng.randbytes(32)) for _ in range(n)]
    out += [Change("put", k, rng.randbytes(32)) for k in rng.sample(sorted(recs), n)]
    out += [Change("delete", k) for k in rng.sample(sorted(recs), 2)]
    return out


def _rewrites(rng: random.Random, recs: dict[bytes, bytes], n: int) -> list[Change]:
    """New values for `n` records (the table does not grow): a batch of some weight."""
    return [Change("put", k, rng.randbytes(32)) for k in rng.sample(sorted(recs), n)]


def _follow(recs: dict[bytes, bytes], changes: list[Change]) -> None:
    for c in changes:
        if c.op == "put":
            recs[c.key] = c.value
        else:
            recs.pop(c.key, None)


def test_every_retained_version_reads_as_its_full_copy(tmp_path: Path) -> None:
    recs = _records(6000, seed=1)
    table, root = _owner_dir(tmp_path, recs, full_every=3, keep=2)
    owner = OwnerTable(tmp_path / "o")
    rng = random.Random(2)
    full = {1: table.pages.copy()}
    for _ in range(8):  # versions 2..9: full copies at 4 and 7, diffs between
        changes = _changes(rng, recs, 5)
        version, _ = owner.apply(changes, KEY, rng=rng.randrange)
        _follow(recs, changes)
        full[version] = owner.pages().copy()
        # what a full copy of the new version holds: the previous one plus its batch
        expected = full[version - 1].copy()
        for page, kind, data in owner.unpublished()[-1][2]:
            assert kind == "diff"  # the page XOR the page before
            expected[page] ^= np.frombuffer(data, np.uint8)
        assert np.array_equal(full[version], expected)
    root = tmp_path / "o"
    assert [v for v in range(1, 10) if (root / f"v{v:06d}" / "snapshot").is_dir()] == [1, 4, 7]
    owner.mark_published(9)  # only the last 2 must stay readable now: 8 and 9, from 7
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("v")) == [
        "v000001", "v000007", "v000008", "v000009"]
    for v in (1, 7, 8, 9):
        assert np.array_equal(OwnerTable(root).pages(v), full[v]), v
    with pytest.raises(VersionGone, match="version 5 is no longer kept"):
        owner.pages(5)
    # a diff version is the changed pages, not a copy of the table
    diff = sum(f.stat().st_size for f in (root / "v000008").iterdir())
    assert diff < (root / "v000007" / "snapshot" / "pages.bin").stat().st_size / 4
    keys = list(recs)
    assert _lookup(owner.pages(), keys) == [recs[k] for k in keys]


def test_unpublished_versions_stay_whatever_the_retention(tmp_path: Path) -> None:
    recs = _records(600, seed=3)
    create_owner_dir(build_table(recs.items(), value_size=32, signing_key=KEY, load=0.7),
                     tmp_path / "o", full_every=2, keep=1)
    owner = OwnerTable(tmp_path / "o")
    rng = random.Random(4)
    for _ in range(5):
        owner.apply(_changes(rng, recs, 3), KEY, rng=rng.randrange)
    # nothing published: every version's batch is still there to send
    assert [v for v, _, _ in owner.unpublished()] == [2, 3, 4, 5, 6]


def test_export_then_rebuild_finds_the_same_records(tmp_path: Path, capsys) -> None:
    from cluster.cli import main

    recs = _records(800, seed=5)
    create_owner_dir(build_table(recs.items(), value_size=32, signing_key=KEY, load=0.7),
                     tmp_path / "o", full_every=4)
    owner = OwnerTable(tmp_path / "o")
    rng = random.Random(6)
    for _ in range(2):
        changes = _changes(rng, recs, 10)
        owner.apply(changes, KEY, rng=rng.randrange)
        _follow(recs, changes)
    out = tmp_path / "records.jsonl"
    assert main(["records", "export", "--owner", str(tmp_path / "o"), "--out", str(out)]) == 0
    assert f"{len(recs)} records of version 3" in capsys.readouterr().out
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert {bytes.fromhex(x["key"][2:]): bytes.fromhex(x["value"][2:]) for x in lines} == recs
    (tmp_path / "o.key").write_text(KEY.private_bytes_raw().hex())
    assert main(["build", "--records", str(out), "--value-size", "32", "--signing-key",
                 str(tmp_path / "o.key"), "--out", str(tmp_path / "rebuilt"), "--after",
                 str(tmp_path / "o"), "--anchor", "1:12345:0x" + "0a" * 32]) == 0
    assert "version 4:" in capsys.readouterr().out
    pages = OwnerTable(tmp_path / "rebuilt").pages()
    keys = sorted(recs)
    assert _lookup(pages, keys) == [recs[k] for k in keys]
    # the rebuild goes on numbering after version 3, so clients that read it accept the new
    desc = Descriptor.from_page(pages[-1].tobytes(), KEY.public_key())
    assert desc.version == 4 and desc.anchor is not None and desc.anchor.number == 12345
    assert main(["build", "--records", str(out), "--value-size", "32", "--signing-key",
                 str(tmp_path / "o.key"), "--out", str(tmp_path / "again"), "--anchor",
                 "1:2"]) == 2
    assert "--anchor 1:2: expected CHAIN_ID:NUMBER:0xHASH" in capsys.readouterr().err


class FakeParty:
    """A party as the owner sees one: publications by id, each applied once; a rotation
    reads the snapshot at its path as a party would."""

    def __init__(self, pages: np.ndarray) -> None:
        self.pages = pages.copy()
        self.seen: dict[str, str] = {}
        self.applied = 0

    def take(self, pub: str, request: str, apply) -> dict:
        if pub in self.seen:
            if self.seen[pub] != request:  # what a party answers 409 to
                raise AssertionError(f"{pub} re-sent as another request")
            return {"epoch_id": len(self.seen), "duplicate": True}
        apply()
        self.seen[pub] = request
        self.applied += 1
        return {"epoch_id": len(self.seen)}


class FakeParties:
    def __init__(self, pages: np.ndarray, cap: int) -> None:
        self.a, self.b, self.cap = FakeParty(pages), FakeParty(pages), cap
        self.fail_b = 0  # how many sends to B fail (an owner that dies between the parties)
        self.cache: str | None = None  # where a party caches a remote snapshot's chunks

    def max_updates(self) -> int:
        return self.cap

    def digest_version(self) -> int:
        return 2

    def _both(self, pub: str, request: str, apply_to) -> list[dict]:
        out = [self.a.take(pub, request, lambda: apply_to(self.a))]
        if self.fail_b:
            self.fail_b -= 1
            raise ConnectionError("the owner died between the parties")
        return out + [self.b.take(pub, request, lambda: apply_to(self.b))]

    def updates(self, pub, batch):
        def apply_to(party: FakeParty) -> None:
            party.pages = apply_batch(party.pages, batch)
        return self._both(pub, "updates", apply_to)

    def snapshot(self, pub, path):
        from morphogen.snapshot.open import open_any

        def apply_to(party: FakeParty) -> None:
            with open_any(path, verify=True, cache_dir=self.cache) as snap:
                party.pages = np.array(snap.read_verified())
        return self._both(pub, f"rotation:{path}", apply_to)


def test_a_full_copy_comes_once_the_diffs_since_the_last_add_up_to_the_table(
        tmp_path: Path) -> None:
    """By default the owner writes a full copy only when the batches since the last one take
    as many bytes as the table: what it writes a block is the block's batch, amortized."""
    recs = _records(3000, seed=21)
    table, root = _owner_dir(tmp_path, recs)
    owner = OwnerTable(tmp_path / "o")
    total = table.pages.nbytes
    rng = random.Random(22)
    sizes, copies = {}, {}
    for _ in range(14):
        changes = _changes(rng, recs, 3) + _rewrites(rng, recs, 300)
        version, batch = owner.apply(changes, KEY, rng=rng.randrange)
        _follow(recs, changes)
        # a batch is stored as the bytes that changed: far less than its pages
        assert owner.store.batch_bytes(version) < len(batch) * 4096 / 4
        sizes[version], copies[version] = owner.store.batch_bytes(version), owner.pages().copy()
        owner.mark_published(version)
    fulls = [v for v in sizes if (root / f"v{v:06d}" / "snapshot").is_dir()]
    assert fulls, "no full copy in 14 versions"
    since = 0
    for v in sorted(sizes):
        since += sizes[v]
        assert (v in fulls) == (since >= total), (v, since, total)
        if v in fulls:
            since = 0
    assert owner.state["diff_bytes"] == since
    for v in range(max(fulls), 16):  # a full copy and the diffs after it read back whole
        assert np.array_equal(OwnerTable(root).pages(v), copies[v]), v


def test_a_full_copy_that_never_lands_is_written_again_by_a_later_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower's full copy that fails, or dies with its process, is made again: the count
    of diff bytes since the last full copy is reset only where one has landed, so the diffs
    to replay and keep stay under two tables' worth whatever becomes of a copy."""
    recs = _records(3000, seed=41)
    table, root = _owner_dir(tmp_path, recs)
    total = table.pages.nbytes
    owner = OwnerTable(root)
    owner.checkpoints_in_background()
    failed: list[int] = []

    def fails(version: int) -> bool:
        failed.append(version)
        raise OSError("disk full")

    monkeypatch.setattr(owner.store, "checkpoint", fails)
    rng = random.Random(42)
    copies = {}
    while len(failed) < 2:  # a copy fails, and the next version tries again
        changes = _changes(rng, recs, 3) + _rewrites(rng, recs, 300)
        version, _ = owner.apply(changes, KEY, rng=rng.randrange)
        _follow(recs, changes)
        copies[version] = owner.pages().copy()
        owner.wait_checkpoints()
        assert version < 40
    assert failed[1] == failed[0] + 1
    assert [v for v in copies if owner.store.is_full(v)] == []
    saved = json.loads((root / "owner.json").read_text())["diff_bytes"]
    assert saved == owner.store.bytes_since_full(version) >= total
    # the process ends with no copy landed (as one killed amid it would); the next one, on
    # the saved state, writes the copy at its first version
    again = OwnerTable(root)
    again.checkpoints_in_background()
    changes = _changes(rng, recs, 3)
    version, _ = again.apply(changes, KEY, rng=rng.randrange)
    _follow(recs, changes)
    copies[version] = again.pages().copy()
    again.wait_checkpoints()
    assert [v for v in copies if again.store.is_full(v)] == [version]
    changes = _changes(rng, recs, 3)
    version, _ = again.apply(changes, KEY, rng=rng.randrange)
    copies[version] = again.pages().copy()
    assert again.state["diff_bytes"] == again.store.batch_bytes(version) < total
    for v in copies:
        assert np.array_equal(OwnerTable(root).pages(v), copies[v]), v


def test_a_full_copy_in_the_background_leaves_every_version_reading_as_before(
        tmp_path: Path) -> None:
    """A follower's full copies: written in a thread while later versions are applied, never
    on `apply`'s path; every version reads the same bytes and keys before, during and after,
    and a crashed copy's leftovers change nothing."""
    recs = _records(3000, seed=31)
    table, root = _owner_dir(tmp_path, recs)
    owner = OwnerTable(root)
    owner.checkpoints_in_background()
    (root / ".ckpt-v000009-dead").mkdir()  # a crashed copy's leftovers
    (root / ".ckpt-v000009-dead" / "pages.raw").write_bytes(b"x" * 100)
    rng = random.Random(32)
    copies, keys = {1: table.pages.copy()}, {1: dict(table.keys)}
    for _ in range(14):
        changes = _changes(rng, recs, 3) + _rewrites(rng, recs, 300)
        version, _ = owner.apply(changes, KEY, rng=rng.randrange)
        _follow(recs, changes)
        copies[version], keys[version] = owner.pages().copy(), owner.keys()
    owner.wait_checkpoints()
    fulls = [v for v in copies if owner.store.is_full(v)]
    assert len(fulls) >= 2 and 1 in fulls, fulls  # at least one made after the fact
    assert not list(root.glob(".ckpt-*"))
    for v in fulls[1:]:
        # written as a diff, made full: both the batch the parties are sent and the copy
        assert (root / f"v{v:06d}" / "batch.bin").is_file()
    reread = OwnerTable(root)
    for v in copies:
        assert np.array_equal(reread.pages(v), copies[v]), v
        assert reread.keys(v) == keys[v], v
    with Snapshot.open(root / f"v{fulls[-1]:06d}" / "snapshot", verify=True) as snap:
        assert np.array_equal(snap.read_verified(), copies[fulls[-1]])
    owner.mark_published(15)  # the last full copy is what retention now keeps reading from
    assert reread.pages(15).tobytes() == copies[15].tobytes()


def test_the_working_pages_in_a_mapped_file_survive_a_failed_apply_and_a_restart(
        tmp_path: Path) -> None:
    """A follower's current pages live in `working/pages.bin`, written in place: the file
    always holds exactly the current version once an apply is done, an apply that fails
    midway (a change after some pages were written) leaves it marked unclean and it is
    rebuilt, and a new process reuses a clean one."""
    from morphogen.keyword.key_index import KeyIndex
    from morphogen.keyword.working import WORKING_DIR

    recs = _records(2000, seed=41)
    table, root = _owner_dir(tmp_path, recs)
    owner = OwnerTable(root)
    owner.map_working_pages()
    rng = random.Random(42)
    for _ in range(3):
        changes = _changes(rng, recs, 4)
        owner.apply(changes, KEY, rng=rng.randrange)
        _follow(recs, changes)
    record = json.loads((root / WORKING_DIR / "working.json").read_text())
    assert (record["version"], record["clean"]) == (owner.current, True)
    assert np.array_equal(np.fromfile(root / WORKING_DIR / "pages.bin", np.uint8).reshape(
        -1, 4096), owner.store.pages(owner.current))
    # the keys too live in files, changed in place: the index holds the version's keys
    with KeyIndex(root / WORKING_DIR / "keys", writable=False) as index:
        assert dict(index.items()) == owner.store.keys(owner.current)
        assert len(index) == len(recs)
    before = owner.current
    good = _changes(rng, recs, 3)
    bad = Change("put", sorted(recs)[0], b"short")  # refused after the others were written
    with pytest.raises(RecordError, match="value is 5 bytes"):
        owner.apply([*good, bad], KEY, rng=rng.randrange)
    assert owner.current == before
    assert json.loads((root / WORKING_DIR / "working.json").read_text())["clean"] is False
    assert np.array_equal(owner.pages(), owner.store.pages(before))  # rebuilt, not the mix
    assert owner.keys() == owner.store.keys(before)  # the keys too
    keys = sorted(recs)
    assert _lookup(owner.pages(), keys) == [recs[k] for k in keys]
    # a restart: the clean file is used as it is (mtime unchanged), and reads the same
    owner.apply(good, KEY, rng=rng.randrange)
    _follow(recs, good)
    stamp = (root / WORKING_DIR / "pages.bin").stat().st_mtime_ns
    again = OwnerTable(root)
    again.map_working_pages()
    keys = sorted(recs)
    assert _lookup(again.pages(), keys) == [recs[k] for k in keys]
    assert again.keys() == OwnerTable(root).keys() and len(again.keys()) == len(recs)
    assert (root / WORKING_DIR / "pages.bin").stat().st_mtime_ns == stamp
    # written in another boot of the machine: pages the kernel had not written out may be
    # lost, so it is rebuilt
    path = root / WORKING_DIR / "working.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "boot": "another"}))
    rebooted = OwnerTable(root)
    rebooted.map_working_pages()
    assert np.array_equal(rebooted.pages(), rebooted.store.pages(rebooted.current))
    assert (root / WORKING_DIR / "pages.bin").stat().st_mtime_ns != stamp


def test_a_version_bigger_than_a_request_goes_as_updates_if_it_changed_a_small_share(
        tmp_path: Path) -> None:
    recs = _records(3000, seed=17)
    table, root = _owner_dir(tmp_path, recs)
    owner = OwnerTable(tmp_path / "o")
    parties = FakeParties(table.pages, cap=4)
    rng = random.Random(18)
    changed = {k: rng.randbytes(32) for k in sorted(recs)[:6]}
    version, batch = owner.apply([Change("put", k, v) for k, v in changed.items()], KEY,
                                 rng=rng.randrange)
    assert parties.cap < len(batch) <= ROTATE_ABOVE * owner.num_pages()
    # no snapshot directory is needed: nothing about this version calls for a rotation
    done = publish(owner, parties)
    assert [(p.version, p.mode, p.pages) for p in done] == [(version, "updates", len(batch))]
    assert np.array_equal(parties.a.pages, owner.pages())
    recs.update(changed)
    assert _lookup(parties.b.pages, sorted(changed)) == [recs[k] for k in sorted(changed)]


def test_a_version_changing_most_of_the_table_goes_whole_as_a_rotation(tmp_path: Path) -> None:
    recs = _records(1200, seed=7)
    table, root = _owner_dir(tmp_path, recs, full_every=4)
    owner = OwnerTable(tmp_path / "o")
    parties = FakeParties(table.pages, cap=8)
    rng = random.Random(8)
    big = [Change("put", k, rng.randbytes(32)) for k in sorted(recs)[:300]]
    big_version, big_batch = owner.apply(big, KEY, rng=rng.randrange)
    assert len(big_batch) > ROTATE_ABOVE * owner.num_pages()
    small = [Change("put", sorted(recs)[400], rng.randbytes(32))]
    small_version, _ = owner.apply(small, KEY, rng=rng.randrange)
    _follow(recs, big + small)
    parties.fail_b = 1
    with pytest.raises(ConnectionError):
        publish(owner, parties, snapshot_dir=str(tmp_path / "snaps"))
    assert (parties.a.applied, parties.b.applied) == (1, 0) and owner.published == 1
    # the re-run (another process) sends the recorded form: A answers it as done
    done = publish(OwnerTable(tmp_path / "o"), parties, snapshot_dir=str(tmp_path / "other"))
    assert [(p.version, p.mode) for p in done] == [(big_version, "rotation"),
                                                   (small_version, "updates")]
    assert done[0].results[0].get("duplicate") and not done[0].results[1].get("duplicate")
    assert parties.a.applied == parties.b.applied == 2
    assert not (tmp_path / "other").exists()
    assert np.array_equal(parties.a.pages, parties.b.pages)
    assert np.array_equal(parties.a.pages, owner.pages())
    keys = sorted(recs)
    assert _lookup(parties.b.pages, keys) == [recs[k] for k in keys]
    assert publish(OwnerTable(tmp_path / "o"), parties) == []


def test_a_rotation_snapshot_is_never_replaced_by_other_bytes(tmp_path: Path) -> None:
    recs = _records(400, seed=9)
    table, root = _owner_dir(tmp_path, recs)
    owner = OwnerTable(tmp_path / "o")
    rng = random.Random(10)
    owner.apply([Change("put", k, rng.randbytes(32)) for k in sorted(recs)[:60]], KEY,
                rng=rng.randrange)
    parties = FakeParties(table.pages, cap=2)
    snaps = tmp_path / "snaps"
    from morphogen.keyword.publishing import snapshot_name
    from morphogen.snapshot.writer import write_snapshot

    write_snapshot(snaps / snapshot_name(owner, 2), table.pages, epoch_id=2, source="other")
    with pytest.raises(PublishError, match="holds another snapshot than version 2"):
        publish(owner, parties, snapshot_dir=str(snaps))
    assert parties.a.applied == 0


def test_apply_of_the_same_changes_file_again_applies_nothing(tmp_path: Path, capsys) -> None:
    from cluster.cli import main

    recs = _records(300, seed=11)
    create_owner_dir(build_table(recs.items(), value_size=32, signing_key=KEY, load=0.7),
                     tmp_path / "o")
    (tmp_path / "o.key").write_text(KEY.private_bytes_raw().hex())
    key = sorted(recs)[0]
    changes = tmp_path / "c.jsonl"
    changes.write_text(json.dumps({"op": "delete", "key": "0x" + key.hex()}) + "\n")
    args = ["records", "apply", "--owner", str(tmp_path / "o"), "--signing-key",
            str(tmp_path / "o.key"), str(changes)]
    assert main(args) == 0
    assert main(args) == 0  # a delete applied twice would be refused: the key is gone
    assert "version 2 already holds" in capsys.readouterr().out
    assert OwnerTable(tmp_path / "o").current == 2
    changes.write_text(json.dumps({"op": "put", "key": "0x" + key.hex(),
                                   "value": "0x" + "00" * 32}) + "\n")
    assert main(args) == 0 and OwnerTable(tmp_path / "o").current == 3


def test_a_big_version_rotates_from_an_object_store_prefix(tmp_path: Path, s3_bucket) -> None:
    recs = _records(500, seed=12)
    table, root = _owner_dir(tmp_path, recs)
    owner = OwnerTable(tmp_path / "o")
    rng = random.Random(13)
    changes = [Change("put", k, rng.randbytes(32)) for k in sorted(recs)[:80]]
    owner.apply(changes, KEY, rng=rng.randrange)
    _follow(recs, changes)
    parties = FakeParties(table.pages, cap=2)
    parties.cache, parties.fail_b = str(tmp_path / "cache"), 1
    prefix = f"s3://{s3_bucket}/snaps"
    with pytest.raises(ConnectionError):
        publish(owner, parties, snapshot_dir=prefix)
    # the re-run pushes the same manifest again (a push never replaces another snapshot)
    done = publish(OwnerTable(tmp_path / "o"), parties, snapshot_dir=prefix)
    assert [p.mode for p in done] == ["rotation"]
    assert (parties.a.applied, parties.b.applied) == (1, 1)
    assert np.array_equal(parties.b.pages, owner.pages())
    assert OwnerTable(tmp_path / "o").published == 2


def test_a_directory_written_before_the_key_index_is_read_and_followed(tmp_path: Path) -> None:
    """Full versions once held their keys as one msgpack file: such a directory reads the same,
    takes updates, and a follower's working index is built from it."""
    import shutil

    import msgpack

    recs = _records(800, seed=51)
    table, root = _owner_dir(tmp_path, recs)
    v1 = root / "v000001"
    shutil.rmtree(v1 / "keys")
    (v1 / "keys.msgpack").write_bytes(msgpack.packb(
        {"tags": b"".join(table.keys), "keys": list(table.keys.values())}, use_bin_type=True))
    assert OwnerTable(root).keys() == table.keys
    owner = OwnerTable(root)
    owner.map_working_pages()
    rng = random.Random(52)
    changes = _changes(rng, recs, 5)
    owner.apply(changes, KEY, rng=rng.randrange)
    _follow(recs, changes)
    keys = sorted(recs)
    assert _lookup(owner.pages(), keys) == [recs[k] for k in keys]
    assert OwnerTable(root).keys() == owner.keys()
    assert len(owner.keys()) == len(recs)


def test_versions_written_as_whole_pages_are_read_and_made_full(tmp_path: Path) -> None:
    """Diff versions once held `batch.msgpack`, each changed page whole: they read as before,
    with the XOR batches written after them on top, a checkpoint of a later version goes
    through them, and they are published as they were stored."""
    import msgpack

    recs = _records(1500, seed=71)
    table, root = _owner_dir(tmp_path, recs)
    owner = OwnerTable(root)
    rng = random.Random(72)
    copies = {1: table.pages.copy()}
    for _ in range(3):
        changes = _changes(rng, recs, 4)
        version, _ = owner.apply(changes, KEY, rng=rng.randrange)
        _follow(recs, changes)
        copies[version] = owner.pages().copy()
    for v in (2, 3):  # as an earlier release wrote them
        folder = root / f"v{v:06d}"
        pages = [p for p, _, _ in owner.store.batch(v)]
        (folder / "batch.msgpack").write_bytes(msgpack.packb(
            [[p, "data", copies[v][p].tobytes()] for p in pages], use_bin_type=True))
        (folder / "batch.bin").unlink()
        assert [k for _, k, _ in owner.store.batch(v)] == ["data"] * len(pages)
    reread = OwnerTable(root)
    for v, pages in copies.items():
        assert np.array_equal(reread.pages(v), pages), v
    assert reread.store.checkpoint(4)
    with Snapshot.open(root / "v000004" / "snapshot", verify=True) as snap:
        assert np.array_equal(snap.read_verified(), copies[4])


def test_a_checkpoint_killed_between_its_renames_is_made_again(tmp_path: Path) -> None:
    """A full copy is added to a diff version's directory keys first, snapshot last: a crash
    between the two leaves the keys in a version that is still a diff. The next checkpoint of
    it replaces them and makes the version full."""
    from morphogen.keyword.key_index import KeyIndex

    recs = _records(1500, seed=61)
    table, root = _owner_dir(tmp_path, recs)
    owner = OwnerTable(root)
    rng = random.Random(62)
    version, _ = owner.apply(_changes(rng, recs, 4), KEY, rng=rng.randrange)
    assert not owner.store.is_full(version)
    # what the crash left: an index of other keys where the version's keys go
    stale = b"\x01" * 16
    with KeyIndex.build(root / f"v{version:06d}" / "keys", [(stale, b"stale")], 64) as i:
        i.sync()
    assert not owner.store.is_full(version)
    assert owner.store.checkpoint(version)
    assert owner.store.is_full(version)
    assert OwnerTable(root).keys(version) == owner.store.keys(version)
    assert stale not in owner.store.keys(version)
    assert len(owner.store.keys(version)) == len(owner.keys())


@pytest.mark.parametrize("other_fs", [False, True])
def test_an_index_built_apart_is_moved_into_the_version(tmp_path, monkeypatch, other_fs):
    """`create_owner_dir(keys_folder=...)` (an import's index, built by another process): the
    folder becomes the version's index whole, renamed, or copied and synced where the work
    directory is on another file system; the folder it came from is gone either way."""
    import errno
    import os

    from morphogen.keyword import versions
    from morphogen.keyword.key_columns import KeyColumns
    from morphogen.keyword.key_index import KeyIndex

    rng = np.random.default_rng(3)
    tags = rng.integers(0, 256, (50, 16), dtype=np.uint8)
    keys = rng.integers(0, 256, (50, 20), dtype=np.uint8)
    built = tmp_path / "built"
    with KeyIndex.build(built, KeyColumns.of(tags, keys), 128) as index:
        index.sync(durable=True)
    want = {p.name: p.read_bytes() for p in built.iterdir()}
    if other_fs:
        real = os.replace

        def no_rename_across(src, dst):
            if Path(src) == built:
                raise OSError(errno.EXDEV, "Invalid cross-device link")
            return real(src, dst)

        monkeypatch.setattr(versions.os, "replace", no_rename_across)
    dst = tmp_path / "version" / "keys"
    dst.parent.mkdir()
    versions._move_index(built, dst)
    assert not built.exists()
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == want
    with KeyIndex(dst) as moved:
        assert moved[tags[7].tobytes()] == keys[7].tobytes()
