"""A shard's pages onto the device, through bounded pinned staging buffers.

`upload_pages` copies the pages as stored (the fused scan's layout); `upload_sliced_pages`
copies whole 256-page chunks and bit-slices them on the device (the sliced scan's layout,
sliced.py). Either reads the array chunk by chunk through two pinned buffers, so the staging
memory stays bounded whatever the shard's size. A shard passes its verified private copy
(morphogen.snapshot.verified): the bytes that cross the bus are the bytes its identity names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.engine.gpu_backend import Backend
from morphogen.engine.gpu_kernels import U64
from morphogen.engine.sliced import SLICE_BYTES, SLICE_PAGES, SLICE_THREADS, chunk_range

DEFAULT_LOAD_CHUNK_BYTES = 64 << 20


def _staging_batch(count: int, unit_bytes: int, chunk_bytes: int) -> int:
    """Units (pages or 256-page chunks) per staging buffer: at most `chunk_bytes`, at least one."""
    return max(1, min(count, chunk_bytes // unit_bytes))


def _through_staging(
    backend: Backend,
    count: int,
    unit_bytes: int,
    batch: int,
    fill: Callable[[np.ndarray, int, int], None],
    send: Callable[[int, np.ndarray, int, int, Any], None],
) -> None:
    """Moves `count` units to the device `batch` at a time through two pinned buffers: `fill(buf,
    start, m)` writes units [start, start + m) into a pinned buffer while the other one crosses
    the bus, `send(slot, buf, start, m, stream)` queues its copy (and any device work on it). A
    buffer is refilled only once the work queued from it has finished."""
    stream = backend.new_stream()
    staging = [backend.alloc_pinned(batch * unit_bytes)[: batch * unit_bytes] for _ in range(2)]
    events = [backend.new_event(), backend.new_event()]
    used = [False, False]
    for i, start in enumerate(range(0, count, batch)):
        slot = i % 2
        if used[slot]:
            backend.event_synchronize(events[slot])  # that buffer's last use has finished
        m = min(batch, count - start)
        buf = staging[slot][: m * unit_bytes]
        fill(buf, start, m)
        send(slot, buf, start, m, stream)
        backend.record(events[slot], stream)
        used[slot] = True
    backend.synchronize(stream)


def upload_pages(backend: Backend, pages: np.ndarray, chunk_bytes: int) -> Any:
    """Pages into one device allocation, chunk by chunk through two pinned buffers: while one
    chunk crosses the bus the next is read from the host array."""
    n = pages.shape[0]
    dev = backend.alloc(max(n, 1) * PAGE_SIZE)
    if n == 0:
        return dev

    def fill(buf: np.ndarray, start: int, m: int) -> None:
        np.copyto(buf.reshape(m, PAGE_SIZE), pages[start : start + m])

    def send(slot: int, buf: np.ndarray, start: int, m: int, stream: Any) -> None:
        backend.h2d(dev, start * PAGE_SIZE, buf, stream)

    _through_staging(backend, n, PAGE_SIZE, _staging_batch(n, PAGE_SIZE, chunk_bytes), fill, send)
    return dev


def upload_sliced_pages(
    backend: Backend,
    pages: np.ndarray,
    first_page: int,
    chunk_bytes: int,
    slice_kernel: Any,
    sm_count: int,
) -> Any:
    """Pages into one device allocation in the sliced layout (sliced.py): whole global-aligned
    256-page chunks, zero outside the shard, cross the bus in natural order through two pinned
    buffers and two device staging buffers; morphogen_slice_pages transposes each batch on the
    device while the next one is read from the host array."""
    n = pages.shape[0]
    first_chunk, count = chunk_range(first_page, n)
    dev = backend.alloc(max(count, 1) * SLICE_BYTES)
    if count == 0:
        return dev
    batch = _staging_batch(count, SLICE_BYTES, chunk_bytes)
    natural = [backend.alloc(batch * SLICE_BYTES) for _ in range(2)]
    grid = max(1, sm_count * 8)

    def fill(buf: np.ndarray, c0: int, m: int) -> None:
        rows = buf.reshape(m * SLICE_PAGES, PAGE_SIZE)
        g0 = (first_chunk + c0) * SLICE_PAGES  # global page at the batch's start
        lo, hi = max(g0 - first_page, 0), min(g0 + m * SLICE_PAGES - first_page, n)
        at = lo + first_page - g0
        rows[:at] = 0
        np.copyto(rows[at : at + hi - lo], pages[lo:hi])
        rows[at + hi - lo :] = 0

    def send(slot: int, buf: np.ndarray, c0: int, m: int, stream: Any) -> None:
        backend.h2d(natural[slot], 0, buf, stream)
        backend.launch(
            slice_kernel, grid, SLICE_THREADS,
            (natural[slot], U64(m), backend.view(dev, c0 * SLICE_BYTES)), 0, stream,
        )

    _through_staging(backend, count, SLICE_BYTES, batch, fill, send)
    return dev
