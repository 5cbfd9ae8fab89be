"""One shard of a party's matrix as a Serve deployment (`shard_0`, `shard_1`, ...).

A replica loads its own page range of the snapshot into private memory, checked against the
manifest's chunk hashes (never through the object store or a constructor argument), replays
the party's epoch log before it reports ready, and answers `scan(keys, want)` with the
identity and partial accumulators (host bytes) of one epoch. Publications reach every replica
by broadcast, in two phases (`prepare_*`, then `commit` or `abort`); a background task folds
pending page updates into the pages. A deployment may run any number of replicas (fixed or
autoscaled): they stay on one epoch through the log. The logic is
`morphogen.party.replica.ShardReplica`; this is the Ray adapter.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any

import ray
from ray import serve

from deployments.metrics import ServeMetrics
from deployments.start_board import ReplicaStart
from morphogen.config import PartyConfig
from morphogen.party.replica import ShardReplica
from morphogen.party.shard import ShardCore
from morphogen.party.tables import TableSlice
from morphogen.protocol.changes import ChangeBatch
from morphogen.protocol.dpf import KeyBatch
from morphogen.protocol.identity import EpochIdentity
from morphogen.publication.log import EpochLog
from morphogen.snapshot.chunk_cache import observe_fetches
from morphogen.snapshot.open import open_any
from morphogen.snapshot.source import open_snapshot
from morphogen.storage.settings import configure

log = logging.getLogger("ray.serve")


@serve.deployment
class Shard:
    def __init__(self, cfg: PartyConfig, index: int, engine_name: str) -> None:
        start = ReplicaStart(f"shard_{index}")
        try:
            self._start(cfg, index, engine_name, start)
        except BaseException as exc:
            start.failed(exc)  # Serve's own message names only the deployment
            raise
        start.ready()

    def _start(self, cfg: PartyConfig, index: int, engine_name: str,
               start: ReplicaStart) -> None:
        started = time.monotonic()
        configure(cfg.store_settings())
        observer = ServeMetrics()
        observe_fetches(observer.snapshot_fetch)  # a remote snapshot's chunks, as they land
        observe_fetches(start.fetching)
        snapshot = open_snapshot(cfg, verify=cfg.verify_snapshot)
        core = ShardCore.open(
            snapshot, index, cfg.num_shards, engine_name, cfg.engine_options,
            chunk_pages=cfg.fold_chunk_pages, stale_stage_s=cfg.admin_stale_stage_s,
            opener=functools.partial(open_any, cache_dir=cfg.snapshot_cache_path()),
        )
        core.self_test()  # fail the constructor (not the first query) on a broken engine
        self._replica = ShardReplica.start(
            core,
            (EpochLog(cfg.epoch_log_dir, create=False, log_id=cfg.epoch_log_id,
                      marker_later=True)
             if cfg.epoch_log_dir else None),
            threads=cfg.shard_threads,
            catch_up_wait_s=cfg.catch_up_wait_s,
            retry_after_s=cfg.retry_after_s,
            fold_interval_s=cfg.fold_interval_s,
            fold_threshold=cfg.fold_threshold,
            observer=observer,
        )
        log.info(
            "shard %d/%d ready: pages [%d, %d), %s (%d log entries replayed), engine %s, %.1fs",
            index, cfg.num_shards, core.first_page, core.stop_page, core.identity,
            self._replica.replayed, core.engine_name, time.monotonic() - started,
        )

    async def scan(self, batch: KeyBatch, want: EpochIdentity | None = None,
                   table: TableSlice | None = None) -> tuple[EpochIdentity, bytes]:
        return await self._replica.scan(batch, want, table)

    async def info(self) -> dict[str, Any]:
        out = await self._replica.info()
        out.update(pid=os.getpid(), gpu_ids=[str(g) for g in ray.get_gpu_ids()],
                   node_id=ray.get_runtime_context().get_node_id(),
                   replica=serve.get_replica_context().replica_tag)
        return out

    async def prepare_updates(self, epoch_id: int, changes: ChangeBatch, base_epoch: int,
                              op: str, target: str | None = None) -> int:
        return await self._replica.prepare_updates(epoch_id, changes, base_epoch, op, target)

    async def prepare_snapshot(self, epoch_id: int, path: str, checksum: str | None, op: str,
                               target: str | None = None) -> dict[str, int]:
        return await self._replica.prepare_snapshot(epoch_id, path, checksum, op, target)

    async def commit(self, epoch_id: int, op: str, target: str | None = None) -> int:
        return await self._replica.commit(epoch_id, op, target)

    async def abort(self, epoch_id: int, op: str) -> None:
        await self._replica.abort(epoch_id, op)

    async def catch_up(self) -> dict[str, Any]:
        return await self._replica.catch_up()

    async def check_health(self) -> None:
        await self._replica.check_health()

    def __del__(self) -> None:
        replica = getattr(self, "_replica", None)
        if replica is not None:
            replica.close()
