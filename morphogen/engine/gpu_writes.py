"""Page updates written into a GPU shard's device copy between scans (GpuShard.write_pages).

Design (docs/gpu.md, "Updates"): an update is an XOR diff, both device layouts are linear over
GF(2), so patch_kernel.cu XORs each diff's image into the copy in place: per changed page,
4 KiB crosses the bus and the 32768 words holding its bits change; untouched pages are never
uploaded again and nothing is re-sliced. Scans and writes are ordered by a writer-preferring
gate: a write waits for the scans in flight (each finishes on the data it started on), and
scans that start meanwhile wait for the write (a few milliseconds for a block of 3,000 pages);
every scan reports the write generation its answers are on. No second copy of anything is
kept: the memory a write needs is its diffs' staging (4 KiB a page, on the host and on the
device, kept for the next write).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.engine.gpu_backend import Backend
from morphogen.engine.gpu_kernels import U32

PATCH_PAGES_KERNEL = "morphogen_patch_pages"
PATCH_SLICED_KERNEL = "morphogen_patch_sliced"
PATCH_THREADS = 256


class ScanGate:
    """Scans share it, a write holds it alone; a waiting write keeps new scans out, so a
    stream of scans never starves it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._scans = 0
        self._writing = False
        self._writers_waiting = 0
        self.generation = 0  # writes completed

    @contextlib.contextmanager
    def scan(self) -> Iterator[int]:
        """Held for a scan's launches; yields the generation they read."""
        with self._cond:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._scans += 1
            generation = self.generation
        try:
            yield generation
        finally:
            with self._cond:
                self._scans -= 1
                if not self._scans:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writing or self._scans:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self.generation += 1
                self._cond.notify_all()


def merge_diffs(pages: Sequence[int] | np.ndarray,
                diffs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct pages sorted, their diffs): diffs of one page XORed into one, so that no
    two threads of the patch write one lane of the fused layout."""
    pages = np.asarray(pages, dtype=np.int64).reshape(-1)
    diffs = np.asarray(diffs, dtype=np.uint8).reshape(-1, PAGE_SIZE)
    if pages.shape[0] != diffs.shape[0]:
        raise ValueError(f"{pages.shape[0]} pages but {diffs.shape[0]} diffs")
    uniq, inverse = np.unique(pages, return_inverse=True)
    if uniq.shape[0] == pages.shape[0]:
        order = np.argsort(pages, kind="stable")
        return pages[order], diffs[order]
    merged = np.zeros((uniq.shape[0], PAGE_SIZE), np.uint8)
    for i, j in enumerate(inverse):
        merged[j] ^= diffs[i]
    return uniq, merged


def buffer_slots(pages: Sequence[int] | np.ndarray, diffs: np.ndarray, first_page: int,
                 num_pages: int, base: int) -> tuple[np.ndarray, np.ndarray]:
    """(buffer page of each distinct page = page - base, its merged diff), refusing a page
    outside the shard [first_page, first_page + num_pages)."""
    pages, diffs = merge_diffs(pages, diffs)
    if pages.size and (pages[0] < first_page or pages[-1] >= first_page + num_pages):
        raise ValueError(f"pages outside the shard [{first_page}, {first_page + num_pages})")
    return (pages - base).astype(np.uint32), diffs


class DeviceWriter:
    """The staging of one shard's writes: a stream and buffers grown to the largest write."""

    def __init__(self, backend: Backend, kernel: Any, sm_count: int) -> None:
        self._backend = backend
        self._kernel = kernel
        self._grid_cap = max(1, sm_count * 8)
        self._stream: Any = None
        self._capacity = 0
        self._host: np.ndarray | None = None
        self._diffs_dev: Any = None
        self._slots_dev: Any = None

    def _reserve(self, n: int) -> None:
        if n <= self._capacity:
            return
        b = self._backend
        cap = max(n, 2 * self._capacity, 64)
        # one pinned buffer: the diffs, then the slots
        self._host = b.alloc_pinned(cap * (PAGE_SIZE + 4))[: cap * (PAGE_SIZE + 4)]
        self._diffs_dev = b.alloc(cap * PAGE_SIZE)
        self._slots_dev = b.alloc(cap * 4)
        self._capacity = cap
        if self._stream is None:
            self._stream = b.new_stream()

    def apply(self, slots: np.ndarray, diffs: np.ndarray, dest: Any) -> None:
        """XOR `diffs` into buffer `dest` at buffer page `slots` (distinct), synchronously."""
        n = int(slots.shape[0])
        if n == 0:
            return
        self._reserve(n)
        assert self._host is not None
        b = self._backend
        host_diffs = self._host[: n * PAGE_SIZE]
        host_slots = self._host[self._capacity * PAGE_SIZE :][: n * 4].view(np.uint32)
        np.copyto(host_diffs.reshape(n, PAGE_SIZE), diffs)
        host_slots[:] = slots
        grid = min(self._grid_cap, -(-n * (PAGE_SIZE // 16) // PATCH_THREADS))
        with b.activate():
            b.h2d(self._diffs_dev, 0, host_diffs, self._stream)
            b.h2d(self._slots_dev, 0, host_slots.view(np.uint8), self._stream)
            b.launch(self._kernel, grid, PATCH_THREADS,
                     (self._diffs_dev, self._slots_dev, U32(n), dest), 0, self._stream)
            b.synchronize(self._stream)
