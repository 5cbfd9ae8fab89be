"""The GPU scan engine: the fused kernel of `scan_kernel.cu`, driven through CuPy.

Kernel design: see the comment at the top of `scan_kernel.cu`. This module is the host side:

- `GpuEngine(...)` compiles the kernels, once per engine: a CuPy that imports but cannot
  compile (no NVRTC, no CUDA headers) fails there with a GpuError naming the fix, not at a scan.
- `GpuEngine.load` uploads one shard's pages into ONE device allocation, chunk by chunk from
  the (memory-mapped) array through two pinned staging buffers, so host memory stays bounded;
  it warms every kernel variant before returning.
- `GpuShard.scan` packs keys into the kernel's flat record layout (`pack_keys`, from the same
  `KeyBatch` the CPU engine uses), plans the launch (`plan_launch`) and runs it on a workspace
  from a bounded pool. Each workspace owns its own non-blocking stream, pinned host buffers
  and device buffers, so concurrent scans overlap instead of queueing on one lock. The pool
  size is the number of launches in flight: every launch is a full pass over the pages, so
  two side by side already keep the device busy (one runs while the next is packed and
  copied). Callers beyond that wait and are coalesced into one launch (up to 96 keys): a
  pass costs about the same for 3 keys as for 24, so merging is where concurrency pays.
- CUDA, NVRTC and allocation errors surface as `GpuError`; `scan_timed` also returns the
  h2d / kernel / d2h times measured with CUDA events (what they include: `PhaseTimings`).

CuPy is imported lazily (this module imports without it). Everything that touches CUDA goes
through the small `Backend` protocol, so the pool, the dispatch and the packing are tested on
machines without a GPU against a fake backend (tests/unit/test_gpu_host.py).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from morphogen.constants import MAX_DOMAIN_BITS, MAX_KEYS_PER_SCAN, PAGE_SIZE
from morphogen.dpf import DpfKey, KeyBatch, as_batch
from morphogen.engine.base import EngineUnavailable, check_domain, check_pages
from morphogen.engine.sliced import (
    N_TILES,
    SLICE_BYTES,
    SLICE_KERNEL,
    SLICE_PAGES,
    SLICE_THREADS,
    SLICED_KERNELS,
    SLICED_THREADS,
    SlicedPlan,
    chunk_range,
    plan_sliced_launch,
    sliced_smem_bytes,
)

log = logging.getLogger(__name__)

KERNEL_SOURCE = Path(__file__).with_name("scan_kernel.cu")
# The tensor-core scan; appended to KERNEL_SOURCE, whose PRG and DPF helpers it uses.
SLICED_KERNEL_SOURCE = Path(__file__).with_name("sliced_scan_kernel.cu")
KERNEL_SOURCES = (KERNEL_SOURCE, SLICED_KERNEL_SOURCE)
# Given to NVRTC at load and to nvcc by nvcc_check, so both compile the same program.
COMPILE_OPTIONS: tuple[str, ...] = ("-std=c++17",)

# Mirrors of scan_kernel.cu's #defines: the launch geometry must match the kernel's.
SCAN_THREADS = 128
LANES_PER_PAGE = PAGE_SIZE // 16
KEY_HEADER_WORDS = 12
MAX_TILE_BITS = 10
PATH_SLOTS = 33
REDUCE_LANES = 16
REDUCE_SLICES = 16
READ_BW_THREADS = 256
KEY_GROUP_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
SCAN_KERNELS = tuple(f"morphogen_scan_k{kg}" for kg in KEY_GROUP_SIZES)
REDUCE_KERNEL = "morphogen_xor_reduce"
READ_BW_KERNEL = "morphogen_read_bw"
KERNEL_NAMES = (*SCAN_KERNELS, REDUCE_KERNEL, READ_BW_KERNEL, *SLICED_KERNELS, SLICE_KERNEL)
# Scan kernels: "fused" (scan_kernel.cu, pages as stored, integer AND-XOR) or "sliced"
# (sliced_scan_kernel.cu, pages bit-sliced at load, tensor-core AND-popc).
SCAN_LAYOUTS = ("fused", "sliced")
DEFAULT_LAYOUT = "fused"
LAYOUT_ENV = "MORPHOGEN_GPU_KERNEL"

# Dynamic shared memory a scan block may use without an opt-in attribute; tiles are sized to it.
SMEM_BUDGET = 48 * 1024
DEFAULT_KEY_GROUP_MAX = 16
# A page block shorter than this spends more on its tile expansions than on its pages.
MIN_PAGES_PER_BLOCK = 64

DEFAULT_POOL_SIZE = 2
MAX_POOL_SIZE = 32
POOL_SIZE_ENV = "MORPHOGEN_GPU_POOL_SIZE"
DEFAULT_LOAD_CHUNK_BYTES = 64 << 20
# Device memory left free after the pages and workspaces (CuPy, the driver, other kernels).
DEVICE_RESERVE_BYTES = 256 << 20

# Kernel scalar arguments: CuPy passes numpy scalars by their own type and does NOT check them
# against the kernel signature, so each scalar is built with the type the C side declares.
#   C type               numpy type     used for
#   unsigned int (u32)   np.uint32      num_keys, domain_bits, tile_bits, num_groups,
#                                       num_partials, row_lanes
#   unsigned long long   np.uint64      num_pages, first_page, n16
#   pointers             cupy arrays    pages, keys (uint32 records), partial, out, data, sink
_U32 = np.uint32
_U64 = np.uint64


class GpuError(RuntimeError):
    """A CUDA, NVRTC or device-memory failure, with the driver's message."""


