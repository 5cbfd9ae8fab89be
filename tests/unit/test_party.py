"""The party logic without Ray: in-process shards (ShardCore) behind `ShardLink`s, a real epoch
log on disk. Answers carry the identity of their data; a shard on other data under the same
epoch id is refused, never XORed; publications are logged first and a restarted shard replays
the log to the party's identity."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from morphogen import dpf
from morphogen.changes import ChangeBatch, PageUpdate, PageWrite
from morphogen.codec import ErrorCode, WireError
from morphogen.config import PartyConfig
from morphogen.epoch_log import EpochLog, EpochLogError, updates_entry
from morphogen.party import Party
from morphogen.replica import ShardReplica
from morphogen.shard import ShardCore
from morphogen.snapshot.layout import domain_bits_for
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages

NUM_PAGES = 96


class ReplicaSet:
    """Replicas of one shard as the party calls a Serve deployment: a scan or an info reaches
    one replica (round robin), a publication step every reachable one (broadcast)."""

    def __init__(self, members: list[ShardReplica]) -> None:
        self.members = list(members)
        self.unreachable: set[int] = set()  # indices a broadcast misses
        self._next = 0

    @property
    def core(self) -> ShardCore:
        return self.members[0].core

    @core.setter
    def core(self, core: ShardCore) -> None:  # replica 0 restarted
        self.members[0] = ShardReplica(core, self.members[0].log)

    def _pick(self) -> ShardReplica:
        member = self.members[self._next % len(self.members)]
        self._next += 1
        return member

    async def scan(self, batch, want):
        return await self._pick().scan(batch, want)

    async def info(self) -> dict[str, Any]:
        return await self._pick().info()

    async def _everywhere(self, method: str, *args) -> list[Any]:
        reached = [m for i, m in enumerate(self.members) if i not in self.unreachable]
        return list(await asyncio.gather(*(getattr(m, method)(*args) for m in reached)))

    async def replicas(self):
        return await self._everywhere("info")

    async def prepare_updates(self, *args):
        return (await self._everywhere("prepare_updates", *args))[0]

    async def prepare_snapshot(self, *args):
        return (await self._everywhere("prepare_snapshot", *args))[0]

    async def commit(self, *args):
        return (await self._everywhere("commit", *args))[0]

    async def abort(self, *args):
        await self._everywhere("abort", *args)

    async def catch_up(self):
        return (await self._everywhere("catch_up"))[0]


@pytest.fixture
def world(tmp_path: Path):
    snaps = tmp_path / "snaps"
    build_synthetic(snaps / "base", NUM_PAGES, seed=3, epoch_id=1, progress=False)
    build_synthetic(snaps / "next", 70, seed=4, epoch_id=1, progress=False)
    return tmp_path, snaps


def _cfg(snaps: Path, log_dir: Path | None) -> PartyConfig:
    return PartyConfig(snapshot=str(snaps / "base"), num_shards=2, coalesce_window_ms=0,
                       admin_snapshot_dir=str(snaps), retry_backoff_ms=1,
                       epoch_log_dir=None if log_dir is None else str(log_dir))


def _start_shard(snap_dir: Path, index: int, epoch_log: EpochLog | None) -> ShardCore:
    return _start_replica(snap_dir, index, epoch_log).core


def _start_replica(snap_dir: Path, index: int, epoch_log: EpochLog | None,
                   **kwargs: Any) -> ShardReplica:
    """What the deployment does before it reports ready: open, then replay the log."""
    return ShardReplica.start(ShardCore.open(Snapshot.open(snap_dir), index, 2, "cpu"),
                              epoch_log, **kwargs)


def _party(snaps: Path, log_dir: Path | None,
           replicas: int = 1) -> tuple[Party, list[ReplicaSet]]:
    epoch_log = EpochLog(log_dir) if log_dir is not None else None
    links = [ReplicaSet([_start_replica(snaps / "base", i, epoch_log) for _ in range(replicas)])
             for i in range(2)]
    return Party(_cfg(snaps, log_dir), links, epoch_log), links


def _ask(party: Party, model: np.ndarray, targets: list[int]) -> tuple[dict, list[bytes]]:
    """Query party A's half and combine with a locally computed B half: the page bytes."""
    d = domain_bits_for(model.shape[0])
    pairs = [dpf.generate_keys(d, t) for t in targets]
    keys = [a.to_bytes() for a, _ in pairs]
    while len(keys) % 3:
        keys.append(keys[0])
    answer = asyncio.run(party.query_batch([keys[i:i + 3] for i in range(0, len(keys), 3)]))
    pages_a = [p for r in answer["results"] for p in r["pages"]]
    out = []
    for (_, kb), pa in zip(pairs, pages_a, strict=False):
        masks = np.stack([np.frombuffer(kb.eval(p), np.uint8) for p in range(model.shape[0])])
        pb = np.bitwise_xor.reduce(model & np.tile(masks, (1, 256)), axis=0)
        out.append((np.frombuffer(pa, np.uint8) ^ pb).tobytes())
    return answer, out


