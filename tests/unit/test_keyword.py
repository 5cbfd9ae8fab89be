"""Keyword tables: candidates as the reference computes them, builds that place every record,
lookups that verify every page, and the owner's updates."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
from _kw import answers, lookup, proof_of
from _party_world import apply_batch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from morphogen.constants import PAGE_SIZE
from morphogen.keyword import (
    KeywordIntegrityError,
    RecordError,
    TableFullError,
    build_table,
    candidates,
    read_records,
    tree,
)
from morphogen.keyword.descriptor import Descriptor
from morphogen.keyword.editor import read_changes
from morphogen.keyword.hashing import candidates_many, pack_keys, seeded_hash
from morphogen.keyword.layout import EMPTY_TAG, Geometry
from morphogen.keyword.owner import Change, OwnerTable, create_owner_dir
from morphogen.keyword.pages import free_slot, slot_of, tag_of
from morphogen.keyword.tree import FANOUT, leaf_hash, node_hash
from morphogen.keyword.verify import ANSWER_FAILED, check, plan

VECTORS = Path(__file__).parents[1] / "vectors" / "cuckoo_vectors.json"
KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


def records(n: int, seed: int = 0, value_size: int = 32) -> dict[bytes, bytes]:
    rng = random.Random(seed)
    return {rng.randbytes(rng.choice([8, 20, 32])): rng.randbytes(value_size) for _ in range(n)}


# -- candidates --------------------------------------------------------------------------------

def test_candidates_match_the_reference_hasher() -> None:
    vectors = json.loads(VECTORS.read_text())
    assert f"{seeded_hash(b'account_42', 0x12345678):016x}" == "c4b4f98de2a4d4a6"
    for v in vectors:
        assert f"{seeded_hash(bytes.fromhex(v['key']), v['seed']):016x}" == v["hash"], v
    seeds = [vectors[0]["seed"], vectors[1]["seed"], vectors[2]["seed"]]
    keys = [bytes.fromhex(v["key"]) for v in vectors[::3]]
    flat, offsets = pack_keys(keys)
    for n in (1000, 1048576, 3000017):
        expected = [[vectors[3 * i + s]["mod"][str(n)] for s in range(3)]
                    for i in range(len(keys))]
        assert [list(candidates(k, seeds, n)) for k in keys] == expected
        assert candidates_many(flat, offsets, seeds, n).tolist() == expected


def test_candidates_refuse_bad_arguments() -> None:
    with pytest.raises(ValueError, match="3 seeds"):
        candidates(b"k", [1, 2], 10)
    with pytest.raises(ValueError, match="at least 1"):
        candidates(b"k", [1, 2, 3], 0)


# -- build and look up -------------------------------------------------------------------------

@pytest.mark.parametrize("layout,row_size", [("page", 0), ("row", 64), ("row", 256)])
def test_every_key_is_found_and_absent_keys_are_none(layout: str, row_size: int) -> None:
    recs = records(3000, seed=len(layout) + row_size)
    table = build_table(recs.items(), value_size=32, signing_key=KEY, layout=layout,
                        row_size=row_size)
    assert table.descriptor.records == 3000 and table.stats.load > 0.8
    keys = list(recs)
    assert lookup(table.pages, table.descriptor, keys) == [recs[k] for k in keys]
    absent = [os.urandom(20) for _ in range(50)]
    assert lookup(table.pages, table.descriptor, absent) == [None] * 50


def test_the_row_layout_keeps_the_reference_bucket_to_page_mapping() -> None:
    recs = records(500)
    table = build_table(recs.items(), value_size=32, signing_key=KEY, layout="row", row_size=128)
    g, d = table.descriptor.geometry, table.descriptor
    assert g.rows_per_page == 32
    for key in list(recs)[:50]:
        buckets = candidates(key, d.seeds, g.num_buckets)
        wanted, _ = plan(proof_of(table.pages, d), [key])
        assert wanted[0] == [b // 32 for b in buckets]
        # the record sits at the start of one of its candidate rows
        tag = tag_of(d.dataset, key)
        assert any(table.pages[b // 32, (b % 32) * 128:(b % 32) * 128 + 16].tobytes() == tag
                   for b in buckets)


def test_rows_not_dividing_a_page_or_too_small_for_a_slot_are_refused() -> None:
    for row_size, match in ((96, "must divide"), (32, "does not fit"), (0, "needs row_size")):
        with pytest.raises(ValueError, match=match):
            build_table([], value_size=48, signing_key=KEY, layout="row", row_size=row_size)


def _big(recs: dict[bytes, bytes]):
    # two buckets a page: thousands of records span more than 128 data pages, two tree levels
    return build_table(recs.items(), value_size=32, signing_key=KEY, layout="row", row_size=2048)


def test_a_tree_hashed_in_one_pass_is_the_tree_hashed_page_by_page() -> None:
    rng = np.random.default_rng(2)
    data = rng.integers(0, 256, (64 * FANOUT + 77, PAGE_SIZE), dtype=np.uint8)
    levels = tree.build(data)
    assert [len(x) for x in levels] == tree.level_sizes(len(data))
    below = [leaf_hash(p) for p in data]
    for level in levels:
        assert level.reshape(-1)[:32 * len(below)].tobytes() == b"".join(below)
        below = [node_hash(p) for p in level]
    # the paths of changed pages rewritten in place equal a tree built anew
    changed = sorted({int(i) for i in rng.integers(0, len(data), 3 * 4096)})
    data[changed, :8] ^= 0xA5
    written = tree.rehash(levels, data, changed)
    assert all(np.array_equal(a, b) for a, b in zip(levels, tree.build(data), strict=True))
    assert written[0] == {p // FANOUT for p in changed}
    # pages given as a strided view, or none
    assert tree._hashes(data[::3][:50], True).tobytes() == b"".join(
        leaf_hash(p) for p in data[::3][:50])
    assert tree._hashes(data[:0], False).shape == (0, tree.HASH_SIZE)


def test_the_tree_has_a_level_per_128_pages_and_proves_pages_read_privately() -> None:
    recs = records(3000, seed=9)
    table = _big(recs)
    g, d = table.descriptor.geometry, table.descriptor
    assert g.levels == [-(-g.data_pages // FANOUT), 1] and g.levels[0] > 8
    assert g.num_pages == g.data_pages + sum(g.levels) + 1
    assert [t["name"] for t in g.tables()] == ["data", "tree1", "tree2", "descriptor"]
    assert sum(t["num_pages"] for t in g.tables()) == g.num_pages
    top = table.pages[g.level_first(2)]
    assert node_hash(top).hex() == d.root
    first = table.pages[g.level_first(1)]
    assert first[:32].tobytes() == leaf_hash(table.pages[0])
    assert top[:32].tobytes() == node_hash(first)
    keys = list(recs)[:40] + [os.urandom(20) for _ in range(5)]
    for whole in (1, 8, 64):  # tree1 read a page a candidate, then whole
        proof = proof_of(table.pages, d, whole)
        assert proof.private == (1 if whole < g.levels[0] else 0)
        assert lookup(table.pages, d, keys, whole) == [recs.get(k) for k in keys]


@pytest.mark.parametrize("level", [0, 1])
@pytest.mark.parametrize("page_at", [0, 1, 2])
def test_a_tampered_page_fails_every_lookup_the_same_way(page_at: int, level: int) -> None:
    recs = records(3000)
    table = _big(recs)
    proof = proof_of(table.pages, table.descriptor, whole=1)
    present, absent = list(recs)[7], os.urandom(20)
    errors = []
    for key in (present, absent):
        wanted, buckets = plan(proof, [key])
        got = answers(table.pages, proof, wanted)
        flipped = bytearray(got[level][page_at])
        flipped[random.Random(page_at).randrange(4096)] ^= 0x10
        got[level][page_at] = bytes(flipped)
        with pytest.raises(KeywordIntegrityError) as exc:
            check(proof, [key], buckets, got)
        errors.append(str(exc.value))
    assert errors == [ANSWER_FAILED, ANSWER_FAILED]


def test_pages_of_another_table_index_level_or_version_are_refused() -> None:
    recs = records(3000)
    a, b = _big(recs), _big(recs)  # the same records, another dataset
    proof = proof_of(a.pages, a.descriptor, whole=1)
    key = list(recs)[3]
    wanted, buckets = plan(proof, [key])
    good = answers(a.pages, proof, wanted)
    assert check(proof, [key], buckets, good) == [recs[key]]
    g = a.descriptor.geometry

    def refused(got: list[list[bytes]]) -> None:
        with pytest.raises(KeywordIntegrityError, match="failed verification"):
            check(proof, [key], buckets, got)

    refused(answers(b.pages, proof, wanted))  # another table's pages and path
    other = (wanted[0][0] + 1) % g.data_pages
    refused([[a.pages[other].tobytes()] + good[0][1:], good[1]])  # a page moved
    refused([good[0], [a.pages[g.level_first(2)].tobytes()] + good[1][1:]])  # another level
    # a forged level page that hashes the forged data page: its own hash is not in the top
    forged = bytearray(good[0][0])
    forged[100] ^= 1
    level = bytearray(good[1][0])
    at = (wanted[0][0] % FANOUT) * 32
    level[at:at + 32] = leaf_hash(bytes(forged))
    refused([[bytes(forged)] + good[0][1:], [bytes(level)] + good[1][1:]])
    # a page of the next version (one record changed) under this version's proof
    owner_pages = a.pages.copy()
    page = wanted[0][0]
    owner_pages[page, :16] ^= 0xFF
    refused([[owner_pages[page].tobytes()] + good[0][1:], good[1]])
    # the levels read whole are proven too: a flipped top page fails before any lookup
    top = a.pages.copy()
    top[g.level_first(2), 5] ^= 1
    with pytest.raises(KeywordIntegrityError):
        proof_of(top, a.descriptor, whole=1)


def test_the_descriptor_is_checked_against_the_trusted_key() -> None:
    table = build_table(records(100).items(), value_size=32, signing_key=KEY)
    page = table.pages[-1].tobytes()
    assert Descriptor.from_page(page, KEY.public_key()) == table.descriptor
    with pytest.raises(KeywordIntegrityError, match="not signed by the trusted"):
        Descriptor.from_page(page, Ed25519PrivateKey.generate().public_key())
    with pytest.raises(KeywordIntegrityError):
        Descriptor.from_page(bytes(4096), KEY.public_key())


def test_a_table_too_small_is_refused_with_its_numbers() -> None:
    recs = records(1000)
    with pytest.raises(TableFullError, match=r"1000 records do not fit in 900 buckets \(900 "
                                             r"slots, 111.1% full\).*num_buckets=1177"):
        build_table(recs.items(), value_size=32, signing_key=KEY, layout="row", row_size=64,
                    num_buckets=900)
    # without a fixed size the same records are placed, every one
    table = build_table(recs.items(), value_size=32, signing_key=KEY, layout="row", row_size=64,
                        load=0.99)
    assert table.descriptor.records == 1000
    assert lookup(table.pages, table.descriptor, list(recs)) == list(recs.values())


def test_duplicates_and_wrong_sizes_are_refused_naming_the_record(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"key": "alice", "value": "0x' + "11" * 4 + '"}\n\n'
                    '{"key": "bob", "value": "0x' + "22" * 4 + '"}\n'
                    '{"key": "alice", "value": "0x' + "33" * 4 + '"}\n')
    with pytest.raises(RecordError, match=r"r.jsonl:4: the same key as r.jsonl:1"):
        build_table(read_records(path), value_size=4, signing_key=KEY)
    with pytest.raises(RecordError, match=r"r.jsonl:1: value is 4 bytes; this table's values "
                                          r"are 8 bytes"):
        build_table(read_records(path), value_size=8, signing_key=KEY)
    csv = tmp_path / "r.csv"
    csv.write_text("key,value\n0xab,0x0102\nbad\n")
    with pytest.raises(RecordError, match="r.csv:3: expected two columns"):
        list(read_records(csv))
    with pytest.raises(RecordError, match="cannot tell the format"):
        read_records(tmp_path / "r.txt")


@pytest.mark.parametrize("layout,row_size", [("page", 0), ("row", 256)])
def test_a_slot_is_found_only_where_its_tag_starts_a_slot(layout: str, row_size: int) -> None:
    g = Geometry(layout, 32, 64, row_size)
    size = g.slot_size
    tag = bytes(range(1, 17))
    page = np.zeros(PAGE_SIZE, np.uint8)
    bucket = 5 if layout == "row" else 0  # a row bucket: row 5 of its page
    first = g.slot_offset(bucket, 0)
    n = g.bucket_capacity(bucket)
    page[first:first + n * size] = 0xEE  # every slot taken
    assert slot_of(g, page, bucket, tag) is None and free_slot(g, page, bucket) is None
    # the tag's bytes straddling a slot's end, and an empty tag's zeros inside a value
    if n > 1:
        page[first + size - 8:first + size + 8] = np.frombuffer(tag, np.uint8)
    page[first + 20:first + 40] = 0
    assert slot_of(g, page, bucket, tag) is None and free_slot(g, page, bucket) is None
    last = n - 1
    page[first + last * size:first + last * size + 16] = np.frombuffer(tag, np.uint8)
    assert slot_of(g, page, bucket, tag) == last
    page[first + last * size:first + last * size + 16] = np.frombuffer(EMPTY_TAG, np.uint8)
    assert free_slot(g, page, bucket) == last and slot_of(g, page, bucket, tag) is None
    # outside the bucket (the row after it) is not the bucket's
    if layout == "row":
        page[first + row_size:first + row_size + 16] = np.frombuffer(tag, np.uint8)
        page[first:first + 16] = 0xEE
        assert slot_of(g, page, bucket, tag) is None and free_slot(g, page, bucket) is None


def test_records_files_in_both_formats_build_the_same_lookups(tmp_path: Path) -> None:
    recs = records(300, value_size=8)
    (tmp_path / "r.jsonl").write_text("".join(
        json.dumps({"key": "0x" + k.hex(), "value": "0x" + v.hex()}) + "\n"
        for k, v in recs.items()))
    (tmp_path / "r.csv").write_text("key,value\n" + "".join(
        f"0x{k.hex()},0x{v.hex()}\n" for k, v in recs.items()))
    for name in ("r.jsonl", "r.csv"):
        table = build_table(read_records(tmp_path / name), value_size=8, signing_key=KEY)
        assert lookup(table.pages, table.descriptor, list(recs)) == list(recs.values())


# -- the owner's updates -----------------------------------------------------------------------

def _served(owner: OwnerTable) -> np.ndarray:
    return owner.pages()


@pytest.mark.parametrize("layout", ["page", "row"])
def test_inserts_changes_and_deletes_make_a_new_version(tmp_path: Path, layout: str) -> None:
    recs = records(2000, seed=5)
    # 0.8: room for 110 more records in one-row buckets (they fill to about 91 %)
    table = build_table(recs.items(), value_size=32, signing_key=KEY, layout=layout,
                        row_size=64, load=0.8)
    first = create_owner_dir(table, tmp_path / "owner")
    v1 = (first / "pages.bin").read_bytes()
    owner = OwnerTable(tmp_path / "owner")
    rng = random.Random(9)
    new = {rng.randbytes(20): rng.randbytes(32) for _ in range(120)}
    changed = {k: rng.randbytes(32) for k in list(recs)[:10]}
    deleted = list(recs)[10:20]
    version, batch = owner.apply(
        [Change("put", k, v) for k, v in {**new, **changed}.items()]
        + [Change("delete", k) for k in deleted], KEY, rng=rng.randrange)
    assert version == 2 and owner.current == 2
    assert (first / "pages.bin").read_bytes() == v1  # version 1 untouched
    recs.update(new)
    recs.update(changed)
    for k in deleted:
        del recs[k]
    pages = _served(owner)
    desc = Descriptor.from_page(pages[-1].tobytes(), KEY.public_key())
    assert desc.version == 2 and desc.records == len(recs)
    assert lookup(pages, desc, list(recs)) == list(recs.values())
    assert lookup(pages, desc, deleted) == [None] * 10
    # the batch turns version 1 into version 2 exactly, descriptor page included
    before = table.pages.copy()
    assert not batch.replace.any()  # each page XOR the page before
    before = apply_batch(before, batch)
    assert np.array_equal(before, pages)
    assert batch.pages[-1] == desc.geometry.descriptor_page
    assert [v for v, _, _ in owner.unpublished()] == [2]


def test_an_insert_evicts_along_a_chain_within_one_batch(tmp_path: Path) -> None:
    # a nearly full one-row table: new keys mostly find their candidates taken
    recs = records(800, seed=3)
    table = build_table(recs.items(), value_size=32, signing_key=KEY, layout="row",
                        row_size=64, load=0.88)
    create_owner_dir(table, tmp_path / "owner")
    owner = OwnerTable(tmp_path / "owner")
    rng = random.Random(4)
    moved = 0
    for _ in range(4):
        key, value = rng.randbytes(20), rng.randbytes(32)
        _, batch = owner.apply([Change("put", key, value)], KEY, rng=rng.randrange)
        moved = max(moved, len(batch) - 2)  # beyond the new record's page and the descriptor
        recs[key] = value
    assert moved > 0
    pages = _served(owner)
    desc = Descriptor.from_page(pages[-1].tobytes(), KEY.public_key())
    assert lookup(pages, desc, list(recs)) == list(recs.values())


def test_a_full_table_refuses_the_insert_and_changes_nothing(tmp_path: Path) -> None:
    recs = records(600, seed=8)
    table = build_table(recs.items(), value_size=32, signing_key=KEY, layout="row",
                        row_size=64, load=0.9)
    create_owner_dir(table, tmp_path / "owner")
    owner = OwnerTable(tmp_path / "owner")
    rng = random.Random(1)
    with pytest.raises(TableFullError, match=r"the table is full.*Nothing was changed.*"
                                             r"--buckets \d+"):
        owner.apply([Change("put", rng.randbytes(20), rng.randbytes(32)) for _ in range(400)],
                    KEY, rng=rng.randrange)
    assert owner.current == 1 and OwnerTable(tmp_path / "owner").current == 1
    assert not [p for p in (tmp_path / "owner").iterdir() if p.name.startswith("v0000002")]


@pytest.mark.parametrize("mapped", [False, True])
def test_a_key_whose_tag_collides_with_a_held_one_is_refused_and_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mapped: bool) -> None:
    """Two keys with one 128-bit tag (a collision stood in for by the tag function): the
    builder refuses them, and so does an owner's change; taken, a lookup of either would be
    answered with the other's value, proven, after a delete or an update."""
    from morphogen.keyword import editor

    recs = records(300, seed=9)
    held, other = sorted(recs)[0], b"\x01" * 20
    real = editor.tag_of
    monkeypatch.setattr(editor, "tag_of", lambda ds, key: real(ds, held if key == other
                                                               else key))
    create_owner_dir(build_table(recs.items(), value_size=32, signing_key=KEY), tmp_path / "o")
    owner = OwnerTable(tmp_path / "o")
    if mapped:
        owner.map_working_pages()
    before = owner.pages().copy()
    for change in (Change("put", other, bytes(32)), Change("delete", other)):
        with pytest.raises(RecordError, match=(
                f"collides with that of key 0x{held.hex()}, which the table holds")):
            owner.apply([Change("put", sorted(recs)[1], bytes(32)), change], KEY)
        assert owner.current == 1 and np.array_equal(owner.pages(), before)
    version, _ = owner.apply([Change("delete_absent", other)], KEY)  # not held: nothing
    assert version == 1
    reread = OwnerTable(tmp_path / "o")
    assert reread.current == 1 and np.array_equal(reread.pages(), before)
    assert lookup(reread.pages(), reread.descriptor(), [held]) == [recs[held]]


