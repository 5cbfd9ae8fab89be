"""Packed keys through one party without Ray: /epoch advertises the formats every shard scans,
the same routes take either format, answers equal the v1 ones' pages under pending updates,
folds and tables, a request never mixes formats and the coalescer never merges them, and a
party whose shards lack the format refuses it with a 400."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from _party_world import NUM_PAGES, ReplicaSet, cfg_for, start_replica

from morphogen import engine
from morphogen.engine.base import KeyFormatUnsupported
from morphogen.party import shard as shard_module
from morphogen.party import wire
from morphogen.party.epoch import ShardState
from morphogen.party.replica import ShardReplica
from morphogen.party.router import Party
from morphogen.party.shard import ShardCore
from morphogen.protocol import dpf
from morphogen.protocol.changes import ChangeBatch, PageUpdate
from morphogen.protocol.codec import ErrorCode, WireError
from morphogen.protocol.packed import PackedKeyBatch, generate_packed_keys, selection_range
from morphogen.publication.log import EpochLog
from morphogen.snapshot.layout import domain_bits_for
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages
from morphogen.snapshot.tables import Table

TABLES = [{"name": "mid", "first_page": 40, "num_pages": 20}]  # straddles both shards


class Link:
    """A shard link recording the format of every scan; `formats` overrides what the shard
    says it scans (None: as it says)."""

    def __init__(self, inner: ReplicaSet) -> None:
        self.inner = inner
        self.scans: list[tuple[str, int]] = []
        self.formats: list[str] | None = None

    async def scan(self, batch, want, table=None):
        self.scans.append((type(batch).__name__, len(batch)))
        return await self.inner.scan(batch, want, table)

    async def info(self):
        out = await self.inner.info()
        if self.formats is not None:
            out["key_formats"] = self.formats
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def served(tmp_path: Path):
    snaps = tmp_path / "snaps"
    build_synthetic(snaps / "base", NUM_PAGES, seed=3, epoch_id=1, progress=False,
                    tables=TABLES)
    epoch_log = EpochLog(tmp_path / "log")
    links = [Link(ReplicaSet([start_replica(snaps / "base", i, epoch_log)])) for i in range(2)]
    party = Party(cfg_for(snaps, tmp_path / "log"), links, epoch_log)
    return party, links, synthetic_pages(3, 0, NUM_PAGES).copy()


def _b_half(model: np.ndarray, key, first: int = 0) -> np.ndarray:
    bits = selection_range(key, 0, model.shape[0] - first)
    return np.bitwise_xor.reduce(model[first:][bits.astype(bool)], axis=0)


async def _read_packed(party: Party, model: np.ndarray, targets: list[int],
                       table: Table | None = None) -> list[bytes]:
    d = table.domain_bits if table else domain_bits_for(model.shape[0])
    first = table.first_page if table else 0
    rows = model[: table.stop_page] if table else model
    padded = targets + [0] * (-len(targets) % 3)
    pairs = [generate_packed_keys(d, t) for t in padded]
    keys = [a.to_bytes() for a, _ in pairs]
    answer = await party.query_batch([keys[i:i + 3] for i in range(0, len(keys), 3)],
                                     table=None if table is None else table.name)
    got = [p for r in answer["results"] for p in r["pages"]]
    return [(np.frombuffer(pa, np.uint8) ^ _b_half(rows, kb, first)).tobytes()
            for (_, kb), pa in list(zip(pairs, got, strict=True))[:len(targets)]]


def test_epoch_advertises_both_formats_and_packed_queries_read_pages(served):
    party, links, model = served
    doc = asyncio.run(party.epoch())
    assert doc["page_pir"]["key_formats"] == ["v1", "packed"]
    targets = [0, 47, 48, 95, 13]
    assert asyncio.run(_read_packed(party, model, targets)) == [model[t].tobytes()
                                                                for t in targets]
    assert {s[0] for link in links for s in link.scans} == {"PackedKeyBatch"}


def test_pending_updates_folds_and_tables_answer_packed_keys(served):
    party, links, model = served
    rng = np.random.default_rng(2)
    table = Table(**TABLES[0])
    for step in range(3):
        ups = [PageUpdate(int(p), rng.integers(0, 256, 4096, np.uint8).tobytes())
               for p in rng.integers(0, NUM_PAGES, 4)]
        asyncio.run(party.admin.updates(ChangeBatch.from_changes(ups)))
        for u in ups:
            model[u.page] ^= np.frombuffer(u.diff, np.uint8)
        touched = [u.page for u in ups]
        assert links[0].core.state.current.pending  # answered with pending updates applied
        got = asyncio.run(_read_packed(party, model, touched[:3] + [1]))
        assert got == [model[t].tobytes() for t in touched[:3] + [1]]
        in_table = [t for t in (0, 5, 19)]
        got = asyncio.run(_read_packed(party, model, in_table, table))
        assert got == [model[table.first_page + t].tobytes() for t in in_table]
        if step == 1:
            for link in links:
                link.core.state.fold_pending()
            assert not links[0].core.state.current.pending


def test_a_request_never_mixes_formats(served):
    party, _, _ = served
    d = domain_bits_for(NUM_PAGES)
    v1 = dpf.generate_keys(d, 3)[0].to_bytes()
    pk = generate_packed_keys(d, 3)[0].to_bytes()
    with pytest.raises(WireError) as err:
        asyncio.run(party.query_batch([[pk, pk, pk], [pk, v1, pk]]))
    assert err.value.status == 400 and err.value.code == ErrorCode.BAD_KEY
    assert "query 1 key 1" in err.value.message and "mixes" in err.value.message
    bad = bytearray(pk)
    bad[19] = 1  # the format tag
    with pytest.raises(WireError) as err:
        asyncio.run(party.query_batch([[pk, pk, bytes(bad)]]))
    assert err.value.status == 400 and "format tag" in err.value.message
    wrong_domain = generate_packed_keys(d + 1, 3)[0].to_bytes()
    with pytest.raises(WireError) as err:
        asyncio.run(party.query_batch([[wrong_domain] * 3]))
    assert err.value.status == 400 and err.value.code == ErrorCode.BAD_DOMAIN


def test_the_coalescer_merges_only_calls_of_one_format(served):
    party, links, model = served
    party.coalescer.window_s = 0.05
    party.coalescer.eager = False
    d = domain_bits_for(NUM_PAGES)

    async def all_at_once():
        v1 = party.query_batch([[dpf.generate_keys(d, t)[0].to_bytes() for t in (1, 2, 3)]])
        return await asyncio.gather(
            _read_packed(party, model, [4, 5, 6]), _read_packed(party, model, [7, 8, 9]), v1)

    p1, p2, _ = asyncio.run(all_at_once())
    assert p1 + p2 == [model[t].tobytes() for t in range(4, 10)]
    for link in links:
        # the two packed requests merged into one scan of 6 keys; the v1 one scanned apart
        assert sorted(link.scans) == [("KeyBatch", 3), ("PackedKeyBatch", 6)]


def test_a_party_whose_shards_lack_the_format_refuses_it(served):
    party, links, _ = served
    links[1].formats = ["v1"]  # a shard of before packed keys, or one without packed kernels
    doc = asyncio.run(party.epoch())
    assert doc["page_pir"]["key_formats"] == ["v1"]
    pk = generate_packed_keys(domain_bits_for(NUM_PAGES), 3)[0].to_bytes()
    with pytest.raises(WireError) as err:
        asyncio.run(party.query_batch([[pk] * 3]))
    assert err.value.status == 400 and "does not take packed keys" in err.value.message
    assert not any(link.scans for link in links)


def test_an_engine_without_packed_kernels_refuses_packed_batches(tmp_path):
    class V1Only:  # an engine naming no formats
        name = "gpu"

        def __init__(self):
            self._inner = engine.create("cpu")

        def load(self, pages, first_page=0):
            return self._inner.load(pages, first_page)

    snap = build_synthetic(tmp_path / "s", 64, seed=1, epoch_id=1, progress=False)
    state = ShardState(V1Only(), Snapshot.open(tmp_path / "s"), 0, snap.num_pages)
    batch = PackedKeyBatch.from_keys([generate_packed_keys(6, 1)[0]])
    with pytest.raises(KeyFormatUnsupported, match="gpu engine does not scan packed"):
        state.scan(batch)
    state.scan([dpf.generate_keys(6, 1)[0]])  # v1 keys still scan


def test_short_keys_get_the_reference_messages_on_any_server():
    for formats in (("v1",), ("v1", "packed")):
        for raw in (b"", bytes(18)):
            with pytest.raises(WireError) as err:
                wire.validate_queries([[raw] * 3], wire.MSGPACK, domain_bits=7, max_queries=4,
                                      key_formats=formats)
            assert err.value.status == 400 and "too short" in err.value.message


def test_a_replica_on_a_v1_only_engine_says_so_and_answers_400(tmp_path, monkeypatch):
    class V1Only:  # an engine naming no formats
        name = "gpu"

        def __init__(self, inner):
            self._inner = inner

        def load(self, pages, first_page=0):
            return self._inner.load(pages, first_page)

    cpu = engine.create("cpu")
    monkeypatch.setattr(shard_module.engines, "create", lambda name, **kw: V1Only(cpu))
    build_synthetic(tmp_path / "s", 64, seed=1, epoch_id=1, progress=False)
    core = ShardCore.open(Snapshot.open(tmp_path / "s"), 0, 1, "gpu")
    replica = ShardReplica(core, None)
    assert asyncio.run(replica.info())["key_formats"] == ["v1"]
    batch = PackedKeyBatch.from_keys([generate_packed_keys(6, 1)[0]])
    with pytest.raises(WireError) as err:
        asyncio.run(replica.scan(batch))
    assert err.value.status == 400 and "does not scan packed keys" in err.value.message


def test_the_self_test_checks_packed_answers_where_the_engine_scans_them(tmp_path):
    build_synthetic(tmp_path / "s", 64, seed=1, epoch_id=1, progress=False)
    core = ShardCore.open(Snapshot.open(tmp_path / "s"), 1, 2, "cpu")
    core.self_test()
    real = core._probe

    class WrongPacked:  # right on v1 keys, zeros for packed ones
        def scan(self, batch):
            got = real.scan(batch)
            return np.zeros_like(got) if isinstance(batch, PackedKeyBatch) else got

    core._probe = WrongPacked()
    with pytest.raises(RuntimeError, match="self-test"):
        core.self_test()
