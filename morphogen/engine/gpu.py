"""The GPU scan engine: the kernels of scan_kernel.cu and sliced_scan_kernel.cu, driven through
CuPy, and for packed keys (docs/packed-keys.md) those of packed_scan_kernel.cu and
sliced_packed_kernel.cu (docs/gpu.md, "Packed keys"). Public API: `GpuEngine`, the shards it
loads (`GpuShard`) and `GpuError` (the engine's failures).

Kernel design: see the comments at the top of the .cu files. The host side is spread over
small modules: one shard on the device, its loading, scans and writes (`gpu_shard`), launch
planning (`gpu_plan`, `sliced`), key records (`gpu_keys`), the CUDA operations
(`gpu_backend`), errors (`gpu_errors`), the program and its compilation (`gpu_kernels`), page
upload (`gpu_upload`), workspaces and their pool (`gpu_pool`), phase timings
(`gpu_timings`), the read-bandwidth yardstick (`gpu_bench`), table scans at any offset
(`gpu_tables`), each launch's arguments (`gpu_launch`), page writes into the device copy
(`gpu_writes`; docs/gpu.md). Here, the engine:

- `GpuEngine(...)` reads its options once, picks the layout of its shards' pages, and compiles
  the kernels, once per engine: a CuPy that imports but cannot compile (no NVRTC, no CUDA
  headers) fails there with a GpuError naming the fix, not at a scan.
- `GpuEngine.load` makes a `GpuShard` of one shard's pages on the device (gpu_shard.py).

CuPy is imported lazily (this module imports without it, and without Ray or pydantic).
"""

from __future__ import annotations

import os
import threading

import numpy as np

from morphogen.constants import KEY_FORMAT_V1, KEY_FORMATS, MAX_KEYS_PER_SCAN, PAGE_SIZE
from morphogen.engine.gpu_backend import Backend, CupyBackend
from morphogen.engine.gpu_errors import GpuError, cuda_errors
from morphogen.engine.gpu_kernels import CompiledKernels, compile_kernels
from morphogen.engine.gpu_plan import DEFAULT_KEY_GROUP_MAX, KEY_GROUP_SIZES
from morphogen.engine.gpu_pool import DEFAULT_POOL_SIZE, POOL_SIZE_ENV, clamp_pool_size
from morphogen.engine.gpu_shard import PACKED_LAYOUTS, SCAN_LAYOUTS, GpuShard
from morphogen.engine.gpu_upload import DEFAULT_LOAD_CHUNK_BYTES

__all__ = ["GpuEngine", "GpuError", "GpuShard"]

# The default layout (SCAN_LAYOUTS: gpu_shard.py) is the kernel that is best over the key counts
# a coalescing router sends: on an H100 (bench/results/scan_gpu_h100_*.csv) sliced reads within
# 3 % of fused at 1-2 queries a call, both at the card's read bandwidth, and serves 1.3x at 4,
# 2.0x at 8 and 2.3x at 32 queries a call.
DEFAULT_LAYOUT = "sliced"
LAYOUT_ENV = "MORPHOGEN_GPU_KERNEL"


class GpuEngine:
    """CuPy engine. Options (all read once, here): device; pool_size, the workspaces = scans
    in flight, each with its own stream (default MORPHOGEN_GPU_POOL_SIZE or 2, clamped to
    1..32 and to what fits the device; more than 2 rarely helps, since each launch already
    fills the device and extra ones only split its bandwidth); key_group_max (keys per block,
    one of KEY_GROUP_SIZES, fused kernel only); max_keys (keys per launch, 1..96: a call with
    more runs several launches in turn); kernel, the scan kernel and with it the device layout
    of the pages (SCAN_LAYOUTS; default MORPHOGEN_GPU_KERNEL or DEFAULT_LAYOUT). Its
    `key_formats` are v1 and, on a layout of PACKED_LAYOUTS, packed."""

    name = "gpu"

    def __init__(
        self,
        device: int = 0,
        pool_size: int | str | None = None,
        key_group_max: int = DEFAULT_KEY_GROUP_MAX,
        max_keys: int = MAX_KEYS_PER_SCAN,
        load_chunk_bytes: int = DEFAULT_LOAD_CHUNK_BYTES,
        backend: Backend | None = None,
        kernel: str | None = None,
    ) -> None:
        if kernel is None:
            kernel = os.environ.get(LAYOUT_ENV, DEFAULT_LAYOUT)
        if kernel not in SCAN_LAYOUTS:
            raise ValueError(f"kernel must be one of {SCAN_LAYOUTS}, got {kernel!r}")
        self.layout = kernel
        # the formats this engine's shards scan (engines.key_formats reads it)
        self.key_formats = KEY_FORMATS if kernel in PACKED_LAYOUTS else (KEY_FORMAT_V1,)
        if pool_size is None:
            pool_size = os.environ.get(POOL_SIZE_ENV, DEFAULT_POOL_SIZE)
        self.pool_size = clamp_pool_size(pool_size)
        if key_group_max not in KEY_GROUP_SIZES:
            raise ValueError(f"key_group_max must be one of {KEY_GROUP_SIZES}")
        if not 1 <= int(max_keys) <= MAX_KEYS_PER_SCAN:
            raise ValueError(f"max_keys must be in 1..{MAX_KEYS_PER_SCAN}")
        if load_chunk_bytes < PAGE_SIZE:
            raise ValueError(f"load_chunk_bytes must be at least {PAGE_SIZE}")
        self.key_group_max = int(key_group_max)
        self.max_keys = int(max_keys)
        self.load_chunk_bytes = int(load_chunk_bytes)
        self.backend: Backend = backend if backend is not None else CupyBackend(int(device))
        with cuda_errors(self.backend, "querying the device"):
            self.info = self.backend.device_info()
        self._compiled: CompiledKernels | None = None
        self._lock = threading.Lock()
        self._kernels()  # here, not at the first load: a GPU that cannot compile fails creation

    @property
    def device_name(self) -> str:
        return self.info.name

    def _kernels(self) -> CompiledKernels:
        with self._lock:
            if self._compiled is None:
                self._compiled = compile_kernels(self.backend)
            return self._compiled

    def load(self, pages: np.ndarray, first_page: int = 0) -> GpuShard:
        return GpuShard(self, self._kernels(), pages, int(first_page))