# The fix for kernels that do not compile: the CuPy wheel for the driver's CUDA major version
# with its [ctk] extra, the toolkit wheels that RawModule needs (pyproject's gpu-cuda* extras).
TOOLKIT_HINT = (
    "install the CuPy that matches the driver (the CUDA Version nvidia-smi prints) with the CUDA "
    "toolkit wheels: pip install 'morphogen[gpu-cuda12]' for 12.x or 'morphogen[gpu-cuda13]' "
    "for 13.x, after pip uninstall of any other cupy-cuda* wheel; or set CUDA_PATH to a local "
    "CUDA toolkit"
)


def kernel_source() -> str:
    """The one CUDA program every engine compiles: KERNEL_SOURCES, concatenated."""
    return "\n".join(path.read_text() for path in KERNEL_SOURCES)


# ---------------------------------------------------------------------------------------------
# Key records and launch planning (pure functions, shared with the tests and the benchmark)


def key_words(domain_bits: int) -> int:
    """u32 words of one key record in the kernel's layout."""
    return KEY_HEADER_WORDS + 4 * domain_bits


def pack_keys(batch: KeyBatch, out: np.ndarray | None = None) -> np.ndarray:
    """The batch as (K, key_words(d)) uint32 records, the layout scan_kernel.cu reads.

    [0:4] root seed, [4:8] final_cw, [8] root_t, [9] tcw_left bits (bit i = level i),
    [10] tcw_right bits, [11] 0, [12 + 4i : 16 + 4i] cw[i]. `out`, when given, is a flat
    uint32 buffer (a pinned one) that receives the records and backs the returned view.
    """
    k, d = len(batch), batch.domain_bits
    w = key_words(d)
    if out is None:
        rec = np.empty((k, w), np.uint32)
    else:
        if out.dtype != np.uint32 or out.size < k * w:
            raise ValueError(f"key buffer needs {k * w} uint32 words")
        rec = out[: k * w].reshape(k, w)
    rec[:, 0:4] = batch.root_seed
    rec[:, 4:8] = batch.final_cw
    rec[:, 8] = batch.root_t
    bits = np.left_shift(np.uint32(1), np.arange(d, dtype=np.uint32))
    rec[:, 9] = np.bitwise_or.reduce(batch.tcw[:, :, 0].astype(np.uint32) * bits, axis=1)
    rec[:, 10] = np.bitwise_or.reduce(batch.tcw[:, :, 1].astype(np.uint32) * bits, axis=1)
    rec[:, 11] = 0
    rec[:, KEY_HEADER_WORDS:] = batch.cw.reshape(k, 4 * d)
    return rec


def scan_smem_bytes(key_group: int, tile_bits: int) -> int:
    """Dynamic shared memory of one scan block (masks, path seeds and their control bits)."""
    return key_group * 17 * ((1 << tile_bits) + PATH_SLOTS)


