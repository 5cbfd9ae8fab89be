"""The GPU engine's CUDA program: its source, the kernels in it, and their compilation.

`kernel_source()` is the one program every engine compiles (NVRTC at run time) and
`python -m morphogen.engine.nvcc_check` builds with nvcc: scan_kernel.cu, then
sliced_scan_kernel.cu. `compile_kernels` compiles the program once per engine;
`CompiledKernels` keeps the functions and caches their occupancy per shape.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from morphogen.engine.gpu_backend import Backend
from morphogen.engine.gpu_errors import TOOLKIT_HINT, GpuError, cuda_errors, one_line
from morphogen.engine.gpu_plan import REDUCE_KERNEL, SCAN_KERNELS, SCAN_THREADS
from morphogen.engine.sliced import (
    N_TILES,
    SLICE_KERNEL,
    SLICED_KERNELS,
    sliced_smem_bytes,
)

KERNEL_SOURCE = Path(__file__).with_name("scan_kernel.cu")
# The tensor-core scan; after KERNEL_SOURCE, whose PRG and DPF helpers it uses.
SLICED_KERNEL_SOURCE = Path(__file__).with_name("sliced_scan_kernel.cu")
KERNEL_SOURCES = (KERNEL_SOURCE, SLICED_KERNEL_SOURCE)
# Given to NVRTC at load and to nvcc by nvcc_check, so both compile the same program.
COMPILE_OPTIONS: tuple[str, ...] = ("-std=c++17",)

READ_BW_KERNEL = "morphogen_read_bw"
READ_BW_THREADS = 256
KERNEL_NAMES = (*SCAN_KERNELS, REDUCE_KERNEL, READ_BW_KERNEL, *SLICED_KERNELS, SLICE_KERNEL)

# Kernel scalar arguments: CuPy passes numpy scalars by their own type and does NOT check them
# against the kernel signature, so each scalar is built with the type the C side declares.
#   C type               numpy type     used for
#   unsigned int (u32)   np.uint32      num_keys, domain_bits, tile_bits, num_groups,
#                                       num_partials, row_lanes
#   unsigned long long   np.uint64      num_pages, first_page, n16
#   pointers             cupy arrays    pages, keys (uint32 records), partial, out, data, sink
U32 = np.uint32
U64 = np.uint64


def kernel_source() -> str:
    """The one CUDA program every engine compiles: KERNEL_SOURCES, concatenated."""
    return "\n".join(path.read_text() for path in KERNEL_SOURCES)


class CompiledKernels:
    """The kernels of one engine, compiled once, and their occupancy (cached per shape)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.kernels = dict(backend.compile(kernel_source(), COMPILE_OPTIONS, KERNEL_NAMES))
        for nt, name in zip(N_TILES, SLICED_KERNELS, strict=True):
            backend.set_max_dynamic_smem(self.kernels[name], sliced_smem_bytes(nt))
        self._occupancy: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def blocks_per_sm(self, name: str, smem_bytes: int) -> int:
        key = (name, smem_bytes)
        with self._lock:
            if key not in self._occupancy:
                n = self.backend.blocks_per_sm(self.kernels[name], SCAN_THREADS, smem_bytes)
                if n < 1:
                    raise GpuError(f"{name} cannot run with {smem_bytes} bytes of shared memory")
                self._occupancy[key] = n
            return self._occupancy[key]


def compile_kernels(backend: Backend) -> CompiledKernels:
    """The engine's kernels, or a GpuError that names the cause and the fix.

    Compiling is the honest availability probe: CuPy imports and sees a device without NVRTC
    or the CUDA headers, and then fails only here. CuPy reports a missing NVRTC library or
    missing headers as a plain RuntimeError (or OSError), not as one of its CUDA error types.
    """
    try:
        with cuda_errors(backend, "compiling scan_kernel.cu"):
            return CompiledKernels(backend)
    except GpuError as exc:  # NVRTC ran and refused (its log kept): mismatched headers can
        raise GpuError(f"{exc}; if the CUDA toolkit is the cause, {TOOLKIT_HINT}") from exc
    except (RuntimeError, OSError) as exc:
        raise GpuError(
            "the gpu engine cannot compile its CUDA kernels: CuPy imports and sees a device, but "
            f"NVRTC or the CUDA headers are missing ({type(exc).__name__}: {one_line(exc)}); "
            f"{TOOLKIT_HINT}"
        ) from exc
