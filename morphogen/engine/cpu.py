"""The fast CPU engine: numba, multi-threaded, one fused pass over the pages per call, for v1
keys (`_cpu_kernel`: DPF expansion and AND-XOR) and packed keys (`_cpu_packed_kernel`: leaf
expansion and a conditional XOR of whole pages)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numba
import numpy as np

from morphogen.constants import KEY_FORMATS, MAX_KEYS_PER_SCAN, PAGE_SIZE
from morphogen.engine import _cpu_kernel, _cpu_packed_kernel
from morphogen.engine.base import check_domain, check_pages
from morphogen.protocol import _dpf_jit
from morphogen.protocol.dpf import DpfKey, KeyBatch, as_batch
from morphogen.protocol.packed import PackedKeyBatch

DEFAULT_TILE_PAGES = 512
# Pages a packed-key tile covers (a multiple of 128): its leaves are 8 PRG calls a key and
# the tile's pages are XORed while they are still in L2.
PACKED_TILE_PAGES = 1024
# Packed keys a pass over the pages at most, which bounds the buckets at 6 MiB a worker (1 MiB
# each eight keys; 12 MiB for a full batch in one pass) at no cost in time: 96 keys over 256 MiB
# on 2 threads took 40.5 to 43.4 ms a call in one pass and 40.6 to 42.1 in two of 48 (alternating
# calls, medians of 9).
PACKED_PASS_KEYS = 48

# numba's thread pool is per process and runs one parallel region at a time (its default
# workqueue layer aborts on concurrent entry), so every CPU scan in the process takes turns.
_POOL_LOCK = threading.Lock()


class _Workspace:
    """Per-worker accumulators, masks and expansion scratch, allocated once per shard."""

    def __init__(self, workers: int, max_keys: int, tile: int) -> None:
        leaves = _dpf_jit.MAX_SUBTREE_LEAVES
        words = _cpu_kernel.U64_PER_PAGE
        self.acc = np.zeros((workers, max_keys, words), np.uint64)
        self.split = np.zeros((workers, words), np.uint64)
        self.masks = np.zeros((workers, max_keys, tile, 4), np.uint32)
        self.masks64 = self.masks.view(np.uint64)
        self.sa = np.zeros((workers, 4, leaves), np.uint32)
        self.sta = np.zeros((workers, leaves), np.uint32)
        self.sb = np.zeros((workers, 4, leaves), np.uint32)
        self.stb = np.zeros((workers, leaves), np.uint32)
        self.out = np.zeros((max_keys, _cpu_kernel.U64_PER_PAGE), np.uint64)
        # a tile's leaves, one more than tile/128 for a tile cut by a shard boundary
        self.leaves = np.zeros(
            (workers, max_keys, PACKED_TILE_PAGES // _cpu_packed_kernel.LEAF_PAGES + 1, 4),
            np.uint32,
        )
        self.leaves64 = self.leaves.view(np.uint64)
        # packed scans' buckets (`_cpu_packed_kernel`), made on the first packed scan: up to
        # 1 MiB a worker for each eight keys, which a v1-only server never needs
        self.buckets = np.zeros((workers, 0, _cpu_kernel.U64_PER_PAGE), np.uint64)

    def bucket_rows(self, rows: int) -> np.ndarray:
        if self.buckets.shape[1] < rows:
            workers = self.buckets.shape[0]
            self.buckets = np.zeros((workers, rows, _cpu_kernel.U64_PER_PAGE), np.uint64)
        return self.buckets


class CpuShard:
    """One contiguous run of pages; scans use the engine's shared workspace."""

    def __init__(self, pages: np.ndarray, first_page: int, engine: CpuEngine) -> None:
        pages = check_pages(pages)
        # the kernel reads pages as u64 rows; a strided view would silently lose vectorisation
        self._pages = np.ascontiguousarray(pages).view(np.uint64)
        # scans read `pages` itself (no copy was made): a write into them, between scans, is
        # what the next scan reads (morphogen.party.host_fold)
        self.reads_in_place = bool(pages.flags.c_contiguous)
        self.num_pages = int(pages.shape[0])
        self.first_page = int(first_page)
        self._engine = engine

    def scan(self, keys: Sequence[DpfKey] | KeyBatch | PackedKeyBatch) -> np.ndarray:
        batch = keys if isinstance(keys, PackedKeyBatch) else as_batch(keys)
        check_domain(batch, self.first_page, self.num_pages)
        result = np.empty((len(batch), PAGE_SIZE), np.uint8)
        step = self._engine.max_keys
        if isinstance(batch, PackedKeyBatch):
            step = min(step, self._engine.packed_pass_keys)
        for start in range(0, len(batch), step):
            stop = min(len(batch), start + step)
            result[start:stop] = self._scan_chunk(batch.select(start, stop))
        return result

    def _scan_chunk(self, b: KeyBatch | PackedKeyBatch) -> np.ndarray:
        eng = self._engine
        k = len(b)
        with eng.lock:
            ws = eng.workspace()
            prev = numba.get_num_threads()
            numba.set_num_threads(eng.threads)
            try:
                if isinstance(b, PackedKeyBatch):
                    # a worker's share is whole tiles: a shard under a tile is one worker's
                    share = max(-(-self.num_pages // eng.threads),
                                min(self.num_pages, PACKED_TILE_PAGES))
                    group_keys, group_rows, rows = _cpu_packed_kernel.plan_groups(
                        k, share, eng.packed_group_keys)
                    _cpu_packed_kernel.scan_packed(
                        self._pages, self.first_page, b.levels,
                        b.root_seed, b.root_t, b.cw, b.tcw, b.final_cw,
                        PACKED_TILE_PAGES, ws.acc, ws.leaves, ws.leaves64,
                        ws.sa, ws.sta, ws.sb, ws.stb, ws.out, ws.bucket_rows(rows),
                        group_keys, group_rows, rows,
                    )
                    return ws.out[:k].view(np.uint8).copy()
                _cpu_kernel.scan_pages(
                    self._pages, self.first_page, b.domain_bits,
                    b.root_seed, b.root_t, b.cw, b.tcw, b.final_cw,
                    eng.tile_pages, ws.acc, ws.split, ws.masks, ws.masks64,
                    ws.sa, ws.sta, ws.sb, ws.stb, ws.out,
                )
            finally:
                numba.set_num_threads(prev)
            return ws.out[:k].view(np.uint8).copy()

    def close(self) -> None:
        self._pages = None  # type: ignore[assignment]


class CpuEngine:
    name = "cpu"
    key_formats = KEY_FORMATS

    def __init__(
        self,
        threads: int | None = None,
        tile_pages: int = DEFAULT_TILE_PAGES,
        max_keys: int = MAX_KEYS_PER_SCAN,
        packed_group_keys: int = _cpu_packed_kernel.MAX_GROUP_KEYS,
        packed_pass_keys: int = PACKED_PASS_KEYS,
    ) -> None:
        limit = numba.config.NUMBA_NUM_THREADS
        self.threads = max(1, min(int(threads or limit), limit))
        power_of_two = tile_pages >= 1 and not tile_pages & (tile_pages - 1)
        if not power_of_two or tile_pages > _dpf_jit.MAX_SUBTREE_LEAVES:
            raise ValueError(
                f"tile_pages must be a power of two in 1..{_dpf_jit.MAX_SUBTREE_LEAVES}"
            )
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.tile_pages = tile_pages
        self.max_keys = max_keys
        if not 1 <= packed_group_keys <= _cpu_packed_kernel.MAX_GROUP_KEYS:
            raise ValueError(
                f"packed_group_keys must be in 1..{_cpu_packed_kernel.MAX_GROUP_KEYS}")
        # keys a bucket group of a packed scan holds at most (fewer only to test the kernel)
        self.packed_group_keys = int(packed_group_keys)
        if packed_pass_keys < 1:
            raise ValueError("packed_pass_keys must be at least 1")
        self.packed_pass_keys = int(packed_pass_keys)
        # Scanners loaded from one engine share its workspace (they take turns on the pool
        # anyway): a shard split into many copy-on-write segments must not multiply buffers.
        self.lock = _POOL_LOCK
        self._ws: _Workspace | None = None

    def workspace(self) -> _Workspace:
        """The engine's buffers, allocated on first use and reused (call under `lock`)."""
        if self._ws is None:
            self._ws = _Workspace(self.threads, self.max_keys, self.tile_pages)
        return self._ws

    def load(self, pages: np.ndarray, first_page: int = 0) -> CpuShard:
        return CpuShard(pages, first_page, self)
