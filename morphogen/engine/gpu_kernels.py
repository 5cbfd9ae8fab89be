"""The GPU engine's CUDA program: its source, the kernels in it, and their compilation.

`kernel_source()` is the one program every engine compiles (NVRTC at run time) and
`python -m morphogen.engine.nvcc_check` builds with nvcc: generated `#define` lines carrying the
geometry that Python owns (`KERNEL_DEFINES`, from morphogen/constants.py, gpu_plan.py,
gpu_keys.py and sliced.py), then scan_kernel.cu and sliced_scan_kernel.cu. The .cu files define
none of those numbers themselves and refuse to compile without them, so the host's planning and
the kernels' indexing have one source. `compile_kernels` compiles the program once per engine;
`CompiledKernels` keeps the functions and caches their occupancy per shape.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

import numpy as np

from morphogen.engine.gpu_backend import Backend
from morphogen.engine.gpu_errors import TOOLKIT_HINT, GpuError, cuda_errors, one_line
from morphogen.engine.gpu_keys import KEY_HEADER_WORDS
from morphogen.engine.gpu_plan import (
    LANES_PER_PAGE,
    LANES_PER_THREAD,
    MAX_TILE_BITS,
    PACKED_KERNELS,
    PATH_SLOTS,
    REDUCE_KERNEL,
    REDUCE_LANES,
    REDUCE_SLICES,
    SCAN_KERNELS,
    SCAN_THREADS,
)
from morphogen.engine.sliced import (
    MT_STRIDE,
    SLICE_KERNEL,
    SLICE_PAGES,
    SLICE_THREADS,
    SLICE_U4,
    SLICED_FOLD_IMAD,
    SLICED_KERNELS,
    SLICED_PACKED_KERNELS,
    SLICED_PREFETCH_BULK,
    SLICED_PREFETCH_ROUNDS,
    SLICED_THREADS,
    SLICED_TILE_BITS,
    SLICED_TREE_SLOTS,
    SLICED_TUNING,
    SLICED_VARIANTS,
    TABLE_KERNELS,
    sliced_packed_smem_bytes,
    sliced_smem_bytes,
)

KERNEL_SOURCE = Path(__file__).with_name("scan_kernel.cu")
# The tensor-core scan; after KERNEL_SOURCE, whose PRG and DPF helpers it uses.
SLICED_KERNEL_SOURCE = Path(__file__).with_name("sliced_scan_kernel.cu")
# The table scan; after SLICED_KERNEL_SOURCE, whose scan body it instantiates.
TABLE_KERNEL_SOURCE = Path(__file__).with_name("sliced_table_kernel.cu")
# Page updates into the device copy (gpu_writes.py); after the others, whose types it uses.
PATCH_KERNEL_SOURCE = Path(__file__).with_name("patch_kernel.cu")
# The packed-key scans (docs/packed-keys.md): the fused layout's, after KERNEL_SOURCE whose
# helpers it uses, and the sliced layout's, after SLICED_KERNEL_SOURCE. Appended last, so the
# v1 kernels' code is what it was.
PACKED_KERNEL_SOURCE = Path(__file__).with_name("packed_scan_kernel.cu")
SLICED_PACKED_KERNEL_SOURCE = Path(__file__).with_name("sliced_packed_kernel.cu")
KERNEL_SOURCES = (KERNEL_SOURCE, SLICED_KERNEL_SOURCE, TABLE_KERNEL_SOURCE, PATCH_KERNEL_SOURCE,
                  PACKED_KERNEL_SOURCE, SLICED_PACKED_KERNEL_SOURCE)
# Given to NVRTC at load and to nvcc by nvcc_check, so both compile the same program.
COMPILE_OPTIONS: tuple[str, ...] = ("-std=c++17",)

READ_BW_KERNEL = "morphogen_read_bw"
READ_BW_THREADS = 256
PATCH_KERNELS = ("morphogen_patch_pages", "morphogen_patch_sliced")
KERNEL_NAMES = (*SCAN_KERNELS, REDUCE_KERNEL, READ_BW_KERNEL, *SLICED_KERNELS, SLICE_KERNEL,
                *TABLE_KERNELS, *PATCH_KERNELS, *PACKED_KERNELS, *SLICED_PACKED_KERNELS)
# The kernels of the sliced layout's block size (SLICED_THREADS).
SLICED_BLOCK_KERNELS = (*SLICED_KERNELS, *TABLE_KERNELS, *SLICED_PACKED_KERNELS)

# The numbers the CUDA source takes from Python, as `#define NAME value` (plain decimal ints,
# so each expands to the int literal the kernels were written against).
KERNEL_DEFINES = MappingProxyType({
    # scan_kernel.cu
    "SCAN_THREADS": SCAN_THREADS,
    "LANES_PER_PAGE": LANES_PER_PAGE,
    "LANES_PER_THREAD": LANES_PER_THREAD,
    "KEY_HEADER_WORDS": KEY_HEADER_WORDS,
    "MAX_TILE_BITS": MAX_TILE_BITS,
    "PATH_SLOTS": PATH_SLOTS,
    "REDUCE_LANES": REDUCE_LANES,
    "REDUCE_SLICES": REDUCE_SLICES,
    "READ_BW_THREADS": READ_BW_THREADS,
    # sliced_scan_kernel.cu
    "SLICE_PAGES": SLICE_PAGES,
    "SLICE_U4": SLICE_U4,
    "SLICE_THREADS": SLICE_THREADS,
    "SLICED_THREADS": SLICED_THREADS,
    "SLICED_TILE_BITS": SLICED_TILE_BITS,
    "SLICED_TREE_SLOTS": SLICED_TREE_SLOTS,
    "MT_STRIDE": MT_STRIDE,
    # tuning switches (sliced.SLICED_TUNING): speed only, overridable per run
    "SLICED_FOLD_IMAD": SLICED_FOLD_IMAD,
    "SLICED_PREFETCH_ROUNDS": SLICED_PREFETCH_ROUNDS,
    "SLICED_PREFETCH_BULK": SLICED_PREFETCH_BULK,
})
# "NAME=VALUE,..." over the tuning switches, for a benchmark or a test of one combination.
TUNING_ENV = "MORPHOGEN_GPU_TUNING"

# Kernel scalar arguments: CuPy passes numpy scalars by their own type and does NOT check them
# against the kernel signature, so each scalar is built with the type the C side declares.
#   C type               numpy type     used for
#   unsigned int (u32)   np.uint32      num_keys, domain_bits, levels, tile_bits, num_groups,
#                                       num_partials, row_lanes
#   unsigned long long   np.uint64      num_pages, first_page, n16
#   pointers             cupy arrays    pages, keys (uint32 records), partial, out, data, sink
U32 = np.uint32
U64 = np.uint64


def parse_tuning(text: str) -> dict[str, int]:
    """`NAME=VALUE,...` (the TUNING_ENV format) as overrides, each checked against its values."""
    out: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in SLICED_TUNING:
            raise ValueError(f"{TUNING_ENV}: {item!r} is not NAME=VALUE with NAME one of "
                             f"{', '.join(SLICED_TUNING)}")
        try:
            number = int(value)
        except ValueError:
            raise ValueError(f"{TUNING_ENV}: {name} needs an integer, got {value!r}") from None
        if number not in SLICED_TUNING[name]:
            allowed = SLICED_TUNING[name]
            raise ValueError(f"{TUNING_ENV}: {name} must be in {allowed[0]}..{allowed[-1]}, "
                             f"got {number}")
        out[name] = number
    return out


def kernel_tuning(overrides: Mapping[str, int] | None = None) -> dict[str, int]:
    """The tuning switches a program is built with: the defaults, then TUNING_ENV, then
    `overrides` (checked as the environment's are)."""
    tuning = {name: int(KERNEL_DEFINES[name]) for name in SLICED_TUNING}
    tuning.update(parse_tuning(os.environ.get(TUNING_ENV, "")))
    if overrides:
        tuning.update(parse_tuning(",".join(f"{k}={v}" for k, v in overrides.items())))
    return tuning


def kernel_defines(overrides: Mapping[str, int] | None = None) -> str:
    """KERNEL_DEFINES, with the tuning of kernel_tuning(overrides), as the `#define` lines that
    open the generated program."""
    values = {**KERNEL_DEFINES, **kernel_tuning(overrides)}
    return "".join(f"#define {name} {int(value)}\n" for name, value in values.items())


def kernel_source(
    files: Iterable[Path] = KERNEL_SOURCES, tuning: Mapping[str, int] | None = None
) -> str:
    """The CUDA program: the generated #defines, then `files` (default: every .cu file)."""
    head = (
        "// Generated by morphogen.engine.gpu_kernels.kernel_source(): the kernels' geometry,\n"
        "// defined in Python, then the .cu files.\n"
    )
    return head + kernel_defines(tuning) + "\n".join(path.read_text() for path in files)


class CompiledKernels:
    """The kernels of one engine, compiled once, and their occupancy (cached per shape)."""

    def __init__(self, backend: Backend, tuning: Mapping[str, int] | None = None) -> None:
        self.backend = backend
        self.tuning = kernel_tuning(tuning)
        source = kernel_source(tuning=self.tuning)
        self.kernels = dict(backend.compile(source, COMPILE_OPTIONS, KERNEL_NAMES))
        for (nt, _), name in zip(SLICED_VARIANTS, SLICED_KERNELS, strict=True):
            backend.set_max_dynamic_smem(self.kernels[name], sliced_smem_bytes(nt))
        for (nt, _), name in zip(SLICED_VARIANTS, TABLE_KERNELS, strict=True):
            backend.set_max_dynamic_smem(self.kernels[name], sliced_smem_bytes(nt, table=True))
        for (nt, _), name in zip(SLICED_VARIANTS, SLICED_PACKED_KERNELS, strict=True):
            backend.set_max_dynamic_smem(self.kernels[name], sliced_packed_smem_bytes(nt))
        self._occupancy: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def blocks_per_sm(self, name: str, smem_bytes: int) -> int:
        """Resident blocks per SM of scan kernel `name`, launched with its own block size and
        `smem_bytes` of dynamic shared memory."""
        key = (name, smem_bytes)
        threads = SLICED_THREADS if name in SLICED_BLOCK_KERNELS else SCAN_THREADS
        with self._lock:
            if key not in self._occupancy:
                n = self.backend.blocks_per_sm(self.kernels[name], threads, smem_bytes)
                if n < 1:
                    raise GpuError(f"{name} cannot run with {smem_bytes} bytes of shared memory")
                self._occupancy[key] = n
            return self._occupancy[key]


def compile_kernels(backend: Backend, tuning: Mapping[str, int] | None = None) -> CompiledKernels:
    """The engine's kernels, or a GpuError that names the cause and the fix.

    Compiling is the honest availability probe: CuPy imports and sees a device without NVRTC
    or the CUDA headers, and then fails only here. CuPy reports a missing NVRTC library or
    missing headers as a plain RuntimeError (or OSError), not as one of its CUDA error types.
    """
    try:
        with cuda_errors(backend, "compiling scan_kernel.cu"):
            return CompiledKernels(backend, tuning)
    except GpuError as exc:  # NVRTC ran and refused (its log kept): mismatched headers can
        raise GpuError(f"{exc}; if the CUDA toolkit is the cause, {TOOLKIT_HINT}") from exc
    except (RuntimeError, OSError) as exc:
        raise GpuError(
            "the gpu engine cannot compile its CUDA kernels: CuPy imports and sees a device, but "
            f"NVRTC or the CUDA headers are missing ({type(exc).__name__}: {one_line(exc)}); "
            f"{TOOLKIT_HINT}"
        ) from exc
