"""A block's pages made writable before its apply (`morphogen.keyword.prefetch`): the pages
planned are the pages the apply writes, faulting them in changes no byte, and an owner that
prefetched ends each block with the same pages and batch as one that did not."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from morphogen.constants import PAGE_SIZE
from morphogen.keyword import build_table, prefetch
from morphogen.keyword.build import join_tables
from morphogen.keyword.descriptor import Anchor, parts_of
from morphogen.keyword.owner import Change, OwnerTable, create_owner_dir
from morphogen.keyword.pages import tag_of
from morphogen.storage import advice

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
ANCHOR = Anchor(31337, 7, "0x" + "ab" * 32)


def _recs(n: int, key_size: int, value_size: int, seed: int) -> dict[bytes, bytes]:
    rng = random.Random(seed)
    return {rng.randbytes(key_size): rng.randbytes(value_size) for _ in range(n)}


RECS = {"accounts": _recs(400, 20, 72, 1), "storage": _recs(3000, 52, 32, 2)}


def _table(layout: str = "page"):
    # in the row layout a bucket is one row of a page: 88- and 48-byte slots in 128 and 64;
    # half full, so that no bucket of the page layout's is full (no insert evicts another)
    return join_tables([build_table(RECS[name].items(), value_size=size, signing_key=KEY,
                                    name=name, anchor=ANCHOR, layout=layout,
                                    row_size=row if layout == "row" else 0, load=0.5)
                        for name, size, row in (("accounts", 72, 128), ("storage", 32, 64))])


def _owner(root: Path, table=None) -> OwnerTable:
    create_owner_dir(table or _table(), root)
    owner = OwnerTable(root)
    owner.map_working_pages()
    return owner


def _block(seed: int, *, inserts: bool) -> list[Change]:
    rng = random.Random(seed)
    out = [Change("put", k, rng.randbytes(72), table="accounts")
           for k in rng.sample(sorted(RECS["accounts"]), 30)]
    out += [Change("put", k, rng.randbytes(32), table="storage")
            for k in rng.sample(sorted(RECS["storage"]), 200)]
    if inserts:
        out += [Change("put", rng.randbytes(52), rng.randbytes(32), table="storage")
                for _ in range(40)]
    return out


def _by_table(changes: list[Change]) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for c in changes:
        out.setdefault(c.table, []).append(c.key)
    return out


def _apply(owner: OwnerTable, changes: list[Change], seed: int):
    rng = random.Random(seed)
    return owner.apply(changes, KEY, rng=rng.randrange, anchor=ANCHOR)


@pytest.mark.parametrize("layout,inserts", [("page", False), ("page", True), ("row", False)])
def test_the_pages_planned_are_the_pages_the_block_writes(tmp_path: Path, layout: str,
                                                          inserts: bool) -> None:
    """A held key's page, and in a page-layout table half full (85 slots a bucket, none
    full) a new key's first candidate with a free slot: exactly the pages the block writes.
    (In the row layout a new key may evict another, a chain no plan can know: only updates
    are compared there.)"""
    owner = _owner(tmp_path / "owner", _table(layout))
    for seed in (1, 2):
        changes = _block(seed, inserts=inserts)
        pages = owner._working()[0]
        located = prefetch.locate(parts_of(pages), _by_table(changes))
        planned = prefetch.plan(pages, located)
        _, batch = _apply(owner, changes, seed)
        written = np.unique(batch.pages)
        assert np.array_equal(planned, written), (len(planned), len(written))
        # and the tags the block's lookups ask the key index, in the tables' order
        asked = [tag_of(p.descriptor.dataset, c.key) for p in parts_of(pages)
                 for c in changes if c.table == p.name]
        assert prefetch.tags(located).tobytes() == b"".join(asked)
    # a table no key of the block is in is passed over: its pages are not planned
    pages = owner._working()[0]
    only = prefetch.locate(parts_of(pages), {"storage": [next(iter(RECS["storage"]))]})
    accounts = parts_of(pages)[0]
    assert [x.part.name for x in only] == ["storage"] and len(prefetch.tags(only)) == 1
    planned = prefetch.plan(pages, only)
    assert len(planned) and (planned >= accounts.first + accounts.span).all()


def test_faulting_the_pages_in_changes_no_byte(tmp_path: Path) -> None:
    owner = _owner(tmp_path / "owner")
    pages, _ = owner._working()
    file = tmp_path / "owner" / "working" / "pages.bin"
    before = file.read_bytes()
    which = np.array([0, 1, 2, 7, len(pages) - 1], np.int64)
    assert prefetch.populate(pages, which) in (True, False)  # False: a kernel without it
    assert np.frombuffer(before, np.uint8).reshape(pages.shape).tobytes() == pages.tobytes()
    assert file.read_bytes() == before
    # a whole block's prefetch, the key index's slots read and every page read ahead
    pages, index = owner._working()
    keys = sorted((tmp_path / "owner" / "working" / "keys").iterdir())
    index_before = [k.read_bytes() for k in keys]
    changes = _block(5, inserts=True)
    writes = prefetch.block(pages, parts_of(pages), _by_table(changes), index)
    assert writes == len(prefetch.plan(pages, prefetch.locate(parts_of(pages),
                                                              _by_table(changes))))
    assert file.read_bytes() == before
    assert [k.read_bytes() for k in keys] == index_before


def test_an_owner_that_prefetched_makes_the_same_versions(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.0)  # the descriptors' times alike
    table = _table()
    plain, fetching = _owner(tmp_path / "a", table), _owner(tmp_path / "b", table)
    for seed in range(3):
        changes = _block(seed + 10, inserts=True)
        fetching.prefetch(_by_table(changes))
        (va, a), (vb, b) = _apply(plain, changes, seed), _apply(fetching, changes, seed)
        assert va == vb and np.array_equal(a.pages, b.pages) and a.packed == b.packed
    # a prefetch left running is waited for by what drops the pages, then nothing is left
    fetching.prefetch(_by_table(_block(99, inserts=False)))
    fetching.map_working_pages()
    assert fetching._prefetcher is None
    assert np.array_equal(plain.pages(), fetching.pages())


def test_the_prefetch_makes_room_for_the_pages_the_apply_keeps(tmp_path: Path) -> None:
    """The rows an apply copies its pages' old bytes into are made (and written) by the
    prefetch, off the apply's path: the first block's apply grows no buffer."""
    owner = _owner(tmp_path / "owner")
    changes = _block(3, inserts=True)
    assert len(owner._befores.rows) == 0
    owner.prefetch(_by_table(changes))
    owner._prefetcher[0].join()
    rows = owner._befores.rows
    pages = owner._working()[0]
    planned = len(prefetch.plan(pages, prefetch.locate(parts_of(pages), _by_table(changes))))
    assert len(rows) >= planned and not rows.any()
    _, batch = _apply(owner, changes, 3)
    assert owner._befores.rows is rows and owner._befores.count == len(batch)
    # a prefetch stopped before its plan knows no count: the owner then reserves nothing
    stop = threading.Event()
    stop.set()
    assert prefetch.block(pages, parts_of(pages), _by_table(changes), None, stop) == 0


def test_reserved_rows_keep_what_they_hold() -> None:
    from morphogen.keyword.editor import Befores

    befores = Befores(8)
    first = befores.keep(np.arange(24, dtype=np.uint8).reshape(3, 8))
    held = befores.rows
    befores.reserve(2)  # fewer than it has: nothing moves
    assert first == 0 and befores.rows is held and len(held) == 1024
    befores.reserve(5000)
    assert len(befores.rows) == 5000 and befores.count == 3
    assert befores.rows[:3].tobytes() == bytes(range(24)) and not befores.rows[3:].any()
    grown = befores.rows
    befores.keep(np.ones((4000, 8), np.uint8))
    assert befores.rows is grown and befores.count == 4003


def test_a_prefetch_stops_where_it_is_when_the_apply_comes(monkeypatch) -> None:
    """An apply that starts first stops the faulting between calls: a node that answers fast
    never waits on it. Consecutive pages go in one run, a few runs a call."""
    stop, calls = threading.Event(), []

    def kernel(base, first, lengths, page, advice_):
        calls.append((int(base), first.tolist(), lengths.tolist(), advice_))
        stop.set()  # the apply comes during the first call
        return -1

    monkeypatch.setattr(advice, "_LINKED", [True])  # the real kernel is never called
    monkeypatch.setattr(advice, "_advise", kernel)
    pages = np.zeros((100, PAGE_SIZE), np.uint8)
    which = np.array([1, 2, 5, 8] + list(range(20, 60, 2)))
    assert prefetch.populate(pages, which, stop)
    assert calls == [(pages.ctypes.data, [1, 5, 8] + list(range(20, 46, 2)), [2] + [1] * 15,
                      advice.POPULATE_WRITE)]
    calls.clear()
    stop.clear()
    monkeypatch.setattr(advice, "_advise", lambda *a: calls.append(a) or -1)
    assert prefetch.populate(pages, which)
    assert [len(c[1]) for c in calls] == [16, 7]


def test_the_index_is_read_ahead_in_chunks_until_the_apply_comes(tmp_path: Path) -> None:
    """The key index's slots are read a chunk of tags a call, and an apply that comes stops
    it between two calls."""
    owner = _owner(tmp_path / "owner")
    pages, index = owner._working()
    tags = prefetch.tags(prefetch.locate(parts_of(pages), _by_table(_block(3, inserts=True))))
    stop, seen = threading.Event(), []

    class Counting:
        def touch(self, chunk: np.ndarray) -> int:
            seen.append(len(chunk))
            if len(seen) == 2:
                stop.set()  # the apply comes during the second call
            return index.touch(chunk)

    prefetch.touch_index(Counting(), tags, stop, chunk=64)
    assert seen == [64, 64]
    seen.clear()
    prefetch.touch_index(Counting(), tags, None, chunk=64)
    assert sum(seen) == len(tags) == 270
    assert index.touch(tags) == 230  # the block's 40 new keys are not held yet
