"""Benchmark support: what the card reads of a device buffer, timed in the same run as a scan.

`GpuShard.read_pages_timed` runs this over its page buffer; bench/scan_gpu.py and
bench/gpu/reference_scale.py hold the scan's time against it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from morphogen.engine.gpu_backend import Backend
from morphogen.engine.gpu_errors import cuda_errors
from morphogen.engine.gpu_kernels import READ_BW_THREADS, U64

# Blocks per SM of the read launch: enough loads in flight to saturate HBM.
READ_BW_BLOCKS_PER_SM = 8


def read_bandwidth(
    backend: Backend, kernel: Any, data: Any, nbytes: int, sm_count: int, repeats: int = 1
) -> tuple[float, bytes]:
    """A plain read of the first `nbytes` (a multiple of 16) of device buffer `data` with the
    bandwidth kernel `kernel` (morphogen_read_bw): (best ms over `repeats`, XOR of all its
    16-byte words)."""
    n16 = nbytes // 16
    grid = sm_count * READ_BW_BLOCKS_PER_SM
    sink_bytes = grid * READ_BW_THREADS * 16
    best = math.inf
    with cuda_errors(backend, "the read benchmark"), backend.activate():
        sink = backend.alloc(sink_bytes)
        stream = backend.new_stream()
        e0, e1 = backend.new_event(), backend.new_event()
        for _ in range(max(1, repeats)):
            backend.record(e0, stream)
            backend.launch(kernel, grid, READ_BW_THREADS, (data, U64(n16), sink), 0, stream)
            backend.record(e1, stream)
            backend.synchronize(stream)
            best = min(best, backend.elapsed_ms(e0, e1))
        host = backend.alloc_pinned(sink_bytes)[:sink_bytes]
        backend.d2h(host, sink, 0, stream)
        backend.synchronize(stream)
    folded = np.bitwise_xor.reduce(host.view(np.uint64).reshape(-1, 2), axis=0)
    return best, folded.tobytes()
