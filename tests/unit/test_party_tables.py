"""Named tables served by one party without Ray: a query of a table is the XOR over exactly the
table's pages, reaches only the shards overlapping it, scans only their overlap, follows page
updates, and coalesces only with queries of the same table."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from _party_world import NUM_PAGES, ReplicaSet, cfg_for, start_replica

from morphogen.party.epoch import ShardState
from morphogen.party.router import Party
from morphogen.party.tables import TableMoved, TableSlice
from morphogen.protocol import dpf
from morphogen.protocol.changes import ChangeBatch, PageUpdate
from morphogen.protocol.codec import ErrorCode, WireError
from morphogen.publication.log import EpochLog
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages
from morphogen.snapshot.tables import Table

# Two shards: [0, 48) and [48, 96).
TABLES = [
    {"name": "head", "first_page": 0, "num_pages": 10},    # at offset 0, inside shard 0
    {"name": "mid", "first_page": 40, "num_pages": 20},    # straddles both shards
    {"name": "inner", "first_page": 50, "num_pages": 7},   # inside shard 1
    {"name": "tail", "first_page": 80, "num_pages": 16},   # at the end
]
BY_NAME = {t["name"]: Table(**t) for t in TABLES}


class CountingLink:
    """A shard link that counts the scans it was asked for."""

    def __init__(self, inner: ReplicaSet) -> None:
        self.inner = inner
        self.scans: list[TableSlice | None] = []

    async def scan(self, batch, want, table=None):
        self.scans.append(table)
        return await self.inner.scan(batch, want, table)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def served(tmp_path: Path):
    snaps = tmp_path / "snaps"
    build_synthetic(snaps / "base", NUM_PAGES, seed=3, epoch_id=1, progress=False,
                    tables=TABLES)
    epoch_log = EpochLog(tmp_path / "log")
    links = [CountingLink(ReplicaSet([start_replica(snaps / "base", i, epoch_log)]))
             for i in range(2)]
    party = Party(cfg_for(snaps, tmp_path / "log"), links, epoch_log)
    return party, links, synthetic_pages(3, 0, NUM_PAGES)


def _expected(model: np.ndarray, key: dpf.DpfKey, table: Table) -> np.ndarray:
    """The XOR over exactly the table's pages, the key evaluated at table-relative pages."""
    rows = model[table.first_page:table.stop_page]
    masks = np.stack([np.frombuffer(key.eval(i), np.uint8) for i in range(table.num_pages)])
    return np.bitwise_xor.reduce(rows & np.tile(masks, (1, 256)), axis=0)


async def _read(party: Party, model: np.ndarray, name: str, targets: list[int]) -> list[bytes]:
    table = BY_NAME[name]
    padded = targets + [0] * (-len(targets) % 3)
    pairs = [dpf.generate_keys(table.domain_bits, t) for t in padded]
    keys = [a.to_bytes() for a, _ in pairs]
    answer = await party.query_batch([keys[i:i + 3] for i in range(0, len(keys), 3)],
                                     table=name)
    got = [p for r in answer["results"] for p in r["pages"]]
    out = []
    for (_, kb), pa in list(zip(pairs, got, strict=True))[:len(targets)]:
        out.append((np.frombuffer(pa, np.uint8) ^ _expected(model, kb, table)).tobytes())
    return out


