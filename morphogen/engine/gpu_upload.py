"""A shard's pages onto the device, through bounded pinned staging buffers.

`upload_pages` copies the pages as stored (the fused scan's layout); `upload_sliced_pages`
copies whole 256-page chunks and bit-slices them on the device (the sliced scan's layout,
sliced.py). Either reads the (memory-mapped) array chunk by chunk through two pinned buffers,
so host memory stays bounded whatever the shard's size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.engine.gpu_backend import Backend
from morphogen.engine.gpu_kernels import U64
from morphogen.engine.sliced import SLICE_BYTES, SLICE_PAGES, SLICE_THREADS, chunk_range

DEFAULT_LOAD_CHUNK_BYTES = 64 << 20


def upload_pages(backend: Backend, pages: np.ndarray, chunk_bytes: int) -> Any:
    """Pages into one device allocation, chunk by chunk through two pinned buffers: while one
    chunk crosses the bus the next is read from the (memory-mapped) array."""
    n = pages.shape[0]
    dev = backend.alloc(max(n, 1) * PAGE_SIZE)
    if n == 0:
        return dev
    chunk = max(1, min(n, chunk_bytes // PAGE_SIZE))
    stream = backend.new_stream()
    staging = [backend.alloc_pinned(chunk * PAGE_SIZE)[: chunk * PAGE_SIZE] for _ in range(2)]
    events = [backend.new_event(), backend.new_event()]
    used = [False, False]
    for i, start in enumerate(range(0, n, chunk)):
        slot = i % 2
        if used[slot]:
            backend.event_synchronize(events[slot])  # that buffer's last copy has finished
        m = min(chunk, n - start)
        buf = staging[slot][: m * PAGE_SIZE]
        np.copyto(buf.reshape(m, PAGE_SIZE), pages[start : start + m])
        backend.h2d(dev, start * PAGE_SIZE, buf, stream)
        backend.record(events[slot], stream)
        used[slot] = True
    backend.synchronize(stream)
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
    device while the next one is read from the (memory-mapped) array."""
    n = pages.shape[0]
    first_chunk, count = chunk_range(first_page, n)
    dev = backend.alloc(max(count, 1) * SLICE_BYTES)
    if count == 0:
        return dev
    batch = max(1, min(count, chunk_bytes // SLICE_BYTES))
    stream = backend.new_stream()
    staging = [backend.alloc_pinned(batch * SLICE_BYTES)[: batch * SLICE_BYTES] for _ in range(2)]
    natural = [backend.alloc(batch * SLICE_BYTES) for _ in range(2)]
    events = [backend.new_event(), backend.new_event()]
    used = [False, False]
    grid = max(1, sm_count * 8)
    for i, c0 in enumerate(range(0, count, batch)):
        slot = i % 2
        if used[slot]:
            backend.event_synchronize(events[slot])  # that slot's copy and slicing are done
        m = min(batch, count - c0)
        buf = staging[slot][: m * SLICE_BYTES].reshape(m * SLICE_PAGES, PAGE_SIZE)
        g0 = (first_chunk + c0) * SLICE_PAGES  # global page at the batch's start
        lo, hi = max(g0 - first_page, 0), min(g0 + m * SLICE_PAGES - first_page, n)
        at = lo + first_page - g0
        buf[:at] = 0
        np.copyto(buf[at : at + hi - lo], pages[lo:hi])
        buf[at + hi - lo :] = 0
        backend.h2d(natural[slot], 0, staging[slot][: m * SLICE_BYTES], stream)
        backend.launch(
            slice_kernel, grid, SLICE_THREADS,
            (natural[slot], U64(m), backend.view(dev, c0 * SLICE_BYTES)), 0, stream,
        )
        backend.record(events[slot], stream)
        used[slot] = True
    backend.synchronize(stream)
    return dev