def test_answers_carry_the_identity_and_the_right_pages(world):
    _, snaps = world
    party, links = _party(snaps, None)
    model = synthetic_pages(3, 0, NUM_PAGES)
    answer, pages = _ask(party, model, [0, 47, 48, 95])
    assert pages == [model[t].tobytes() for t in (0, 47, 48, 95)]
    doc = asyncio.run(party.epoch())
    assert answer["epoch_id"] == doc["epoch_id"] == 1
    assert answer["identity"] == doc["identity"] == links[0].core.identity.digest


def test_same_epoch_id_on_other_data_is_refused_not_xored(world):
    """A replica restarted on a snapshot rebuilt in place under the same epoch id."""
    _, snaps = world
    party, links = _party(snaps, None)
    build_synthetic(snaps / "rebuilt", NUM_PAGES, seed=99, epoch_id=1, progress=False)
    links[1].core = ShardCore.open(Snapshot.open(snaps / "rebuilt"), 1, 2, "cpu")
    assert links[1].core.epoch_id == links[0].core.epoch_id == 1
    with pytest.raises(WireError) as err:
        _ask(party, synthetic_pages(3, 0, NUM_PAGES), [5])
    assert err.value.status == 503 and "consistent epoch" in err.value.message
    with pytest.raises(WireError) as err:
        asyncio.run(party.epoch())
    assert err.value.status == 503


def _random_batch(rng, n: int, num_pages: int) -> ChangeBatch:
    changes = []
    for _ in range(n):
        page = int(rng.integers(0, num_pages))
        if rng.random() < 0.7:
            changes.append(PageUpdate(page, rng.integers(0, 256, 4096, np.uint8).tobytes()))
        else:
            changes.append(PageWrite(page, rng.integers(0, 256, 100, np.uint8).tobytes()))
    return ChangeBatch.from_changes(changes)


def _apply(model: np.ndarray, batch: ChangeBatch) -> np.ndarray:
    model = model.copy()
    for i, page in enumerate(batch.pages.tolist()):
        data = np.frombuffer(batch.data[i * 4096:(i + 1) * 4096], np.uint8)
        model[page] = data if batch.replace[i] else model[page] ^ data
    return model


def test_restarted_shards_replay_50_updates_and_a_rotation(world):
    root, snaps = world
    log_dir = root / "log-a"
    party, links = _party(snaps, log_dir)
    rng = np.random.default_rng(8)
    model = synthetic_pages(3, 0, NUM_PAGES)
    for i in range(50):
        batch = _random_batch(rng, 1 + i % 3, model.shape[0])
        out = asyncio.run(party.admin.updates(batch))
        model = _apply(model, batch)
        assert out["epoch_id"] == i + 2 + (i > 30)  # the rotation took epoch 33
        if i == 30:
            rot = asyncio.run(party.admin.snapshot("next"))
            assert rot["epoch_id"] == 33
            model = synthetic_pages(4, 0, 70)
    head = links[0].core.identity
    assert links[1].core.identity == head
    # both replicas die and come back from the configured snapshot: the log brings them back
    for i, link in enumerate(links):
        link.core.close()
        link.core = _start_shard(snaps / "base", i, EpochLog(log_dir))
        assert link.core.identity == head
    answer, pages = _ask(party, model, [0, 35, 69])
    assert answer["identity"] == head.digest
    assert pages == [model[t].tobytes() for t in (0, 35, 69)]
    # the log holds the rotation and the 19 batches after it
    assert [e.kind for e in EpochLog(log_dir).live()] == ["rotation"] + ["updates"] * 19