@pytest.mark.parametrize(("name", "shards"), [
    ("head", [0]), ("mid", [0, 1]), ("inner", [1]), ("tail", [1]),
])
def test_a_table_query_reads_its_pages_from_the_shards_overlapping_it(served, name, shards):
    party, links, model = served
    table = BY_NAME[name]
    targets = [0, table.num_pages - 1, table.num_pages // 2]
    pages = asyncio.run(_read(party, model, name, targets))
    assert pages == [model[table.first_page + t].tobytes() for t in targets]
    called = [i for i, link in enumerate(links) if link.scans]
    assert called == shards  # shards outside the range do no work
    for i in shards:
        core = links[i].core
        assert links[i].scans == [TableSlice(table, core.first_page, core.stop_page)]


def test_each_shard_scans_only_its_overlap_and_the_answer_is_the_tables_xor(served):
    """The partials themselves: shard i's answer is the XOR over its pages of the table only,
    with the DPF at `page - table.first_page` (checked with the reference engine's oracle)."""
    _, links, model = served
    table = BY_NAME["mid"]
    key, _ = dpf.generate_keys(table.domain_bits, 11)
    batch = dpf.KeyBatch.from_keys([key])
    total = np.zeros(4096, np.uint8)
    for link, (lo, hi) in zip(links, [(40, 48), (48, 60)], strict=True):
        core = link.core
        _, acc = core.scan(batch, TableSlice(table, core.first_page, core.stop_page))
        masks = np.stack([np.frombuffer(key.eval(p - 40), np.uint8) for p in range(lo, hi)])
        want = np.bitwise_xor.reduce(model[lo:hi] & np.tile(masks, (1, 256)), axis=0)
        assert np.array_equal(acc[0], want)
        total ^= acc[0]
    assert np.array_equal(total, _expected(model, key, table))


def test_unknown_tables_and_wrong_domains_are_400(served):
    party, links, _ = served
    key, _ = dpf.generate_keys(BY_NAME["head"].domain_bits, 1)
    with pytest.raises(WireError) as err:
        asyncio.run(party.query([key.to_bytes()] * 3, table="nope"))
    assert err.value.status == 400 and err.value.code == ErrorCode.UNKNOWN_TABLE
    assert "'nope'" in err.value.message
    with pytest.raises(WireError) as err:  # keys of the head table's domain, sent to mid
        asyncio.run(party.query([key.to_bytes()] * 3, table="mid"))
    assert err.value.status == 400 and err.value.code == ErrorCode.BAD_DOMAIN
    whole, _ = dpf.generate_keys(7, 1)
    with pytest.raises(WireError) as err:
        asyncio.run(party.query([whole.to_bytes()] * 3, table="head"))
    assert err.value.code == ErrorCode.BAD_DOMAIN
    assert not any(link.scans for link in links)  # refused before any scan


def test_epoch_lists_the_tables(served):
    party, _, _ = served
    doc = asyncio.run(party.epoch())
    assert doc["tables"]["mid"] == {"first_page": 40, "num_pages": 20, "domain_bits": 5}
    assert sorted(doc["tables"]) == ["head", "inner", "mid", "tail"]
    assert doc["page_pir"]["num_pages"] == NUM_PAGES  # the default table: the whole matrix


def test_tables_follow_page_updates_and_keep_their_scanners_through_a_fold(served):
    party, links, model = served
    rng = np.random.default_rng(1)
    touched = [3, 45, 50, 95]  # head, mid (shard 0), mid and inner (shard 1), tail
    diffs = [rng.integers(0, 256, 4096, np.uint8) for _ in touched]
    batch = ChangeBatch.from_changes([PageUpdate(p, d.tobytes())
                                      for p, d in zip(touched, diffs, strict=True)])
    before = asyncio.run(_read(party, model, "mid", [5]))
    state = links[0].core.state
    subs = state.current.segments[0].subs
    scanner = subs._by_range[(40, 60)]
    asyncio.run(party.admin.updates(batch))
    new = model.copy()
    for p, d in zip(touched, diffs, strict=True):
        new[p] ^= d
    assert before == [model[45].tobytes()]
    assert asyncio.run(_read(party, new, "mid", [5, 10, 19])) == [
        new[45].tobytes(), new[50].tobytes(), new[59].tobytes()]
    assert asyncio.run(_read(party, new, "head", [3])) == [new[3].tobytes()]
    assert asyncio.run(_read(party, new, "inner", [0])) == [new[50].tobytes()]
    assert asyncio.run(_read(party, new, "tail", [15])) == [new[95].tobytes()]
    # updates keep the segments, so the table's scanner was built once
    assert state.current.segments[0].subs._by_range[(40, 60)] is scanner
    assert state.fold_pending() == 2  # pages 3 and 45
    # the fold wrote them into the pages the segment's scanners read: nothing is rebuilt
    assert len(state.current.pending) == 0 and not subs._closed
    assert state.current.segments[0].subs._by_range[(40, 60)] is scanner
    assert asyncio.run(_read(party, new, "mid", [5, 10])) == [new[45].tobytes(),
                                                               new[50].tobytes()]
    assert asyncio.run(_read(party, new, "head", [3])) == [new[3].tobytes()]


def test_a_shard_refuses_a_plan_its_epoch_does_not_match(served):
    _, links, _ = served
    core = links[1].core
    key, _ = dpf.generate_keys(5, 1)
    batch = dpf.KeyBatch.from_keys([key])
    with pytest.raises(TableMoved):  # the range the router believed is not this shard's
        core.scan(batch, TableSlice(BY_NAME["mid"], 40, 96))
    with pytest.raises(TableMoved):  # a table of another shape than the epoch's
        core.scan(batch, TableSlice(Table("mid", 40, 21), 48, 96))


def test_queries_of_different_tables_never_share_a_scan(served):
    party, links, model = served
    party.coalescer.window_s = 0.05  # coalescing on: concurrent queries would merge
    party.coalescer.eager = False

    async def both():
        return await asyncio.gather(_read(party, model, "mid", [1]), _read(party, model, "mid",
                                    [2]), _read(party, model, "tail", [3]), party.query_batch(
            [[dpf.generate_keys(7, 4)[0].to_bytes()] * 3]))

    mid1, mid2, tail, _ = asyncio.run(both())
    assert (mid1, mid2, tail) == ([model[41].tobytes()], [model[42].tobytes()],
                                  [model[83].tobytes()])
    for link in links:
        names = [None if s is None else s.table.name for s in link.scans]
        # one scan per table each shard holds part of (the two mid queries merged), one whole
        assert sorted(names, key=str) == sorted(
            ["mid", None] + (["tail"] if link is links[1] else []), key=str)


@pytest.mark.parametrize("kernel", ["sliced", "fused"])
def test_gpu_shards_scan_tables_on_the_device_copy(tmp_path, monkeypatch, kernel):
    """A GPU shard scans a table on its device copy (GpuShard.table_scanner), never through a
    host engine: building one fails the test."""
    from _gpu_fakes import FakeBackend, make_engine

    from morphogen.engine import cpu, gpu_tables, sliced

    def no_host_engine(*args, **kwargs):
        raise AssertionError("a GPU shard built a host engine for a table")

    monkeypatch.setattr(cpu.CpuEngine, "__init__", no_host_engine)
    build_synthetic(tmp_path / "s", 700, seed=2, epoch_id=1, progress=False,
                    tables=[{"name": "t", "first_page": 5, "num_pages": 9},
                            {"name": "u", "first_page": 300, "num_pages": 333}])
    snap = Snapshot.open(tmp_path / "s")
    backend = FakeBackend()
    state = ShardState(make_engine(backend, kernel=kernel), snap, 0, 700)
    model = synthetic_pages(2, 0, 700)
    try:
        for table, target in ((Table("t", 5, 9), 4), (Table("u", 300, 333), 300)):
            key, _ = dpf.generate_keys(table.domain_bits, target)
            _, acc = state.scan(dpf.KeyBatch.from_keys([key]), TableSlice(table, 0, 700))
            assert np.array_equal(acc[0], _expected(model, key, table))
            sub = state.current.segments[0].subs._by_range[(table.first_page, table.stop_page)]
            assert isinstance(sub, gpu_tables.GpuTableScanner)
            assert (sub.first_page, sub.num_pages) == (0, table.num_pages)
        if kernel == "sliced":
            assert backend.launches[-2].kernel in sliced.TABLE_KERNELS
    finally:
        state.close()


def test_a_rotation_brings_the_new_snapshots_tables(served, tmp_path):
    party, links, _ = served
    snaps = tmp_path / "snaps"
    build_synthetic(snaps / "next", 70, seed=4, epoch_id=1, progress=False,
                    tables=[{"name": "fresh", "first_page": 30, "num_pages": 40}])
    asyncio.run(party.admin.snapshot(str(snaps / "next")))
    doc = asyncio.run(party.epoch())
    assert doc["tables"] == {"fresh": {"first_page": 30, "num_pages": 40, "domain_bits": 6}}
    BY_NAME["fresh"] = Table("fresh", 30, 40)
    try:
        model = synthetic_pages(4, 0, 70)
        assert asyncio.run(_read(party, model, "fresh", [0, 39])) == [
            model[30].tobytes(), model[69].tobytes()]
    finally:
        del BY_NAME["fresh"]
    with pytest.raises(WireError) as err:
        asyncio.run(_read(party, model, "mid", [0]))
    assert err.value.code == ErrorCode.UNKNOWN_TABLE


def test_scan_metrics_count_the_pages_a_table_query_scanned(tmp_path):
    build_synthetic(tmp_path / "s", NUM_PAGES, seed=3, epoch_id=1, progress=False,
                    tables=TABLES)
    seen: list[int] = []

    class Recorder:
        def scan(self, shard, keys, pages, phases):
            seen.append(pages)

        def __getattr__(self, name):
            return lambda *args, **kwargs: None

    replica = start_replica(tmp_path / "s", 1, None, observer=Recorder())
    key, _ = dpf.generate_keys(5, 3)
    batch = dpf.KeyBatch.from_keys([key])
    asyncio.run(replica.scan(batch, None, TableSlice(BY_NAME["mid"], 48, 96)))
    asyncio.run(replica.scan(dpf.KeyBatch.from_keys([dpf.generate_keys(7, 3)[0]]), None))
    assert seen == [12, 48]  # pages [48, 60) of the table, then the shard's whole range


def test_a_table_from_page_0_over_a_whole_segment_uses_the_segments_own_scanner(tmp_path):
    """A keyword table's data starts at page 0: where a segment lies wholly inside such a
    table, its own scanner (the device's on a GPU shard) scans it; only a segment the table
    ends in gets a second scanner, over the table's part."""
    build_synthetic(tmp_path / "s", 64, seed=5, epoch_id=1, progress=False,
                    tables=[{"name": "data", "first_page": 0, "num_pages": 50}])
    from morphogen.engine.reference import ReferenceEngine

    model = synthetic_pages(5, 0, 64)
    table = Table("data", 0, 50)
    key, _ = dpf.generate_keys(table.domain_bits, 7)
    batch = dpf.KeyBatch.from_keys([key])
    inside = ShardState(ReferenceEngine(), Snapshot.open(tmp_path / "s"), 0, 32)
    _, acc = inside.scan(batch, TableSlice(table, 0, 32))
    assert np.array_equal(acc[0], np.bitwise_xor.reduce(
        model[:32] & np.tile(np.stack([np.frombuffer(key.eval(i), np.uint8)
                                       for i in range(32)]), (1, 256)), axis=0))
    assert not inside.current.segments[0].subs._by_range  # no second scanner
    ends = ShardState(ReferenceEngine(), Snapshot.open(tmp_path / "s"), 32, 64)
    _, acc2 = ends.scan(batch, TableSlice(table, 32, 64))
    assert np.array_equal(acc[0] ^ acc2[0], _expected(model, key, table))
    assert list(ends.current.segments[0].subs._by_range) == [(0, 50)]
    inside.close()
    ends.close()