def test_bad_changes_are_refused_naming_the_line(tmp_path: Path) -> None:
    recs = records(50)
    create_owner_dir(build_table(recs.items(), value_size=32, signing_key=KEY), tmp_path / "o")
    owner = OwnerTable(tmp_path / "o")
    f = tmp_path / "c.jsonl"
    f.write_text('{"op": "delete", "key": "nobody"}\n')
    with pytest.raises(RecordError, match=r"c.jsonl:1: delete of a key the table does not hold"):
        owner.apply(read_changes(f), KEY)
    f.write_text('{"op": "put", "key": "x", "value": "0x00"}\n')
    with pytest.raises(RecordError, match=r"c.jsonl:1: value is 1 bytes"):
        owner.apply(read_changes(f), KEY)
    f.write_text('{"op": "upsert", "key": "x"}\n')
    with pytest.raises(RecordError, match="c.jsonl:1: expected"):
        read_changes(f)
    with pytest.raises(ValueError, match="not the table's owner key"):
        owner.apply([Change("delete", list(recs)[0])], Ed25519PrivateKey.generate())
    assert owner.current == 1


@pytest.mark.parametrize("name", ["accounts.jsonl", "accounts.csv"])
def test_records_sample_writes_accounts_that_build_reads(tmp_path, capsys, name) -> None:
    from cluster.cli import main
    from morphogen.keyword import read_records
    from morphogen.keyword.accounts import synthetic_accounts

    out = tmp_path / name
    assert main(["records", "sample", "--accounts", "300", "--seed", "5", "--out", str(out)]) == 0
    first = synthetic_accounts(300, seed=5)[0][0]
    assert f"300 synthetic accounts in {out}" in capsys.readouterr().out
    assert [(r.key, r.value) for r in read_records(out)] == synthetic_accounts(300, seed=5)
    before = out.read_bytes()
    assert main(["records", "sample", "--accounts", "5", "--out", str(out)]) == 2
    assert "exists (--force replaces it)" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert main(["records", "keygen", "--out", str(tmp_path / "o.key")]) == 0
    assert main(["build", "--records", str(out), "--value-size", "32", "--signing-key",
                 str(tmp_path / "o.key"), "--out", str(tmp_path / "kw")]) == 0
    assert f"0x{first.hex()}" in out.read_text()


def test_a_signing_key_is_never_overwritten_and_a_crash_never_loses_its_public_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cluster.cli import main
    from morphogen.keyword import signing

    path = tmp_path / "o.key"
    real = signing._write_public

    def dies(*args) -> None:
        raise SystemExit("killed between the key and its .pub")

    monkeypatch.setattr(signing, "_write_public", dies)
    with pytest.raises(SystemExit):
        signing.generate_key_files(path)
    key = signing.load_signing_key(path)  # whole, though the .pub never came
    assert (path.stat().st_mode & 0o777) == 0o600 and not path.with_suffix(".pub").exists()
    monkeypatch.setattr(signing, "_write_public", real)
    with pytest.raises(FileExistsError):
        signing.generate_key_files(path)  # refuses, and writes the .pub of the key there
    assert signing.load_public_key(path.with_suffix(".pub")).public_bytes_raw() == \
        key.public_key().public_bytes_raw()
    assert path.read_text() == key.private_bytes_raw().hex() + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.key", "o.pub"]
    assert main(["records", "keygen", "--out", str(path)]) == 2