def test_a_failed_publication_is_aborted_in_the_log(world):
    root, snaps = world
    party, links = _party(snaps, root / "log")
    bad = ChangeBatch.from_changes([PageUpdate(NUM_PAGES + 5, bytes(4096))])
    with pytest.raises(WireError) as err:
        asyncio.run(party.admin.updates(bad))
    assert err.value.status == 400
    assert EpochLog(root / "log").entries() == []  # refused before the log

    async def broken(*args):
        raise RuntimeError("disk gone")

    # a prepare that fails on a shard: aborted everywhere and decided aborted in the log
    links[1].prepare_updates = broken
    with pytest.raises(WireError) as err:
        asyncio.run(party.admin.updates(_random_batch(np.random.default_rng(1), 2, NUM_PAGES)))
    assert err.value.status == 503
    assert EpochLog(root / "log").live() == []
    assert [e.kind for e in EpochLog(root / "log").entries()] == ["updates", "abort"]
    assert links[0].core.epoch_id == 1 and links[0].core.state.staged is None


def _commit_in_log(epoch_log: EpochLog, base, batch: ChangeBatch, pub: str = "committed"):
    """A publication decided committed in the log that no shard has seen (its router died
    right after the decision)."""
    target = base.after_updates(base.epoch_id + 1, batch.digest)
    epoch_log.append_committed(pub, lambda head, seq: (updates_entry(
        target.epoch_id, base.epoch_id, batch, target, seq), batch))
    return target


def test_a_publication_committed_in_the_log_is_served_though_no_shard_got_it(world):
    root, snaps = world
    party, links = _party(snaps, root / "log")
    rng = np.random.default_rng(2)
    first = _random_batch(rng, 2, NUM_PAGES)
    target = _commit_in_log(EpochLog(root / "log"), links[0].core.identity, first)
    model = _apply(synthetic_pages(3, 0, NUM_PAGES), first)
    answer, pages = _ask(party, model, [int(p) for p in first.pages])
    assert answer["identity"] == target.digest
    assert pages == [model[int(p)].tobytes() for p in first.pages]
    second = _random_batch(rng, 2, NUM_PAGES)
    out = asyncio.run(party.admin.updates(second))
    assert out["epoch_id"] == 3
    model = _apply(model, second)
    _, pages = _ask(party, model, [int(p) for p in second.pages])
    assert pages == [model[int(p)].tobytes() for p in second.pages]


