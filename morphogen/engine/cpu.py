"""The fast CPU engine: numba, multi-threaded, one fused pass over the pages per call."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numba
import numpy as np

from morphogen import _dpf_jit
from morphogen.dpf import DpfKey, KeyBatch, as_batch
from morphogen.engine import _cpu_kernel
from morphogen.engine.base import MAX_KEYS_PER_SCAN, PAGE_SIZE, check_domain, check_pages

DEFAULT_TILE_PAGES = 256


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


class CpuShard:
    def __init__(
        self, pages: np.ndarray, first_page: int, *, threads: int, tile: int, max_keys: int
    ) -> None:
        pages = check_pages(pages)
        # the kernel reads pages as u64 rows; a strided view would silently lose vectorisation
        self._pages = np.ascontiguousarray(pages).view(np.uint64)
        self.num_pages = int(pages.shape[0])
        self.first_page = int(first_page)
        self._threads = threads
        self._tile = tile
        self._max_keys = max_keys
        self._ws = _Workspace(threads, max_keys, tile)
        # numba's default thread pool must not be entered by two callers at once
        self._lock = threading.Lock()

    def scan(self, keys: Sequence[DpfKey] | KeyBatch) -> np.ndarray:
        batch = as_batch(keys)
        check_domain(batch, self.first_page, self.num_pages)
        result = np.empty((len(batch), PAGE_SIZE), np.uint8)
        for start in range(0, len(batch), self._max_keys):
            stop = min(len(batch), start + self._max_keys)
            result[start:stop] = self._scan_chunk(batch.select(start, stop))
        return result

    def _scan_chunk(self, b: KeyBatch) -> np.ndarray:
        ws = self._ws
        k = len(b)
        with self._lock:
            prev = numba.get_num_threads()
            numba.set_num_threads(self._threads)
            try:
                _cpu_kernel.scan_pages(
                    self._pages, self.first_page, b.domain_bits,
                    b.root_seed, b.root_t, b.cw, b.tcw, b.final_cw,
                    self._tile, ws.acc, ws.split, ws.masks, ws.masks64,
                    ws.sa, ws.sta, ws.sb, ws.stb, ws.out,
                )
            finally:
                numba.set_num_threads(prev)
            return ws.out[:k].view(np.uint8).copy()

    def close(self) -> None:
        self._pages = None  # type: ignore[assignment]
        self._ws = None  # type: ignore[assignment]


class CpuEngine:
    name = "cpu"

    def __init__(
        self,
        threads: int | None = None,
        tile_pages: int = DEFAULT_TILE_PAGES,
        max_keys: int = MAX_KEYS_PER_SCAN,
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

    def load(self, pages: np.ndarray, first_page: int = 0) -> CpuShard:
        return CpuShard(
            pages, first_page, threads=self.threads, tile=self.tile_pages, max_keys=self.max_keys
        )