def choose_key_group(num_keys: int, key_group_max: int) -> tuple[int, int]:
    """(keys per block, key groups): as few groups as the cap allows, evenly filled."""
    if num_keys < 1:
        raise ValueError("a launch needs at least one key")
    groups = -(-num_keys // key_group_max)
    per_group = -(-num_keys // groups)
    kg = min(s for s in KEY_GROUP_SIZES if s >= per_group)
    return kg, groups


def choose_tile_bits(key_group: int, domain_bits: int, smem_budget: int = SMEM_BUDGET) -> int:
    """The largest tile (2^h pages, h <= d) whose shared memory fits the budget."""
    h = min(MAX_TILE_BITS, domain_bits)
    while h > 1 and scan_smem_bytes(key_group, h) > smem_budget:
        h -= 1
    return h


@dataclass(frozen=True)
class LaunchPlan:
    """One fused launch: `grid` blocks of SCAN_THREADS, then one reduce launch."""

    kernel: str
    num_keys: int
    key_group: int
    num_groups: int
    page_blocks: int
    tile_bits: int
    smem_bytes: int

    @property
    def grid(self) -> int:
        return self.num_groups * self.page_blocks

    @property
    def partial_bytes(self) -> int:
        return self.page_blocks * self.num_keys * PAGE_SIZE

    @property
    def reduce_grid(self) -> int:
        return reduce_grid(self.num_keys)


def reduce_grid(num_keys: int) -> int:
    """Blocks of the reduce launch that folds the partial rows of `num_keys` keys (either scan
    layout writes the same partial rows)."""
    return -(-num_keys * LANES_PER_PAGE // REDUCE_LANES)


def plan_launch(
    num_keys: int,
    num_pages: int,
    domain_bits: int,
    *,
    sm_count: int,
    blocks_per_sm: Callable[[str, int], int],
    key_group_max: int = DEFAULT_KEY_GROUP_MAX,
    max_partial_rows: int | None = None,
    page_blocks: int | None = None,
) -> LaunchPlan:
    """Grid shape for `num_keys` keys over `num_pages` pages.

    One wave of resident blocks (`sm_count * blocks_per_sm(kernel, smem)`) split between the
    key groups; each block then streams a contiguous page range (persistent blocks keep the
    accumulators in registers, and the per-block partials stay few). `max_partial_rows`
    bounds page_blocks * num_keys to the workspace's partial buffer; `page_blocks` overrides
    the choice (tests use it to exercise many blocks on few pages).
    """
    if not 1 <= domain_bits <= MAX_DOMAIN_BITS:
        raise ValueError(f"domain bits must be in 1..{MAX_DOMAIN_BITS}, got {domain_bits}")
    if num_pages < 1:
        raise ValueError("a launch needs at least one page")
    if key_group_max not in KEY_GROUP_SIZES:
        raise ValueError(f"key_group_max must be one of {KEY_GROUP_SIZES}, got {key_group_max}")
    kg, groups = choose_key_group(num_keys, key_group_max)
    h = choose_tile_bits(kg, domain_bits)
    smem = scan_smem_bytes(kg, h)
    kernel = f"morphogen_scan_k{kg}"
    if page_blocks is None:
        resident = sm_count * max(1, int(blocks_per_sm(kernel, smem)))
        page_blocks = max(1, resident // groups)
        page_blocks = min(page_blocks, max(1, -(-num_pages // MIN_PAGES_PER_BLOCK)))
    if max_partial_rows is not None:
        page_blocks = min(page_blocks, max(1, max_partial_rows // num_keys))
    if page_blocks < 1:
        raise ValueError("page_blocks must be at least 1")
    return LaunchPlan(kernel, num_keys, kg, groups, page_blocks, h, smem)


def clamp_pool_size(value: object) -> int:
    """A pool size from configuration: an integer, clamped to 1..MAX_POOL_SIZE."""
    if isinstance(value, bool):
        raise TypeError("pool_size must be an integer, got a bool")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ValueError(f"pool_size must be an integer, got {value!r}") from None
    if not isinstance(value, int | np.integer):
        raise TypeError(f"pool_size must be an integer, got {type(value).__name__}")
    size = int(value)
    clamped = min(max(size, 1), MAX_POOL_SIZE)
    if clamped != size:
        log.warning("gpu pool_size %d clamped to %d (range 1..%d)", size, clamped, MAX_POOL_SIZE)
    return clamped


@dataclass(frozen=True)
class PhaseTimings:
    """Where one scan call's time went, summed over the launches that served the call (a launch
    may also have carried other callers' keys).

    The device phases are CUDA-event times on each launch's workspace stream (`_launch`):
    e0, key copy, e1, scan and reduce, e2, answer copy, e3. Events on one stream time that
    stream's timeline, not its work alone: a phase also holds any time its work waited for the
    device. kernel_ms (e1 -> e2) starts once the keys are on the device and ends when the reduce
    has finished. A scan grid fills every SM, so while another workspace's kernels run, this
    launch's scan waits for them, and that wait is inside kernel_ms: events cannot tell the two
    apart (the kernel's start is not observable on the stream). `shared_launches` says which
    number to trust: it counts the launches that had another launch of the same shard in flight
    at some moment between taking their workspace and getting their answers back. With 0,
    kernel_ms is the kernels' own time (plus the few microseconds the host takes to submit the
    two launches); otherwise it is an upper bound that may include queueing. h2d_ms and d2h_ms
    may likewise include waiting for a copy engine busy with another workspace's copy.
    """

    h2d_ms: float
    kernel_ms: float
    d2h_ms: float
    wait_ms: float  # host time from submission until a workspace took the keys
    total_ms: float  # host wall time of the call
    launches: int
    launch_keys: int  # keys in those launches, this call's and any coalesced with them
    shared_launches: int = 0  # launches that overlapped another launch: see above


# ---------------------------------------------------------------------------------------------
# Backend: the few CUDA operations the engine needs; CuPy in production, fakes in tests.


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    sm_count: int
    total_memory: int


class Backend(Protocol):
    """What the engine needs from CUDA. Device buffers are opaque; host buffers are numpy."""

    error_types: tuple[type[BaseException], ...]

    def device_info(self) -> DeviceInfo: ...

    def free_memory(self) -> int: ...

    def activate(self) -> contextlib.AbstractContextManager[Any]: ...

    def compile(self, source: str, options: Sequence[str], names: Sequence[str]) -> Mapping[
        str, Any
    ]: ...

    def blocks_per_sm(self, kernel: Any, block: int, smem_bytes: int) -> int: ...

    def set_max_dynamic_smem(self, kernel: Any, nbytes: int) -> None: ...

    def view(self, buf: Any, offset: int) -> Any: ...

    def alloc(self, nbytes: int) -> Any: ...

    def alloc_pinned(self, nbytes: int) -> np.ndarray: ...

    def new_stream(self) -> Any: ...

    def new_event(self) -> Any: ...

    def h2d(self, dst: Any, dst_offset: int, src: np.ndarray, stream: Any) -> None: ...

    def d2h(self, dst: np.ndarray, src: Any, src_offset: int, stream: Any) -> None: ...

    def launch(
        self, kernel: Any, grid: int, block: int, args: tuple[Any, ...], smem_bytes: int,
        stream: Any,
    ) -> None: ...

    def record(self, event: Any, stream: Any) -> None: ...

    def event_synchronize(self, event: Any) -> None: ...

    def synchronize(self, stream: Any) -> None: ...

    def elapsed_ms(self, start: Any, end: Any) -> float: ...


class _CupyBackend:
    """The Backend on CuPy: plain cudaMalloc allocations, NVRTC-compiled RawModule."""

    def __init__(self, device: int) -> None:
        try:
            import cupy
        except Exception as exc:  # ImportError, or a CuPy that cannot find its CUDA libraries
            raise EngineUnavailable(f"the gpu engine needs CuPy: {exc}") from exc
        self._cp = cupy
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:
            raise EngineUnavailable(f"no CUDA device is usable: {exc}") from exc
        if not 0 <= device < count:
            raise EngineUnavailable(f"CUDA device {device} requested, {count} present")
        self._device = device
        self.error_types = (
            cupy.cuda.runtime.CUDARuntimeError,
            cupy.cuda.driver.CUDADriverError,
            cupy.cuda.compiler.CompileException,
            cupy.cuda.memory.OutOfMemoryError,
        )

    def device_info(self) -> DeviceInfo:
        props = self._cp.cuda.runtime.getDeviceProperties(self._device)
        name = props["name"]
        return DeviceInfo(
            name=name.decode() if isinstance(name, bytes) else str(name),
            sm_count=int(props["multiProcessorCount"]),
            total_memory=int(props["totalGlobalMem"]),
        )

    def free_memory(self) -> int:
        with self.activate():
            return int(self._cp.cuda.runtime.memGetInfo()[0])

    def activate(self) -> contextlib.AbstractContextManager[Any]:
        return self._cp.cuda.Device(self._device)

    def compile(self, source: str, options: Sequence[str], names: Sequence[str]) -> dict[str, Any]:
        with self.activate():
            module = self._cp.RawModule(code=source, options=tuple(options), backend="nvrtc")
            kernels = {name: module.get_function(name) for name in names}
            for k in kernels.values():
                _ = k.kernel  # compiles the module (once) and loads each function now
            return kernels

    def blocks_per_sm(self, kernel: Any, block: int, smem_bytes: int) -> int:
        with self.activate():
            return int(
                self._cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                    kernel.kernel.ptr, block, smem_bytes
                )
            )

    def set_max_dynamic_smem(self, kernel: Any, nbytes: int) -> None:
        # above 48 KiB a kernel must opt in (cudaFuncAttributeMaxDynamicSharedMemorySize)
        with self.activate():
            kernel.max_dynamic_shared_size_bytes = int(nbytes)

    def view(self, buf: Any, offset: int) -> Any:
        return buf[int(offset) :]

    def alloc(self, nbytes: int) -> Any:
        cp = self._cp
        with self.activate():
            # a plain cudaMalloc, outside CuPy's pool: the pages are one long-lived block and
            # must go back to the driver when the shard closes
            mem = cp.cuda.Memory(max(int(nbytes), 16))
            return cp.ndarray((max(int(nbytes), 16),), cp.uint8, cp.cuda.MemoryPointer(mem, 0))

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        mem = self._cp.cuda.alloc_pinned_memory(max(int(nbytes), 16))
        return np.frombuffer(mem, np.uint8, max(int(nbytes), 16))

    def new_stream(self) -> Any:
        with self.activate():
            return self._cp.cuda.Stream(non_blocking=True)

    def new_event(self) -> Any:
        with self.activate():
            return self._cp.cuda.Event()

    def h2d(self, dst: Any, dst_offset: int, src: np.ndarray, stream: Any) -> None:
        rt = self._cp.cuda.runtime
        rt.memcpyAsync(
            dst.data.ptr + dst_offset, src.ctypes.data, src.nbytes, rt.memcpyHostToDevice,
            stream.ptr,
        )

    def d2h(self, dst: np.ndarray, src: Any, src_offset: int, stream: Any) -> None:
        rt = self._cp.cuda.runtime
        rt.memcpyAsync(
            dst.ctypes.data, src.data.ptr + src_offset, dst.nbytes, rt.memcpyDeviceToHost,
            stream.ptr,
        )

    def launch(
        self, kernel: Any, grid: int, block: int, args: tuple[Any, ...], smem_bytes: int,
        stream: Any,
    ) -> None:
        with stream:
            kernel((grid,), (block,), args, shared_mem=smem_bytes)

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def event_synchronize(self, event: Any) -> None:
        event.synchronize()

    def synchronize(self, stream: Any) -> None:
        stream.synchronize()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self._cp.cuda.get_elapsed_time(start, end))


# ---------------------------------------------------------------------------------------------
# Workspaces and the dispatcher that shares them between concurrent callers


class _Workspace:
    """Everything one launch needs, owned by one launch at a time: its own stream (so that
    launches of different workspaces overlap), pinned host buffers and device buffers."""

    def __init__(self, backend: Backend, index: int, max_keys: int, partial_rows: int) -> None:
        self.index = index
        self.max_keys = max_keys
        self.partial_rows = partial_rows
        key_bytes = max_keys * key_words(MAX_DOMAIN_BITS) * 4
        self.stream = backend.new_stream()
        self.keys_host = backend.alloc_pinned(key_bytes)[:key_bytes].view(np.uint32)
        self.keys_dev = backend.alloc(key_bytes)
        self.partial_dev = backend.alloc(partial_rows * PAGE_SIZE)
        self.out_dev = backend.alloc(max_keys * PAGE_SIZE)
        self.out_host = backend.alloc_pinned(max_keys * PAGE_SIZE)[: max_keys * PAGE_SIZE]
        self.events = tuple(backend.new_event() for _ in range(4))

    @staticmethod
    def device_bytes(max_keys: int, partial_rows: int) -> int:
        return max_keys * (key_words(MAX_DOMAIN_BITS) * 4 + PAGE_SIZE) + partial_rows * PAGE_SIZE


class _Request:
    """Up to max_keys keys of one caller, waiting for a launch."""

    __slots__ = ("batch", "submitted", "started", "result", "timings", "shared", "error", "done")

    def __init__(self, batch: KeyBatch) -> None:
        self.batch = batch
        self.submitted = time.perf_counter()
        self.started = 0.0
        self.result: np.ndarray | None = None
        self.timings: tuple[float, float, float, int] | None = None
        self.shared = False  # another launch was in flight during this one (PhaseTimings)
        self.error: BaseException | None = None
        self.done = False


class _Launch:
    """One launch in flight, for PhaseTimings.shared_launches."""

    __slots__ = ("shared",)

    def __init__(self, shared: bool) -> None:
        self.shared = shared


class _Dispatcher:
    """Shares a bounded set of workspaces between threads.

    A caller queues its requests, then either waits or, when a workspace is free, takes it
    together with as many queued requests (its own or other callers', first come first served,
    one domain, at most `max_keys` keys) as fit one launch, runs that launch and hands the
    results out. Nobody holds a lock while a launch runs, so W workspaces give W launches in
    flight, each on its own stream.
    """

    def __init__(
        self,
        workspaces: Sequence[Any],
        execute: Callable[[Any, list[_Request]], None],
        *,
        max_keys: int,
        coalesce: bool,
    ) -> None:
        if not workspaces:
            raise ValueError("the dispatcher needs at least one workspace")
        self._free = list(workspaces)
        self._size = len(workspaces)
        self._execute = execute
        self._max_keys = max_keys
        self._coalesce = coalesce
        self._pending: deque[_Request] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._in_flight: set[_Launch] = set()

    @property
    def size(self) -> int:
        return self._size

    def run(self, requests: Sequence[_Request]) -> None:
        """Blocks until every request is done (its result or its error set)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the shard is closed")
            self._pending.extend(requests)
        while True:
            with self._cond:
                while not all(r.done for r in requests) and not (self._free and self._pending):
                    self._cond.wait()
                if all(r.done for r in requests):
                    return
                ws = self._free.pop()
                group = self._take_locked()
                launch = _Launch(shared=bool(self._in_flight))
                for other in self._in_flight:
                    other.shared = True
                self._in_flight.add(launch)
            now = time.perf_counter()
            for r in group:
                r.started = now
            try:
                self._execute(ws, group)
            except BaseException as exc:  # handed to each caller; never lost in this thread
                for r in group:
                    r.error = exc
            finally:
                with self._cond:
                    self._in_flight.discard(launch)
                    for r in group:
                        r.shared = launch.shared
                        r.done = True
                    self._free.append(ws)
                    self._cond.notify_all()

    def _take_locked(self) -> list[_Request]:
        head = self._pending.popleft()
        group, keys = [head], len(head.batch)
        if self._coalesce:
            rest: deque[_Request] = deque()
            while self._pending:
                r = self._pending.popleft()
                n = len(r.batch)
                if r.batch.domain_bits == head.batch.domain_bits and keys + n <= self._max_keys:
                    group.append(r)
                    keys += n
                else:
                    rest.append(r)
            self._pending = rest
        return group

    def close(self) -> list[Any]:
        """Waits for the launches in flight, fails the requests still queued (their callers
        get RuntimeError) and returns the workspaces, no longer lent."""
        with self._cond:
            self._closed = True
            while len(self._free) < self._size:
                self._cond.wait()
            free, self._free = self._free, []
            while self._pending:
                r = self._pending.popleft()
                r.error = RuntimeError("the shard was closed before this scan ran")
                r.done = True
            self._cond.notify_all()
            return free


# ---------------------------------------------------------------------------------------------
# The engine


class _Compiled:
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


class GpuShard:
    """One shard's pages on the device; `scan` is thread-safe."""

    def __init__(
        self,
        engine: GpuEngine,
        compiled: _Compiled,
        pages: np.ndarray,
        first_page: int,
    ) -> None:
        pages = check_pages(pages)
        if first_page < 0:
            raise ValueError("first_page must be >= 0")
        self.num_pages = int(pages.shape[0])
        self.first_page = int(first_page)
        if self.first_page + self.num_pages > 1 << MAX_DOMAIN_BITS:
            raise ValueError(f"pages beyond 2^{MAX_DOMAIN_BITS} cannot be addressed")
        self._backend = engine.backend
        self._compiled = compiled
        self._info = engine.info
        self._key_group_max = engine.key_group_max
        self._max_keys = engine.max_keys
        self.layout = engine.layout
        self._first_chunk, self._num_chunks = chunk_range(self.first_page, self.num_pages)
        self._partial_rows: int | None = None
        self._closed = False
        backend = self._backend
        with _cuda_errors(backend, "loading the pages"):
            with backend.activate():
                if self.layout == "sliced":
                    self._pages_dev = _upload_sliced(
                        backend, pages, self.first_page, engine.load_chunk_bytes,
                        compiled.kernels[SLICE_KERNEL], self._info.sm_count,
                    )
                    self._device_bytes = max(self._num_chunks, 1) * SLICE_BYTES
                else:
                    self._pages_dev = _upload(backend, pages, engine.load_chunk_bytes)
                    self._device_bytes = max(self.num_pages, 1) * PAGE_SIZE
                self._partial_rows = self._max_partial_rows()
                pool = self._fit_pool(engine.pool_size)
                workspaces = [
                    _Workspace(backend, i, self._max_keys, self._partial_rows) for i in range(pool)
                ]
        self._dispatcher = _Dispatcher(
            workspaces, self._execute, max_keys=self._max_keys, coalesce=engine.coalesce
        )
        self.pool_size = pool
        self._warm_up(workspaces[0])

    # -- sizing ------------------------------------------------------------------------------

    def _plan(self, num_keys: int, domain_bits: int, num_pages: int) -> LaunchPlan | SlicedPlan:
        """The launch for `num_keys` keys over the first `num_pages` pages (all of them, except
        in the warm-up); for the sliced layout, over the chunks that hold those pages."""
        if self.layout == "sliced":
            return plan_sliced_launch(
                num_keys,
                self._chunks_holding(num_pages),
                domain_bits,
                sm_count=self._info.sm_count,
                blocks_per_sm=self._compiled.blocks_per_sm,
                max_partial_rows=self._partial_rows,
            )
        return plan_launch(
            num_keys,
            num_pages,
            domain_bits,
            sm_count=self._info.sm_count,
            blocks_per_sm=self._compiled.blocks_per_sm,
            key_group_max=self._key_group_max,
            max_partial_rows=self._partial_rows,
        )

    def _chunks_holding(self, num_pages: int) -> int:
        """Sliced chunks that hold the shard's first `num_pages` pages (at least one): a shard
        that starts mid-chunk spans one more chunk than its page count suggests."""
        return max(1, chunk_range(self.first_page, min(num_pages, self.num_pages))[1])

    def _max_partial_rows(self) -> int:
        # the largest partial of any key count at full domain; other domains pick smaller tiles
        # and may want more blocks, which plan_launch then caps to this buffer
        rows = 1
        for k in range(1, self._max_keys + 1):
            if self.layout == "sliced":
                sp = plan_sliced_launch(
                    k, max(self._num_chunks, 1), MAX_DOMAIN_BITS, sm_count=self._info.sm_count,
                    blocks_per_sm=self._compiled.blocks_per_sm,
                )
                rows = max(rows, sp.page_blocks * k)
                continue
            p = plan_launch(
                k, max(self.num_pages, 1), MAX_DOMAIN_BITS, sm_count=self._info.sm_count,
                blocks_per_sm=self._compiled.blocks_per_sm, key_group_max=self._key_group_max,
            )
            rows = max(rows, p.page_blocks * k)
        return rows

    def _fit_pool(self, wanted: int) -> int:
        per = _Workspace.device_bytes(self._max_keys, self._partial_rows)
        free = self._backend.free_memory() - DEVICE_RESERVE_BYTES
        fits = free // per
        if fits < 1:
            raise GpuError(
                f"no device memory left for a scan workspace ({per} bytes) after the pages"
            )
        if fits < wanted:
            log.warning("gpu pool_size %d reduced to %d to fit device memory", wanted, fits)
        return int(min(wanted, fits))

    # -- scanning ----------------------------------------------------------------------------

    def scan(self, keys: Sequence[DpfKey] | KeyBatch) -> np.ndarray:
        return self.scan_timed(keys)[0]

    def scan_timed(self, keys: Sequence[DpfKey] | KeyBatch) -> tuple[np.ndarray, PhaseTimings]:
        """The answers and where the time went (see PhaseTimings)."""
        if self._closed:
            raise RuntimeError("the shard is closed")
        start = time.perf_counter()
        batch = as_batch(keys)
        check_domain(batch, self.first_page, self.num_pages)
        k = len(batch)
        if self.num_pages == 0:
            zero = PhaseTimings(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)
            return np.zeros((k, PAGE_SIZE), np.uint8), zero
        step = self._max_keys
        requests = [_Request(batch.select(i, min(k, i + step))) for i in range(0, k, step)]
        self._dispatcher.run(requests)
        for r in requests:
            if isinstance(r.error, GpuError):  # a fresh exception per caller of a shared launch
                raise GpuError(str(r.error)) from r.error
            if r.error is not None:
                raise r.error
        result = np.concatenate([r.result for r in requests]) if len(requests) > 1 else (
            requests[0].result
        )
        h2d = sum(r.timings[0] for r in requests)
        kern = sum(r.timings[1] for r in requests)
        d2h = sum(r.timings[2] for r in requests)
        wait = max(r.started - r.submitted for r in requests) * 1e3
        timings = PhaseTimings(
            h2d_ms=h2d,
            kernel_ms=kern,
            d2h_ms=d2h,
            wait_ms=wait,
            total_ms=(time.perf_counter() - start) * 1e3,
            launches=len(requests),
            launch_keys=sum(r.timings[3] for r in requests),
            shared_launches=sum(r.shared for r in requests),
        )
        return result, timings

    def _execute(self, ws: _Workspace, group: list[_Request]) -> None:
        """One launch for the keys of `group` on workspace `ws`; sets each request's result."""
        d = group[0].batch.domain_bits
        w = key_words(d)
        rows = 0
        for r in group:
            n = len(r.batch)
            pack_keys(r.batch, ws.keys_host[rows * w :])
            rows += n
        with _cuda_errors(self._backend, "running a scan"):
            out = self._launch(ws, rows, d, self.num_pages)
            times = self._phase_times(ws)
        row = 0
        for r in group:
            n = len(r.batch)
            r.result = out[row : row + n].copy()
            r.timings = (*times, rows)
            row += n

    def _launch(
        self, ws: _Workspace, num_keys: int, domain_bits: int, num_pages: int
    ) -> np.ndarray:
        """Keys already packed in ws.keys_host; returns a view of ws.out_host (num_keys rows)."""
        b = self._backend
        plan = self._plan(num_keys, domain_bits, num_pages)
        kernels = self._compiled.kernels
        key_bytes = num_keys * key_words(domain_bits) * 4
        out_bytes = num_keys * PAGE_SIZE
        if isinstance(plan, SlicedPlan):
            threads = SLICED_THREADS
            args: tuple[Any, ...] = (
                self._pages_dev,
                _U64(self._chunks_holding(num_pages)),
                _U64(self._first_chunk),
                ws.keys_dev,
                _U32(num_keys),
                _U32(domain_bits),
                _U32(plan.num_groups),
                ws.partial_dev,
            )
        else:
            threads = SCAN_THREADS
            args = (
                self._pages_dev,
                _U64(num_pages),
                _U64(self.first_page),
                ws.keys_dev,
                _U32(num_keys),
                _U32(domain_bits),
                _U32(plan.tile_bits),
                _U32(plan.num_groups),
                ws.partial_dev,
            )
        reduce_args = (
            ws.partial_dev, ws.out_dev, _U32(plan.page_blocks), _U32(num_keys * LANES_PER_PAGE),
        )
        # The events bracket each phase on this stream (PhaseTimings says what they include).
        # The arguments are built above, so e1 -> the scan launch is only the submission.
        e0, e1, e2, e3 = ws.events
        with b.activate():
            b.record(e0, ws.stream)
            b.h2d(ws.keys_dev, 0, ws.keys_host.view(np.uint8)[:key_bytes], ws.stream)
            b.record(e1, ws.stream)
            b.launch(kernels[plan.kernel], plan.grid, threads, args, plan.smem_bytes, ws.stream)
            b.launch(
                kernels[REDUCE_KERNEL],
                reduce_grid(num_keys),
                REDUCE_LANES * REDUCE_SLICES,
                reduce_args,
                0,
                ws.stream,
            )
            b.record(e2, ws.stream)
            host = ws.out_host[:out_bytes]
            b.d2h(host, ws.out_dev, 0, ws.stream)
            b.record(e3, ws.stream)
            b.synchronize(ws.stream)
        return host.reshape(num_keys, PAGE_SIZE)

    def _phase_times(self, ws: _Workspace) -> tuple[float, float, float]:
        """(key copy, scan + reduce, answer copy) ms of the launch just synchronized on `ws`:
        spans of the workspace stream's timeline, waits for the device included (PhaseTimings)."""
        b = self._backend
        e0, e1, e2, e3 = ws.events
        return b.elapsed_ms(e0, e1), b.elapsed_ms(e1, e2), b.elapsed_ms(e2, e3)

    def _warm_up(self, ws: _Workspace) -> None:
        """Runs every scan variant once on a few pages, so the first request pays no lazy
        module loading, and a kernel that cannot launch fails the load, not a request."""
        if self.num_pages == 0:
            return
        d = max(1, (self.first_page + self.num_pages - 1).bit_length())
        pages = min(self.num_pages, 256)
        warmed: set[str] = set()
        with _cuda_errors(self._backend, "warming the kernels"):
            for n in range(1, self._max_keys + 1):
                kernel = self._plan(n, d, pages).kernel
                if kernel in warmed:
                    continue
                warmed.add(kernel)
                ws.keys_host[: n * key_words(d)] = 0  # any seeds do; the answer is discarded
                self._launch(ws, n, d, pages)

    # -- benchmark support -------------------------------------------------------------------

    def read_pages_timed(self, repeats: int = 1) -> tuple[float, bytes]:
        """A plain read of every byte of the device copy with the bandwidth kernel: (best ms,
        XOR of all its 16-byte words). The benchmark's yardstick: what the card reads in the
        same run. For the sliced layout the XOR is sliced.sliced_digest's, not the pages'."""
        b = self._backend
        n16 = self._device_bytes // 16 if self.num_pages else 0
        grid = self._info.sm_count * 8
        best = math.inf
        with _cuda_errors(b, "the read benchmark"), b.activate():
            kernel = self._compiled.kernels[READ_BW_KERNEL]
            sink = b.alloc(grid * READ_BW_THREADS * 16)
            stream = b.new_stream()
            e0, e1 = b.new_event(), b.new_event()
            for _ in range(max(1, repeats)):
                b.record(e0, stream)
                b.launch(kernel, grid, READ_BW_THREADS, (self._pages_dev, _U64(n16), sink), 0,
                         stream)
                b.record(e1, stream)
                b.synchronize(stream)
                best = min(best, b.elapsed_ms(e0, e1))
            host = b.alloc_pinned(grid * READ_BW_THREADS * 16)[: grid * READ_BW_THREADS * 16]
            b.d2h(host, sink, 0, stream)
            b.synchronize(stream)
        folded = np.bitwise_xor.reduce(host.view(np.uint64).reshape(-1, 2), axis=0)
        return best, folded.tobytes()

    def close(self) -> None:
        """Waits for the scans in flight, then frees the device memory."""
        if self._closed:
            return
        self._closed = True
        self._dispatcher.close()
        self._pages_dev = None


class GpuEngine:
    """CuPy engine. Options (all read once, here): device; pool_size, the workspaces = launches
    in flight, each with its own stream (default MORPHOGEN_GPU_POOL_SIZE or 2, clamped to
    1..32 and to what fits the device; more than 2 rarely helps, since each launch already
    fills the device and extra ones only split its bandwidth); key_group_max (keys per block,
    one of KEY_GROUP_SIZES, fused kernel only); coalesce (merge waiting callers into one launch);
    max_keys (keys per launch, 1..96); kernel, the scan kernel and with it the device layout of
    the pages (SCAN_LAYOUTS; default MORPHOGEN_GPU_KERNEL or DEFAULT_LAYOUT)."""

    name = "gpu"

    def __init__(
        self,
        device: int = 0,
        pool_size: int | str | None = None,
        key_group_max: int = DEFAULT_KEY_GROUP_MAX,
        coalesce: bool = True,
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
        self.coalesce = bool(coalesce)
        self.max_keys = int(max_keys)
        self.load_chunk_bytes = int(load_chunk_bytes)
        self.backend: Backend = backend if backend is not None else _CupyBackend(int(device))
        with _cuda_errors(self.backend, "querying the device"):
            self.info = self.backend.device_info()
        self._compiled: _Compiled | None = None
        self._lock = threading.Lock()
        self._kernels()  # here, not at the first load: a GPU that cannot compile fails creation

    @property
    def device_name(self) -> str:
        return self.info.name

    def _kernels(self) -> _Compiled:
        with self._lock:
            if self._compiled is None:
                self._compiled = _compile(self.backend)
            return self._compiled

    def load(self, pages: np.ndarray, first_page: int = 0) -> GpuShard:
        return GpuShard(self, self._kernels(), pages, int(first_page))


# ---------------------------------------------------------------------------------------------
# helpers


def _compile(backend: Backend) -> _Compiled:
    """The engine's kernels, or a GpuError that names the cause and the fix.

    Compiling is the honest availability probe: CuPy imports and sees a device without NVRTC
    or the CUDA headers, and then fails only here. CuPy reports a missing NVRTC library or
    missing headers as a plain RuntimeError (or OSError), not as one of its CUDA error types.
    """
    try:
        with _cuda_errors(backend, "compiling scan_kernel.cu"):
            return _Compiled(backend)
    except GpuError as exc:  # NVRTC ran and refused (its log kept): mismatched headers can
        raise GpuError(f"{exc}; if the CUDA toolkit is the cause, {TOOLKIT_HINT}") from exc
    except (RuntimeError, OSError) as exc:
        raise GpuError(
            "the gpu engine cannot compile its CUDA kernels: CuPy imports and sees a device, but "
            f"NVRTC or the CUDA headers are missing ({type(exc).__name__}: {_one_line(exc)}); "
            f"{TOOLKIT_HINT}"
        ) from exc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


@contextlib.contextmanager
def _cuda_errors(backend: Backend, doing: str) -> Iterator[None]:
    """Backend (CUDA, NVRTC, out-of-memory) exceptions become GpuError naming the step."""
    try:
        yield
    except GpuError:
        raise
    except backend.error_types as exc:
        raise GpuError(f"CUDA failure while {doing}: {exc}") from exc


def _upload(backend: Backend, pages: np.ndarray, chunk_bytes: int) -> Any:
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


def _upload_sliced(
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
            (natural[slot], _U64(m), backend.view(dev, c0 * SLICE_BYTES)), 0, stream,
        )
        backend.record(events[slot], stream)
        used[slot] = True
    backend.synchronize(stream)
    return dev
