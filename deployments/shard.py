"""One shard of a party's matrix as a Serve deployment (`shard_0`, `shard_1`, ...).

A replica maps its own page range of the snapshot (never through the object store or a
constructor argument), holds an engine over it, and answers `scan(keys)` with the epoch id and
the partial accumulators (host bytes) of one epoch. Admin operations publish new epochs in two
phases (`prepare_updates` / `prepare_snapshot`, then `commit` or `abort`); a background task
folds pending page updates into the pages. Extra replicas of a deployment are copies of the
same shard (admin then stays off: see `PartyConfig`). The logic is `morphogen.shard.ShardCore`;
this is the Ray adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import ray
from ray import serve

from deployments.metrics import ServeMetrics
from morphogen.changes import ChangeBatch
from morphogen.codec import ErrorCode, WireError
from morphogen.config import PartyConfig
from morphogen.dpf import DomainError, KeyBatch
from morphogen.epoch_log import EpochLog
from morphogen.identity import EpochIdentity
from morphogen.redact import reason
from morphogen.shard import ShardCore
from morphogen.snapshots import open_snapshot

log = logging.getLogger("ray.serve")

# Consecutive failed scans after which the replica reports itself unhealthy (Serve replaces it).
_MAX_CONSECUTIVE_FAILURES = 3


@serve.deployment
class Shard:
    def __init__(self, cfg: PartyConfig, index: int, engine_name: str) -> None:
        started = time.monotonic()
        self._index = index
        self._num_shards = cfg.num_shards
        snapshot = open_snapshot(cfg, verify=cfg.verify_snapshot)
        self._core = ShardCore.open(
            snapshot, index, cfg.num_shards, engine_name, cfg.engine_options,
            chunk_pages=cfg.fold_chunk_pages, stale_stage_s=cfg.admin_stale_stage_s,
        )
        self._pool = ThreadPoolExecutor(cfg.shard_threads, thread_name_prefix=f"scan{index}")
        self._probe_pool = ThreadPoolExecutor(1, thread_name_prefix=f"probe{index}")
        # prepare / commit / abort / fold: serialised on their own thread, never on the loop
        self._admin_pool = ThreadPoolExecutor(1, thread_name_prefix=f"admin{index}")
        self._core.self_test()  # fail the constructor (not the first query) on a broken engine
        # Back to the party's epoch before serving: replay what was published since the
        # configured snapshot (a restart, or a replica added later).
        self._metrics = ServeMetrics()
        self._log = EpochLog(cfg.epoch_log_dir) if cfg.epoch_log_dir else None
        replay_started = time.monotonic()
        replayed = self._core.catch_up(self._log) if self._log is not None else 0
        self._replayed = replayed
        self._replay_s = time.monotonic() - replay_started
        self._failures = 0
        self._scans = 0
        self._folds = 0
        self._fold_interval = cfg.fold_interval_s
        self._fold_threshold = cfg.fold_threshold
        self._fold_wakeup = asyncio.Event()
        self._folder: asyncio.Task[None] | None = None
        self._start_folder()
        c = self._core
        log.info(
            "shard %d/%d ready: pages [%d, %d), %s (%d log entries replayed), engine %s, %.1fs",
            index, cfg.num_shards, c.first_page, c.stop_page, c.identity, replayed,
            c.engine_name, time.monotonic() - started,
        )

    # ------------------------------------------------------------------ queries

    async def scan(self, batch: KeyBatch) -> tuple[EpochIdentity, bytes]:
        """`(identity, K * 4096 bytes)`: partial accumulators of every key over this shard's
        pages, all computed on the one epoch (and data) named."""
        self._start_folder()
        loop = asyncio.get_running_loop()
        try:
            identity, acc, phases = await loop.run_in_executor(
                self._pool, self._core.scan_timed, batch)
        except DomainError as exc:
            # keys made for the domain before a rotation: the caller's mistake, not a failure
            raise WireError(
                400, ErrorCode.BAD_DOMAIN, f"{exc} (the snapshot changed; see GET /epoch)"
            ) from None
        except Exception as exc:
            self._failures += 1
            log.warning("shard %d: scan failed (%s)", self._index, reason(exc))
            raise
        self._failures = 0
        self._scans += 1
        self._metrics.scan(self._index, len(batch), self._core.stop_page - self._core.first_page,
                           phases)
        return identity, np.ascontiguousarray(acc).tobytes()

    def _report_epoch(self) -> None:
        """Refresh the gauges (Ray exports a gauge only in the intervals it was set in, and
        drops what the constructor records): on every publication, fold round and health
        check."""
        current = self._core.state.current
        self._metrics.epoch(self._index, current.epoch_id, len(current.pending))
        self._metrics.caught_up(self._index, self._replayed, self._replay_s)
        self._replay_s = None

    async def info(self) -> dict[str, Any]:
        self._start_folder()
        out = self._core.info()
        out.update(
            shard=self._index,
            num_shards=self._num_shards,
            checksum=out["snapshot_checksum"],
            pid=os.getpid(),
            gpu_ids=[str(g) for g in ray.get_gpu_ids()],
            scans=self._scans,
            folds=self._folds,
        )
        return out

    # ------------------------------------------------------------------ epochs (two-phase)

    async def _admin(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._admin_pool, lambda: fn(*args, **kwargs))

    async def prepare_updates(
        self, epoch_id: int, changes: ChangeBatch, base_epoch: int, op: str
    ) -> int:
        """Stage `epoch_id` = the current epoch (`base_epoch`) plus `changes`; returns how many
        of them touch this shard."""
        return int(await self._admin(self._core.prepare_updates, epoch_id, changes,
                                     base_epoch=base_epoch, op=op))

    async def prepare_snapshot(
        self, epoch_id: int, path: str, checksum: str | None, op: str
    ) -> dict[str, int]:
        """Stage `epoch_id` = this shard's range of the snapshot at `path` (mapped and loaded
        now; the current epoch keeps serving)."""
        started = time.monotonic()
        first, stop = await self._admin(self._core.prepare_snapshot, epoch_id, path,
                                        checksum=checksum, op=op)
        log.info("shard %d staged epoch %d: pages [%d, %d), %.2fs", self._index, epoch_id,
                 first, stop, time.monotonic() - started)
        return {"first_page": first, "stop_page": stop}

    async def commit(self, epoch_id: int, op: str) -> int:
        await self._admin(self._core.commit, epoch_id, op=op)
        self._report_epoch()
        if self._core.state.current.pending and (
            len(self._core.state.current.pending) >= self._fold_threshold
        ):
            self._fold_wakeup.set()
        return self._core.epoch_id

    async def abort(self, epoch_id: int, op: str) -> None:
        await self._admin(self._core.abort, epoch_id, op=op)

    async def catch_up(self) -> dict[str, Any]:
        """Replay the party's epoch log up to its head (a shard a failed commit or a router
        that died mid-publication left behind); returns `{"applied", "identity"}`."""
        if self._log is None:
            return {"applied": 0, "identity": self._core.identity.digest}
        started = time.monotonic()
        applied = await self._admin(self._core.catch_up, self._log)
        self._replayed, self._replay_s = applied, time.monotonic() - started
        self._report_epoch()
        if applied:
            log.info("shard %d caught up %d log entries: now %s", self._index, applied,
                     self._core.identity)
        return {"applied": int(applied), "identity": self._core.identity.digest}

    # ------------------------------------------------------------------ background fold

    def _start_folder(self) -> None:
        if self._folder is not None or self._fold_interval <= 0:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # started by the first call instead
        self._folder = loop.create_task(self._fold_loop())

    async def _fold_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._fold_wakeup.wait(), self._fold_interval)
            self._fold_wakeup.clear()
            self._report_epoch()
            if not self._core.state.current.pending:
                continue
            try:
                folded = await self._admin(self._core.fold_pending)
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                log.warning("shard %d: folding pending updates failed (%s)", self._index,
                            reason(exc))
                continue
            if folded:
                self._folds += 1
                self._report_epoch()

    # ------------------------------------------------------------------ lifecycle

    async def check_health(self) -> None:
        """Unhealthy unless data is mapped, the epoch is known and the engine still computes a
        known answer (a one-page scan)."""
        self._start_folder()
        if self._core is None or self._core.epoch_id is None:
            raise RuntimeError("shard not loaded")
        if self._failures >= _MAX_CONSECUTIVE_FAILURES:
            raise RuntimeError(f"{self._failures} consecutive scans failed")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._probe_pool, self._core.self_test)
        self._report_epoch()  # gauges stay current between publications

    def __del__(self) -> None:
        folder = getattr(self, "_folder", None)
        if folder is not None:
            folder.cancel()
        core = getattr(self, "_core", None)
        if core is not None:
            try:
                core.close()
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        for name in ("_pool", "_probe_pool", "_admin_pool"):
            pool = getattr(self, name, None)
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
