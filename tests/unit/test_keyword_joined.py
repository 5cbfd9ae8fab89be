"""Several keyword tables in one matrix: built, changed and published together, each read by
name through its own party tables, every one at the same version and block."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from _kw import TablePir
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from morphogen.keyword import build_table
from morphogen.keyword.build import join_tables
from morphogen.keyword.client import KeywordClient
from morphogen.keyword.descriptor import Anchor, KeywordIntegrityError, parts_of, tables_of
from morphogen.keyword.owner import Change, OwnerTable, create_owner_dir
from morphogen.keyword.placement import UnknownKeywordTable
from morphogen.keyword.records import RecordError

KEY = Ed25519PrivateKey.generate()
ANCHOR = Anchor(31337, 7, "0x" + "ab" * 32)


def _recs(n: int, key_size: int, value_size: int, seed: int) -> dict[bytes, bytes]:
    rng = random.Random(seed)
    return {rng.randbytes(key_size): rng.randbytes(value_size) for _ in range(n)}


def _joined(tmp_path: Path):
    small = _recs(300, 20, 72, 1)
    words = _recs(2000, 52, 32, 2)
    big = _recs(40, 36, 1024, 3)
    tables = [build_table(small.items(), value_size=72, signing_key=KEY, name="accounts",
                          anchor=ANCHOR),
              build_table(words.items(), value_size=32, signing_key=KEY, name="storage",
                          anchor=ANCHOR),
              build_table(big.items(), value_size=1024, signing_key=KEY, name="code",
                          anchor=ANCHOR)]
    create_owner_dir(join_tables(tables), tmp_path / "owner")
    return OwnerTable(tmp_path / "owner"), {"accounts": small, "storage": words, "code": big}


def _client(pages: np.ndarray, table: str) -> KeywordClient:
    return KeywordClient(TablePir(pages), KEY.public_key(), table=table)


def test_each_table_reads_by_name_from_its_own_party_tables(tmp_path: Path) -> None:
    owner, recs = _joined(tmp_path)
    pages = owner.pages()
    parts = parts_of(pages)
    assert [p.name for p in parts] == ["accounts", "storage", "code"]
    assert parts[0].first == 0 and parts[-1].first + parts[-1].span == len(pages)
    names = [t["name"] for t in tables_of(pages)]
    assert "accounts.data" in names and "storage.tree1" in names and "code.descriptor" in names
    for name, want in recs.items():
        pir = TablePir(pages)
        client = KeywordClient(pir, KEY.public_key(), table=name)
        keys = list(want)[:20] + [b"absent" * 6]
        assert client.get_many(keys) == [want[k] for k in keys[:-1]] + [None]
        # every read went to this table's own parts, none to the whole matrix
        assert {t for t, _, _ in pir.requests} <= {f"{name}.{p}" for p in
                                                    ("data", "descriptor", "tree1", "tree2")}
        assert client.descriptor().anchor == ANCHOR
    with pytest.raises(UnknownKeywordTable):
        _client(pages, "receipts").get(b"x")


def test_one_apply_moves_every_table_to_the_same_version_and_block(tmp_path: Path) -> None:
    owner, recs = _joined(tmp_path)
    acct, word = next(iter(recs["accounts"])), next(iter(recs["storage"]))
    block = Anchor(31337, 8, "0x" + "cd" * 32)
    version, batch = owner.apply(
        [Change("put", acct, b"\1" * 72, table="accounts"),
         Change("delete", word, table="storage"),
         Change("delete_absent", b"never there" + bytes(41), table="storage")],
        KEY, anchor=block, note={"chain": {"head": 8}})
    assert version == 2 and owner.state["chain"] == {"head": 8}
    pages = owner.pages()
    descs = [p.descriptor for p in parts_of(pages)]
    assert {d.version for d in descs} == {2} and {d.anchor for d in descs} == {block}
    # code changed nothing, yet its descriptor moved with the others (in the same batch)
    code = parts_of(pages)[2]
    assert code.first + code.span - 1 in batch.pages.tolist()
    assert _client(pages, "accounts").get(acct) == b"\1" * 72
    assert _client(pages, "storage").get(word) is None
    assert owner.descriptor("storage").records == len(recs["storage"]) - 1
    assert dict(owner.records("code")) == recs["code"]
    with pytest.raises(RecordError, match="no keyword table"):
        owner.apply([Change("put", acct, b"\2" * 72, table="balances")], KEY)
    with pytest.raises(RecordError, match="no keyword table"):
        owner.apply([Change("put", acct, b"\2" * 72)], KEY)  # "" is ambiguous among three
    assert owner.current == 2


def test_a_descriptor_of_another_table_is_refused(tmp_path: Path) -> None:
    owner, recs = _joined(tmp_path)
    pages = owner.pages().copy()
    parts = parts_of(pages)

    class Swapped(TablePir):
        def tables(self):  # says the accounts table is where storage is
            out = super().tables()
            for part in ("data", "descriptor", "tree1"):
                if f"storage.{part}" in out:
                    out[f"accounts.{part}"] = out[f"storage.{part}"]
            out.pop("accounts.tree2", None)
            return out

    client = KeywordClient(Swapped(pages), KEY.public_key(), table="accounts")
    with pytest.raises(KeywordIntegrityError, match="descriptor of keyword table 'storage'"):
        client.get(next(iter(recs["accounts"])))
    assert parts[1].name == "storage"


def test_joining_needs_names_and_one_owner(tmp_path: Path) -> None:
    a = build_table(_recs(10, 20, 8, 4).items(), value_size=8, signing_key=KEY)
    b = build_table(_recs(10, 20, 8, 5).items(), value_size=8, signing_key=KEY, name="b")
    with pytest.raises(ValueError, match="name of their own"):
        join_tables([a, b])
    other = build_table(_recs(10, 20, 8, 6).items(), value_size=8,
                        signing_key=Ed25519PrivateKey.generate(), name="c")
    with pytest.raises(ValueError, match="one owner key"):
        join_tables([b, other])


def test_a_table_grown_is_a_version_of_its_own_published_as_a_rotation(tmp_path: Path) -> None:
    from test_keyword_versions import FakeParties

    from morphogen.keyword.publishing import PublishError, publish

    owner, recs = _joined(tmp_path)
    parties = FakeParties(owner.pages(), cap=10_000)
    before = len(owner.pages())
    storage = owner.descriptor("storage")
    version = owner.grow("storage", KEY, records=3 * storage.geometry.capacity)
    assert version == 2 and len(owner.pages()) > before
    grown = owner.descriptor("storage")
    assert grown.geometry.capacity >= 3 * storage.geometry.capacity
    assert (grown.dataset, grown.records, grown.anchor) == (storage.dataset, storage.records,
                                                            ANCHOR)
    assert {p.descriptor.version for p in owner.parts()} == {2}
    assert dict(owner.records("storage")) == recs["storage"]
    pages = owner.pages()
    for name, want in recs.items():
        keys = list(want)[:30]
        assert _client(pages, name).get_many(keys) == [want[k] for k in keys]
    # small enough for one batch, but its page count changed: only a rotation carries it
    with pytest.raises(PublishError, match="another page count"):
        publish(owner, parties)
    done = publish(owner, parties, snapshot_dir=str(tmp_path / "snaps"))
    assert [p.mode for p in done] == ["rotation"]
    assert np.array_equal(parties.b.pages, pages)
    # later versions go as batches again, into the grown table
    word = next(iter(recs["storage"]))
    owner.apply([Change("put", word, b"\7" * 32, table="storage")], KEY)
    assert [p.mode for p in publish(owner, parties)] == ["updates"]
    assert _client(parties.a.pages, "storage").get(word) == b"\7" * 32


def test_tables_built_in_place_join_without_a_copy_and_equal_tables_built_apart() -> None:
    """`place_table(out=...)` into one matrix's parts: the join is that matrix itself (no
    copy of every page), and its bytes and keys are those of the same tables built apart and
    joined by copying."""
    from morphogen.keyword.build import Draws, place_table
    from morphogen.keyword.hashing import candidates_many, pack_keys
    from morphogen.keyword.layout import Geometry
    from morphogen.keyword.pages import tags_of

    specs = [("accounts", 20, 72, 300), ("storage", 52, 32, 2000), ("code", 36, 1024, 40)]
    buckets = {"accounts": 9, "storage": 40, "code": 48}

    def build(name, key_size, value_size, n, out=None):
        recs = _recs(n, key_size, value_size, key_size)
        keys = np.frombuffer(b"".join(recs), np.uint8).reshape(n, key_size)
        values = np.frombuffer(b"".join(recs.values()), np.uint8).reshape(n, value_size)
        draws = Draws(f"7/{name}")
        dataset = draws.token(16)
        flat, offsets = pack_keys(list(recs))
        return place_table(keys, tags_of(dataset, list(recs)), values,
                           lambda s, b: candidates_many(flat, offsets, s, b), dataset=dataset,
                           value_size=value_size, signing_key=KEY, draws=draws,
                           numbering=(1, ANCHOR, name), created=5,
                           num_buckets=buckets[name], out=out), recs

    apart = [build(*spec) for spec in specs]
    copied = join_tables([t for t, _ in apart])
    spans = [Geometry("page", v, buckets[name]).num_pages for name, _, v, _ in specs]
    matrix = np.zeros((sum(spans), 4096), np.uint8)
    ends = np.cumsum([0, *spans])
    placed = [build(*spec, out=matrix[ends[i]:ends[i + 1]])[0] for i, spec in enumerate(specs)]
    joined = join_tables(placed)
    assert joined.pages is matrix
    assert (joined.pages == copied.pages).all()
    assert dict(joined.keys) == dict(copied.keys)
    assert set(joined.keys.values()) == {k for _, recs in apart for k in recs}
    with pytest.raises(ValueError, match="takes"):
        build(*specs[0], out=matrix[:1])
