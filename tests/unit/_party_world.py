"""In-process parties for the unit tests: shard replicas (ShardReplica over ShardCore, CPU
engine) behind `ShardLink`s that behave as Serve deployments do, a real epoch log on disk, and
the page model the answers are checked against."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from morphogen.config import PartyConfig
from morphogen.party.replica import ShardReplica
from morphogen.party.router import Party
from morphogen.party.shard import ShardCore
from morphogen.protocol import dpf
from morphogen.protocol.changes import ChangeBatch, PageUpdate, PageWrite
from morphogen.publication.log import EpochLog, updates_entry
from morphogen.snapshot.layout import domain_bits_for
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic

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

    async def scan(self, batch, want, table=None):
        return await self._pick().scan(batch, want, table)

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


def make_world(tmp_path: Path):
    snaps = tmp_path / "snaps"
    build_synthetic(snaps / "base", NUM_PAGES, seed=3, epoch_id=1, progress=False)
    build_synthetic(snaps / "next", 70, seed=4, epoch_id=1, progress=False)
    return tmp_path, snaps


def cfg_for(snaps: Path, log_dir: Path | None, **more: Any) -> PartyConfig:
    return PartyConfig(snapshot=str(snaps / "base"), num_shards=2, coalesce_window_ms=0,
                       admin_snapshot_dir=str(snaps), retry_backoff_ms=1,
                       epoch_log_dir=None if log_dir is None else str(log_dir), **more)


def start_shard(snap_dir: Path, index: int, epoch_log: EpochLog | None) -> ShardCore:
    return start_replica(snap_dir, index, epoch_log).core


def start_replica(snap_dir: Path, index: int, epoch_log: EpochLog | None,
                   **kwargs: Any) -> ShardReplica:
    """What the deployment does before it reports ready: open, then replay the log."""
    return ShardReplica.start(ShardCore.open(Snapshot.open(snap_dir), index, 2, "cpu"),
                              epoch_log, **kwargs)


def make_party(snaps: Path, log_dir: Path | None, replicas: int = 1,
               **more: Any) -> tuple[Party, list[ReplicaSet]]:
    epoch_log = EpochLog(log_dir) if log_dir is not None else None
    links = [ReplicaSet([start_replica(snaps / "base", i, epoch_log) for _ in range(replicas)])
             for i in range(2)]
    return Party(cfg_for(snaps, log_dir, **more), links, epoch_log), links


def ask(party: Party, model: np.ndarray, targets: list[int]) -> tuple[dict, list[bytes]]:
    """Query party A's half and combine with a locally computed B half: the page bytes."""
    return asyncio.run(ask_async(party, model, targets))


async def ask_async(party: Party, model: np.ndarray,
                    targets: list[int]) -> tuple[dict, list[bytes]]:
    d = domain_bits_for(model.shape[0])
    pairs = [dpf.generate_keys(d, t) for t in targets]
    keys = [a.to_bytes() for a, _ in pairs]
    while len(keys) % 3:
        keys.append(keys[0])
    answer = await party.query_batch([keys[i:i + 3] for i in range(0, len(keys), 3)])
    pages_a = [p for r in answer["results"] for p in r["pages"]]
    out = []
    for (_, kb), pa in zip(pairs, pages_a, strict=False):
        masks = np.stack([np.frombuffer(kb.eval(p), np.uint8) for p in range(model.shape[0])])
        pb = np.bitwise_xor.reduce(model & np.tile(masks, (1, 256)), axis=0)
        out.append((np.frombuffer(pa, np.uint8) ^ pb).tobytes())
    return answer, out


def random_batch(rng, n: int, num_pages: int) -> ChangeBatch:
    changes = []
    for _ in range(n):
        page = int(rng.integers(0, num_pages))
        if rng.random() < 0.7:
            changes.append(PageUpdate(page, rng.integers(0, 256, 4096, np.uint8).tobytes()))
        else:
            changes.append(PageWrite(page, rng.integers(0, 256, 100, np.uint8).tobytes()))
    return ChangeBatch.from_changes(changes)


def apply_batch(model: np.ndarray, batch: ChangeBatch) -> np.ndarray:
    model = model.copy()
    for i, page in enumerate(batch.pages.tolist()):
        data = np.frombuffer(batch.data[i * 4096:(i + 1) * 4096], np.uint8)
        model[page] = data if batch.replace[i] else model[page] ^ data
    return model


def commit_in_log(epoch_log: EpochLog, base, batch: ChangeBatch, pub: str = "committed"):
    """A publication decided committed in the log that no shard has seen (its router died
    right after the decision)."""
    target = base.after_updates(base.epoch_id + 1, batch.digest)
    epoch_log.append_committed(pub, lambda head, seq: (updates_entry(
        target.epoch_id, base.epoch_id, batch, target, seq), batch))
    return target
