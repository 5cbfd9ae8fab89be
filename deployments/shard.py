"""One shard of a party's matrix as a Serve deployment (`shard_0`, `shard_1`, ...).

A replica maps its own page range of the snapshot (never through the object store or a
constructor argument), holds an engine over it, and answers `scan(keys)` with its epoch id and
the partial accumulators as host bytes. Extra replicas of a deployment are copies of the same
shard. The logic is `morphogen.shard.ShardCore`; this is the Ray adapter.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import ray
from ray import serve

from cluster.config import PartyConfig
from cluster.snapshots import open_snapshot
from morphogen.dpf import KeyBatch
from morphogen.shard import ShardCore

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
        self._core = ShardCore.open(snapshot, index, cfg.num_shards, engine_name,
                                    cfg.engine_options)
        self._pool = ThreadPoolExecutor(cfg.shard_threads, thread_name_prefix=f"scan{index}")
        self._probe_pool = ThreadPoolExecutor(1, thread_name_prefix=f"probe{index}")
        self._core.self_test()  # fail the constructor (not the first query) on a broken engine
        self._failures = 0
        self._scans = 0
        c = self._core
        log.info(
            "shard %d/%d ready: pages [%d, %d), epoch %d, engine %s, %.1fs",
            index, cfg.num_shards, c.first_page, c.stop_page, c.epoch_id, c.engine_name,
            time.monotonic() - started,
        )

    async def scan(self, batch: KeyBatch) -> tuple[int, bytes]:
        """Partial accumulators of every key over this shard's pages, `(K * 4096)` bytes."""
        loop = asyncio.get_running_loop()
        try:
            acc = await loop.run_in_executor(self._pool, self._core.scan, batch)
        except Exception:
            self._failures += 1
            raise
        self._failures = 0
        self._scans += 1
        return self._core.epoch_id, np.ascontiguousarray(acc).tobytes()

    async def info(self) -> dict[str, Any]:
        c = self._core
        return {
            "shard": self._index,
            "num_shards": self._num_shards,
            "first_page": c.first_page,
            "stop_page": c.stop_page,
            "num_pages": int(c.snapshot.num_pages),
            "domain_bits": c.domain_bits,
            "epoch_id": c.epoch_id,
            "checksum": c.snapshot.manifest.checksum,
            "engine": c.engine_name,
            "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "scans": self._scans,
        }

    async def check_health(self) -> None:
        """Unhealthy unless data is mapped, the epoch is known and the engine still computes a
        known answer (a one-page scan)."""
        if self._core is None or self._core.epoch_id is None:
            raise RuntimeError("shard not loaded")
        if self._failures >= _MAX_CONSECUTIVE_FAILURES:
            raise RuntimeError(f"{self._failures} consecutive scans failed")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._probe_pool, self._core.self_test)

    def __del__(self) -> None:
        core = getattr(self, "_core", None)
        if core is not None:
            try:
                core.close()
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        for pool in (getattr(self, "_pool", None), getattr(self, "_probe_pool", None)):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