def test_a_log_of_other_data_or_a_corrupt_log_refuses_the_start(world):
    root, snaps = world
    party, links = _party(snaps, root / "log")
    asyncio.run(party.admin.updates(_random_batch(np.random.default_rng(5), 3, NUM_PAGES)))
    # the configured snapshot rebuilt in place (forced) under the same epoch id
    shutil.rmtree(snaps / "base")
    build_synthetic(snaps / "base", NUM_PAGES, seed=77, epoch_id=1, progress=False)
    with pytest.raises(EpochLogError, match="derived"):
        _start_shard(snaps / "base", 0, EpochLog(root / "log"))
    # a flipped byte in the log itself
    log_file = next(p for p in (root / "log").iterdir() if not p.name.startswith("updates"))
    raw = bytearray(log_file.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    log_file.write_bytes(bytes(raw))
    with pytest.raises(EpochLogError):
        _start_shard(snaps / "base", 0, EpochLog(root / "log"))


def test_keys_of_a_domain_the_shards_left_are_refused_and_the_layout_refreshed(world):
    """Another router rotated the shards to a bigger domain: this party's cached layout still
    validates the old keys; the shards refuse them (400, never a 500) and the layout moves."""
    _, snaps = world
    party, links = _party(snaps, None)

    async def scenario():
        layout = await party.layout()
        assert layout.domain_bits == 7
        build_synthetic(snaps / "bigger", 200, seed=9, epoch_id=5, progress=False)
        for link in links:
            link.core.prepare_snapshot(5, snaps / "bigger", op="other router")
            link.core.commit(5, op="other router")
        keys = [dpf.generate_keys(7, 3)[0].to_bytes()] * 3
        with pytest.raises(WireError) as err:
            await party.query(keys)
        assert (err.value.status, err.value.code) == (400, ErrorCode.BAD_DOMAIN)
        for _ in range(100):  # the refresh runs in the background
            if (await party.layout()).domain_bits == 8:
                break
            await asyncio.sleep(0.01)
        assert (await party.layout()).num_pages == 200

    asyncio.run(scenario())


# ---------------------------------------------------------------- several replicas per shard


def test_replicas_a_publication_missed_catch_up_when_a_scan_wants_more(world):
    """Three replicas per shard; one of each shard misses six update batches, a rotation and
    four more batches (a broadcast did not reach it). Scans ask for the party's identity, so
    each lagging replica replays the log before it answers: every page right, one identity."""
    root, snaps = world
    party, links = _party(snaps, root / "log", replicas=3)
    links[0].unreachable, links[1].unreachable = {1}, {2}
    rng = np.random.default_rng(11)
    model = synthetic_pages(3, 0, NUM_PAGES)
    for _ in range(6):
        batch = _random_batch(rng, 2, model.shape[0])
        asyncio.run(party.admin.updates(batch))
        model = _apply(model, batch)
    asyncio.run(party.admin.snapshot("next"))
    model = synthetic_pages(4, 0, 70)
    for _ in range(4):
        batch = _random_batch(rng, 2, model.shape[0])
        out = asyncio.run(party.admin.updates(batch))
        model = _apply(model, batch)
    assert links[0].members[1].core.epoch_id == 1 and links[1].members[2].core.epoch_id == 1
    assert party.want is not None and party.want.digest == out["identity"]
    links[0].unreachable = links[1].unreachable = set()
    for round_ in range(3):  # round robin: every replica of both shards answers once
        targets = [int(t) for t in rng.integers(0, 70, 4)]
        answer, pages = _ask(party, model, targets)
        assert answer["identity"] == out["identity"], round_
        assert pages == [model[t].tobytes() for t in targets]
    assert {m.core.identity.digest for link in links for m in link.members} == {out["identity"]}


def test_a_replica_started_after_the_append_takes_the_publication_as_done(world):
    """The decision is written before the commit: a replica that started in between has
    replayed it, so its prepare and commit must be no-ops, not a conflict."""
    root, snaps = world
    epoch_log = EpochLog(root / "log")
    old = _start_replica(snaps / "base", 0, epoch_log)
    batch = _random_batch(np.random.default_rng(4), 3, NUM_PAGES)
    target = _commit_in_log(epoch_log, old.core.identity, batch, "op-1")
    new = _start_replica(snaps / "base", 0, epoch_log)
    assert new.core.identity == target and new.replayed == 1

    async def publish():
        for r in (old, new):
            await r.prepare_updates(2, batch, 1, "op-1", target.digest)
        for r in (old, new):
            await r.commit(2, "op-1", target.digest)

    asyncio.run(publish())
    assert old.core.identity == new.core.identity == target
    assert old.core.state.info()["staged_epoch_id"] is None
    assert new.core.state.info()["staged_epoch_id"] is None


def test_a_replica_that_cannot_catch_up_answers_503_and_another_one_answers(world):
    root, snaps = world
    party, links = _party(snaps, root / "log", replicas=2)
    stuck = ShardReplica(links[0].members[1].core, None, catch_up_wait_s=0)  # no log to read
    links[0].members[1] = stuck
    links[0].unreachable = {1}
    batch = _random_batch(np.random.default_rng(6), 3, NUM_PAGES)
    out = asyncio.run(party.admin.updates(batch))
    model = _apply(synthetic_pages(3, 0, NUM_PAGES), batch)
    for _ in range(4):  # the stuck replica is asked every other round: the retry goes on
        answer, pages = _ask(party, model, [1, 50, 90])
        assert answer["identity"] == out["identity"]
        assert pages == [model[t].tobytes() for t in (1, 50, 90)]
    keys = dpf.generate_keys(7, 3)[0]
    with pytest.raises(WireError) as err:
        asyncio.run(stuck.scan(dpf.KeyBatch.from_keys([keys]), party.want))
    assert err.value.status == 503 and "catching up" in err.value.message
    assert stuck.core.epoch_id == 1


def test_a_router_that_did_not_publish_moves_to_what_another_published(world):
    """Two router replicas over the same shards: B learns A's publication from the answers
    and from then on asks for it (so replicas behind it catch up)."""
    root, snaps = world
    party_a, links = _party(snaps, root / "log", replicas=2)
    party_b = Party(_cfg(snaps, root / "log"), links, EpochLog(root / "log"))
    model = synthetic_pages(3, 0, NUM_PAGES)
    first, _ = _ask(party_b, model, [7])
    assert party_b.want.digest == first["identity"]  # the configured snapshot's
    batch = _random_batch(np.random.default_rng(9), 2, NUM_PAGES)
    out = asyncio.run(party_a.admin.updates(batch))
    model = _apply(model, batch)
    answer, pages = _ask(party_b, model, [int(batch.pages[0]), 7])
    assert answer["identity"] == out["identity"] == party_b.want.digest
    assert pages == [model[int(batch.pages[0])].tobytes(), model[7].tobytes()]
    status = asyncio.run(party_a.admin.status())
    assert [len(s["replicas"]) for s in status["shards"]] == [2, 2]
    assert status["wanted_identity"] == out["identity"]
