"""Stand-ins for CuPy behind the GPU engine's Backend protocol (morphogen/engine/gpu_backend.py).

`FakeBackend` keeps "device memory" in numpy arrays and runs kernels either through a NumPy
model of their contract (`model`, written from the kernel's documented semantics) or through
the real scan_kernel.cu, as gpu_kernels.kernel_source() generates it, compiled as host C++
(`emulator`, see cuda_emu/). Every launch checks the scalar argument types against the kernel
signatures, the thing CuPy does not check.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import itertools
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.engine import gpu, gpu_kernels, sliced
from morphogen.engine.gpu_backend import DeviceInfo
from morphogen.engine.gpu_keys import KEY_HEADER_WORDS, key_words
from morphogen.engine.gpu_plan import (
    PACKED_KERNELS,
    REDUCE_KERNEL,
    REDUCE_LANES,
    REDUCE_SLICES,
    SCAN_KERNELS,
    SCAN_THREADS,
)
from morphogen.protocol.dpf import DpfKey, eval_range

ROOT = Path(__file__).resolve().parents[2]
EMU_DIR = Path(__file__).resolve().parent / "cuda_emu"

# Kernel signatures: "p" = device pointer, np.uint32 / np.uint64 = scalar of exactly that type.
P = "p"
SIGNATURES: dict[str, tuple[Any, ...]] = {
    **{
        name: (P, np.uint64, np.uint64, P, np.uint32, np.uint32, np.uint32, np.uint32, P)
        for name in SCAN_KERNELS + PACKED_KERNELS
    },
    REDUCE_KERNEL: (P, P, np.uint32, np.uint32),
    gpu_kernels.READ_BW_KERNEL: (P, np.uint64, P),
    **{
        name: (P, np.uint64, np.uint64, P, np.uint32, np.uint32, np.uint32, P)
        for name in sliced.SLICED_KERNELS
    },
    sliced.SLICE_KERNEL: (P, np.uint64, P),
    **{
        name: (P, np.uint64, np.uint64, P, np.uint32, np.uint32, np.uint32, P, np.uint32,
               np.uint64, np.uint64)
        for name in sliced.TABLE_KERNELS
    },
    **{
        name: (P, np.uint64, np.uint64, P, np.uint32, np.uint32, np.uint32, P, np.uint32,
               np.uint64, np.uint64)
        for name in sliced.SLICED_PACKED_KERNELS
    },
    **{name: (P, P, np.uint32, P) for name in gpu_kernels.PATCH_KERNELS},
}


class FakeCudaError(RuntimeError):
    """What the fake raises where CUDA would fail."""


@dataclass
class FakeDeviceArray:
    buf: np.ndarray
    freed: bool = False

    @property
    def ptr(self) -> int:
        return self.buf.ctypes.data


@dataclass
class FakeStream:
    id: int
    non_blocking: bool = True
    ops: list[str] = field(default_factory=list)


@dataclass
class FakeEvent:
    t: float = 0.0


@dataclass
class FakeKernel:
    name: str


@dataclass
class Launch:
    kernel: str
    grid: int
    block: int
    smem: int
    stream: int
    args: tuple[Any, ...]
    thread: int


class FakeBackend:
    """A Backend without CUDA. `mode` is "model" or "emulator"."""

    error_types = (FakeCudaError,)

    def __init__(
        self,
        *,
        sm_count: int = 4,
        blocks_per_sm_value: int = 2,
        free_bytes: int = 1 << 34,
        mode: str = "model",
        launch_delay_s: float = 0.0,
        order: int = 0,
    ) -> None:
        self.order = order  # emulator: fibers run forward (0), reversed (1) or shuffled (2)
        self.sm_count = sm_count
        self.blocks_per_sm_value = blocks_per_sm_value
        self.free_bytes = free_bytes
        self.mode = mode
        self.launch_delay_s = launch_delay_s
        self.fail_next_launch: str | None = None
        self.streams: list[FakeStream] = []
        self.launches: list[Launch] = []
        self.compiles = 0
        self.sources: list[str] = []
        self.allocated = 0
        self.pinned_allocated = 0
        self.max_dynamic_smem: dict[str, int] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.active_launches = 0
        self.max_active_launches = 0
        self._emu = load_emulator() if mode == "emulator" else None

    # -- Backend -------------------------------------------------------------------------------

    def device_info(self) -> DeviceInfo:
        return DeviceInfo(name="Fake GPU", sm_count=self.sm_count, total_memory=1 << 36)

    def free_memory(self) -> int:
        return self.free_bytes - self.allocated

    def activate(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def compile(self, source: str, options: Any, names: Any) -> dict[str, FakeKernel]:
        self.compiles += 1
        self.sources.append(source)
        # the generated program, defines first (with whatever tuning the engine was given)
        defined = dict(re.findall(r"^#define (\w+) (\d+)$", source, re.M))
        tuning = {name: int(defined[name]) for name in gpu_kernels.kernel_tuning()}
        assert source == gpu_kernels.kernel_source(tuning=tuning)
        for name in names:  # variants are stamped out by MG_SCAN_KERNEL / MG_SLICED_KERNEL
            kg = name.removeprefix("morphogen_scan_k")
            packed_kg = name.removeprefix("morphogen_packed_k")
            if kg != name:
                assert f"MG_SCAN_KERNEL({kg}," in source
            elif packed_kg != name:
                assert f"MG_PACKED_KERNEL({packed_kg}," in source
            elif name in gpu_kernels.SLICED_BLOCK_KERNELS:
                assert f", {name})" in source
            else:
                assert f"{name}(" in source
        return {name: FakeKernel(name) for name in names}

    def blocks_per_sm(self, kernel: Any, block: int, smem_bytes: int) -> int:
        is_sliced = kernel.name in gpu_kernels.SLICED_BLOCK_KERNELS
        launched = sliced.SLICED_THREADS if is_sliced else SCAN_THREADS
        assert block == launched, f"{kernel.name}: occupancy of {block}-thread blocks asked"
        if is_sliced:
            assert smem_bytes <= self.max_dynamic_smem.get(kernel.name, 48 * 1024)
        return self.blocks_per_sm_value

    def set_max_dynamic_smem(self, kernel: FakeKernel, nbytes: int) -> None:
        self.max_dynamic_smem[kernel.name] = int(nbytes)

    def view(self, buf: FakeDeviceArray, offset: int) -> FakeDeviceArray:
        return FakeDeviceArray(buf.buf[int(offset) :])

    def alloc(self, nbytes: int) -> FakeDeviceArray:
        with self._lock:
            self.allocated += nbytes
        buf = np.empty(max(nbytes, 16) // 16 * 16 + 16, np.uint8)[: max(nbytes, 16)]
        buf[:] = 0xCD  # device memory is not zeroed: poison it
        return FakeDeviceArray(buf)

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        with self._lock:
            self.pinned_allocated += nbytes
        buf = np.empty(max(nbytes, 16), np.uint8)
        buf[:] = 0xEE
        return buf

    def new_stream(self) -> FakeStream:
        s = FakeStream(next(self._ids))
        self.streams.append(s)
        return s

    def new_event(self) -> FakeEvent:
        return FakeEvent()

    def h2d(self, dst: FakeDeviceArray, dst_offset: int, src: np.ndarray, stream: FakeStream):
        assert src.dtype == np.uint8 or src.flags.c_contiguous
        raw = src.reshape(-1).view(np.uint8)
        dst.buf[dst_offset : dst_offset + raw.size] = raw
        stream.ops.append("h2d")

    def d2h(self, dst: np.ndarray, src: FakeDeviceArray, src_offset: int, stream: FakeStream):
        raw = dst.reshape(-1).view(np.uint8)
        raw[:] = src.buf[src_offset : src_offset + raw.size]
        stream.ops.append("d2h")

    def launch(
        self,
        kernel: FakeKernel,
        grid: int,
        block: int,
        args: tuple[Any, ...],
        smem_bytes: int,
        stream: FakeStream,
    ) -> None:
        check_args(kernel.name, args)
        with self._lock:
            self.launches.append(
                Launch(kernel.name, grid, block, smem_bytes, stream.id, args,
                       threading.get_ident())
            )
            self.active_launches += 1
            self.max_active_launches = max(self.max_active_launches, self.active_launches)
        try:
            if self.fail_next_launch is not None:
                msg, self.fail_next_launch = self.fail_next_launch, None
                raise FakeCudaError(msg)
            if self.launch_delay_s:
                time.sleep(self.launch_delay_s)
            stream.ops.append(kernel.name)
            if self._emu is not None:
                run_emulated(self._emu, kernel.name, grid, block, args, smem_bytes, self.order)
            else:
                run_model(kernel.name, grid, block, args, smem_bytes)
        finally:
            with self._lock:
                self.active_launches -= 1

    def record(self, event: FakeEvent, stream: FakeStream) -> None:
        event.t = time.perf_counter()

    def event_synchronize(self, event: FakeEvent) -> None:
        pass

    def synchronize(self, stream: FakeStream) -> None:
        stream.ops.append("sync")

    def elapsed_ms(self, start: FakeEvent, end: FakeEvent) -> float:
        return (end.t - start.t) * 1e3


def check_args(name: str, args: tuple[Any, ...]) -> None:
    sig = SIGNATURES[name]
    assert len(args) == len(sig), f"{name}: {len(args)} args, signature has {len(sig)}"
    for i, (a, t) in enumerate(zip(args, sig, strict=True)):
        if t == P:
            assert isinstance(a, FakeDeviceArray), f"{name} arg {i}: expected a device buffer"
        else:
            assert type(a) is t, f"{name} arg {i}: expected {t.__name__}, got {type(a).__name__}"


# ---------------------------------------------------------------------------------------------
# NumPy model of the kernels' contract


def unpack_key(record: np.ndarray, domain_bits: int) -> DpfKey:
    """The inverse of gpu_keys.pack_keys for one record (the model evaluates real DpfKeys)."""
    d = domain_bits
    r = np.ascontiguousarray(record, dtype=np.uint32)
    cw = r[KEY_HEADER_WORDS : KEY_HEADER_WORDS + 4 * d].reshape(d, 4)
    root_t = int(r[8])
    return DpfKey(
        root_seed=r[0:4].tobytes(),
        root_t=root_t,
        party=root_t,
        domain_bits=d,
        cw=tuple(c.tobytes() for c in cw),
        tcw_left=tuple((int(r[9]) >> i) & 1 for i in range(d)),
        tcw_right=tuple((int(r[10]) >> i) & 1 for i in range(d)),
        final_cw=r[4:8].tobytes(),
    )


def _model_scan(grid: int, args: tuple[Any, ...]) -> None:
    pages_a, num_pages, first, keys_a, num_keys, d, h, groups, partial_a = args
    n, first, k_total, d = int(num_pages), int(first), int(num_keys), int(d)
    groups = int(groups)
    page_blocks = grid // groups
    pages = pages_a.buf[: n * PAGE_SIZE].reshape(n, PAGE_SIZE) if n else None
    w = key_words(d)
    records = keys_a.buf[: k_total * w * 4].view(np.uint32).reshape(k_total, w)
    partial = partial_a.buf.view(np.uint8)
    for pb in range(page_blocks):
        lo, hi = n * pb // page_blocks, n * (pb + 1) // page_blocks
        for k in range(k_total):
            acc = np.zeros(PAGE_SIZE, np.uint8)
            if hi > lo:
                masks = eval_range(unpack_key(records[k], d), first + lo, first + hi)
                tiled = np.tile(masks, (1, PAGE_SIZE // 16))
                acc = np.bitwise_xor.reduce(pages[lo:hi] & tiled, axis=0)
            row = (pb * k_total + k) * PAGE_SIZE
            partial[row : row + PAGE_SIZE] = acc


def _model_packed_scan(grid: int, args: tuple[Any, ...]) -> None:
    """packed_scan_kernel.cu's contract: page p's selection bit of each key (its record holds
    `levels` = d - 7 levels), the selected pages XORed, per page block."""
    pages_a, num_pages, first, keys_a, num_keys, levels, _h, groups, partial_a = args
    n, first, k_total, levels = int(num_pages), int(first), int(num_keys), int(levels)
    page_blocks = grid // int(groups)
    pages = pages_a.buf[: n * PAGE_SIZE].reshape(n, PAGE_SIZE) if n else None
    w = key_words(levels)
    records = keys_a.buf[: k_total * w * 4].view(np.uint32).reshape(k_total, w)
    partial = partial_a.buf.view(np.uint8)
    for pb in range(page_blocks):
        lo, hi = n * pb // page_blocks, n * (pb + 1) // page_blocks
        for k in range(k_total):
            acc = np.zeros(PAGE_SIZE, np.uint8)
            if hi > lo:
                bits = packed_selection(records[k], levels, first + lo, first + hi)
                acc = np.bitwise_xor.reduce(pages[lo:hi][bits.astype(bool)], axis=0) \
                    if bits.any() else acc
            row = (pb * k_total + k) * PAGE_SIZE
            partial[row : row + PAGE_SIZE] = acc


def packed_selection(record: np.ndarray, levels: int, lo: int, hi: int) -> np.ndarray:
    """Selection bits of key indices [lo, hi) of one packed record (the project's evaluator)."""
    from morphogen.protocol import packed

    r = np.ascontiguousarray(record, dtype=np.uint32)
    key = packed.PackedKey(
        root_seed=r[0:4].tobytes(), root_t=int(r[8]), party=int(r[8]),
        domain_bits=levels + 7,
        cw=tuple(c.tobytes() for c in r[KEY_HEADER_WORDS:].reshape(levels, 4)),
        tcw_left=tuple((int(r[9]) >> i) & 1 for i in range(levels)),
        tcw_right=tuple((int(r[10]) >> i) & 1 for i in range(levels)),
        final_cw=r[4:8].tobytes(),
    )
    return packed.selection_range(key, lo, hi)


def _model_reduce(args: tuple[Any, ...]) -> None:
    partial_a, out_a, num_partials, row_lanes = args
    nbytes = int(row_lanes) * 16
    parts = partial_a.buf[: int(num_partials) * nbytes].reshape(int(num_partials), nbytes)
    out_a.buf[:nbytes] = np.bitwise_xor.reduce(parts, axis=0)


def _model_read_bw(grid: int, block: int, args: tuple[Any, ...]) -> None:
    data_a, n16, sink_a = args
    threads = grid * block
    words = data_a.buf[: int(n16) * 16].view(np.uint64).reshape(-1, 2)
    sink = sink_a.buf[: threads * 16].view(np.uint64).reshape(threads, 2)
    sink[:] = 0
    for t in range(threads):
        sink[t] = np.bitwise_xor.reduce(words[t::threads], axis=0) if t < len(words) else 0


def unslice_chunk(words: np.ndarray) -> np.ndarray:
    """Natural (256, 4096) pages of one sliced chunk: sliced.slice_chunk read backwards."""
    bits = np.unpackbits(np.ascontiguousarray(words, "<u4").view(np.uint8), bitorder="little")
    bits = bits.reshape(128, 16, 8, 4, 2, 2, 32)  # b, G, g, tig, rhi, rlo, j
    bits = bits.transpose(4, 3, 6, 1, 5, 2, 0).reshape(256, 256, 128)  # K, lane, b
    natural = np.empty_like(bits)
    natural[sliced.chunk_page_order()] = bits
    return np.packbits(natural, axis=2, bitorder="little").reshape(256, PAGE_SIZE)


def _model_slice(args: tuple[Any, ...]) -> None:
    natural_a, num_chunks, out_a = args
    for c in range(int(num_chunks)):
        chunk = natural_a.buf[c * sliced.SLICE_BYTES : (c + 1) * sliced.SLICE_BYTES]
        out = out_a.buf[c * sliced.SLICE_BYTES : (c + 1) * sliced.SLICE_BYTES]
        out[:] = sliced.slice_chunk(chunk.reshape(256, PAGE_SIZE)).view(np.uint8)


def _model_sliced_scan(grid: int, args: tuple[Any, ...]) -> None:
    data_a, num_chunks, first_chunk, keys_a, num_keys, d, groups, partial_a = args
    n_chunks, k_total, d, groups = int(num_chunks), int(num_keys), int(d), int(groups)
    page_blocks = grid // groups
    w = key_words(d)
    records = keys_a.buf[: k_total * w * 4].view(np.uint32).reshape(k_total, w)
    partial = partial_a.buf.view(np.uint8)
    size = sliced.SLICE_BYTES
    natural = [unslice_chunk(data_a.buf[c * size : (c + 1) * size].view("<u4"))
               for c in range(n_chunks)]
    for pb in range(page_blocks):
        lo, hi = n_chunks * pb // page_blocks, n_chunks * (pb + 1) // page_blocks
        for k in range(k_total):
            acc = np.zeros(PAGE_SIZE, np.uint8)
            for c in range(lo, hi):
                start = (int(first_chunk) + c) * 256
                stop = min(start + 256, 1 << d)  # a chunk past the domain holds zero pages
                masks = eval_range(unpack_key(records[k], d), start, stop)
                tiled = np.tile(masks, (1, PAGE_SIZE // 16))
                acc ^= np.bitwise_xor.reduce(natural[c][: stop - start] & tiled, axis=0)
            row = (pb * k_total + k) * PAGE_SIZE
            partial[row : row + PAGE_SIZE] = acc


def _model_sliced_table(grid: int, args: tuple[Any, ...]) -> None:
    """sliced_table_kernel.cu's contract: chunk c's position p is leaf 256 (first_chunk + c)
    + p - shift of the table, scanned where it is in [leaf_lo, leaf_hi)."""
    data_a, num_chunks, first_chunk, keys_a, num_keys, d, groups, partial_a, shift, lo_leaf, \
        hi_leaf = args
    n_chunks, k_total, d, groups = int(num_chunks), int(num_keys), int(d), int(groups)
    page_blocks = grid // groups
    w = key_words(d)
    records = keys_a.buf[: k_total * w * 4].view(np.uint32).reshape(k_total, w)
    partial = partial_a.buf.view(np.uint8)
    size = sliced.SLICE_BYTES
    naturals = [unslice_chunk(data_a.buf[c * size : (c + 1) * size].view("<u4"))
                for c in range(n_chunks)]
    for pb in range(page_blocks):
        lo, hi = n_chunks * pb // page_blocks, n_chunks * (pb + 1) // page_blocks
        for k in range(k_total):
            acc = np.zeros(PAGE_SIZE, np.uint8)
            for c in range(lo, hi):
                natural = naturals[c]
                first_leaf = 256 * (int(first_chunk) + c) - int(shift)
                start = max(first_leaf, int(lo_leaf))
                stop = min(first_leaf + 256, int(hi_leaf))
                if start >= stop:
                    continue
                masks = eval_range(unpack_key(records[k], d), start, stop)
                tiled = np.tile(masks, (1, PAGE_SIZE // 16))
                rows = natural[start - first_leaf : stop - first_leaf]
                acc ^= np.bitwise_xor.reduce(rows & tiled, axis=0)
            row = (pb * k_total + k) * PAGE_SIZE
            partial[row : row + PAGE_SIZE] = acc


def _model_sliced_packed(grid: int, args: tuple[Any, ...]) -> None:
    """sliced_packed_kernel.cu's contract: chunk c's position p is key index first_index +
    256 c + p - offset, selected by the key's bit where that index is in [idx_lo, idx_hi)."""
    data_a, num_chunks, first_index, keys_a, num_keys, levels, groups, partial_a, offset, \
        idx_lo, idx_hi = args
    n_chunks, k_total, levels = int(num_chunks), int(num_keys), int(levels)
    page_blocks = grid // int(groups)
    w = key_words(levels)
    records = keys_a.buf[: k_total * w * 4].view(np.uint32).reshape(k_total, w)
    partial = partial_a.buf.view(np.uint8)
    size = sliced.SLICE_BYTES
    naturals = [unslice_chunk(data_a.buf[c * size : (c + 1) * size].view("<u4"))
                for c in range(n_chunks)]
    for pb in range(page_blocks):
        lo, hi = n_chunks * pb // page_blocks, n_chunks * (pb + 1) // page_blocks
        for k in range(k_total):
            acc = np.zeros(PAGE_SIZE, np.uint8)
            for c in range(lo, hi):
                base = int(first_index) + 256 * c - int(offset)
                start, stop = max(base, int(idx_lo)), min(base + 256, int(idx_hi))
                if start >= stop:
                    continue
                bits = packed_selection(records[k], levels, start, stop).astype(bool)
                rows = naturals[c][start - base : stop - base]
                if bits.any():
                    acc ^= np.bitwise_xor.reduce(rows[bits], axis=0)
            row = (pb * k_total + k) * PAGE_SIZE
            partial[row : row + PAGE_SIZE] = acc


def _model_patch(name: str, args: tuple[Any, ...]) -> None:
    """patch_kernel.cu's contract: each diff XORed into its page of the buffer, as the layout
    stores it (the sliced image of a diff alone in a chunk is the diff's bits there)."""
    diffs_a, slots_a, n, dest_a = args
    n = int(n)
    diffs = diffs_a.buf[: n * PAGE_SIZE].reshape(n, PAGE_SIZE)
    slots = slots_a.buf[: n * 4].view(np.uint32)
    chunks: dict[int, np.ndarray] = {}
    for slot, diff in zip(slots, diffs, strict=True):
        slot = int(slot)
        if name == "morphogen_patch_pages":
            dest_a.buf[slot * PAGE_SIZE : (slot + 1) * PAGE_SIZE] ^= diff
            continue
        chunk = chunks.setdefault(slot // 256, np.zeros((256, PAGE_SIZE), np.uint8))
        chunk[slot % 256] ^= diff
    size = sliced.SLICE_BYTES
    for c, chunk in chunks.items():
        dest_a.buf[c * size : (c + 1) * size] ^= sliced.slice_chunk(chunk).view(np.uint8)


def run_model(name: str, grid: int, block: int, args: tuple[Any, ...], smem: int) -> None:
    if name in SCAN_KERNELS:
        assert block == SCAN_THREADS
        _model_scan(grid, args)
    elif name in PACKED_KERNELS:
        assert block == SCAN_THREADS
        _model_packed_scan(grid, args)
    elif name in sliced.SLICED_KERNELS:
        assert block == sliced.SLICED_THREADS
        _model_sliced_scan(grid, args)
    elif name in sliced.TABLE_KERNELS:
        assert block == sliced.SLICED_THREADS
        _model_sliced_table(grid, args)
    elif name in sliced.SLICED_PACKED_KERNELS:
        assert block == sliced.SLICED_THREADS
        _model_sliced_packed(grid, args)
    elif name == sliced.SLICE_KERNEL:
        _model_slice(args)
    elif name in gpu_kernels.PATCH_KERNELS:
        _model_patch(name, args)
    elif name == REDUCE_KERNEL:
        _model_reduce(args)
    else:
        _model_read_bw(grid, block, args)


# ---------------------------------------------------------------------------------------------
# The real kernel source compiled as host C++ (cuda_emu/emu_prelude.h)


def emulator_compiler() -> str | None:
    return shutil.which("g++") or shutil.which("c++")


_EMU_LOCK = threading.Lock()
_EMU: dict[str, ctypes.CDLL] = {}


def load_emulator() -> ctypes.CDLL:
    """Builds (once per source hash) and loads the emulation library: the harness with the
    program gpu_kernels.kernel_source() generates (both .cu files; the prelude emulates warp
    shuffles and the tensor-core MMA as warp collectives)."""
    cxx = emulator_compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler to build the kernel emulator")
    kernel = gpu_kernels.kernel_source()
    src = [EMU_DIR / "emu_prelude.h", EMU_DIR / "emu_harness.cpp"]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in src) + kernel.encode())
    tag = digest.hexdigest()[:16]
    with _EMU_LOCK:
        if tag in _EMU:
            return _EMU[tag]
        out_dir = Path("/tmp") / "morphogen-cuda-emu"
        out_dir.mkdir(parents=True, exist_ok=True)
        lib = out_dir / f"emu-{tag}.so"
        if not lib.exists():
            gen = out_dir / f"emu-{tag}.{threading.get_ident()}"
            gen.mkdir(exist_ok=True)
            (gen / "morphogen_scan_kernel.cu").write_text(kernel)  # the harness includes it
            tmp = lib.with_suffix(f".{threading.get_ident()}.tmp")
            cmd = [
                cxx, "-O2", "-std=c++17", "-pthread", "-fPIC", "-shared", "-Wall", "-Werror",
                "-Wno-unknown-pragmas", "-Wno-unused-function", f"-I{EMU_DIR}", f"-I{gen}",
                str(EMU_DIR / "emu_harness.cpp"), "-o", str(tmp),
            ]
            try:
                subprocess.run(cmd, check=True, capture_output=True, text=True)
            finally:
                shutil.rmtree(gen, ignore_errors=True)
            tmp.replace(lib)
        dll = ctypes.CDLL(str(lib))
        u32, u64, vp, i = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int
        dll.emu_scan.argtypes = [i, u32, u64, vp, u64, u64, vp, u32, u32, u32, u32, vp]
        dll.emu_scan.restype = i
        dll.emu_packed.argtypes = [i, u32, u64, vp, u64, u64, vp, u32, u32, u32, u32, vp]
        dll.emu_packed.restype = i
        dll.emu_reduce.argtypes = [u32, vp, vp, u32, u32]
        dll.emu_reduce.restype = i
        dll.emu_read_bw.argtypes = [u32, vp, u64, vp]
        dll.emu_read_bw.restype = i
        dll.emu_sliced.argtypes = [i, u32, u64, vp, u64, u64, vp, u32, u32, u32, vp]
        dll.emu_sliced.restype = i
        dll.emu_sliced_table.argtypes = [i, u32, u64, vp, u64, u64, vp, u32, u32, u32, vp,
                                         u32, u64, u64]
        dll.emu_sliced_table.restype = i
        dll.emu_sliced_packed.argtypes = [i, u32, u64, vp, u64, u64, vp, u32, u32, u32, vp,
                                          u32, u64, u64]
        dll.emu_sliced_packed.restype = i
        dll.emu_patch.argtypes = [i, u32, u32, vp, vp, u32, vp]
        dll.emu_patch.restype = i
        dll.emu_slice_pages.argtypes = [u32, vp, u64, vp]
        dll.emu_slice_pages.restype = i
        dll.emu_prg_g.argtypes = [vp, vp]
        dll.emu_prg_g.restype = None
        dll.emu_set_order.argtypes = [i, ctypes.c_uint]
        dll.emu_set_order.restype = None
        _EMU[tag] = dll
        return dll


# The emulator runs blocks one after another with process-wide shared memory: one launch at a
# time.
_EMU_RUN = threading.Lock()


def run_emulated(
    dll: ctypes.CDLL,
    name: str,
    grid: int,
    block: int,
    args: tuple[Any, ...],
    smem: int,
    order: int = 0,
) -> None:
    def v(a: Any) -> Any:
        return a.ptr if isinstance(a, FakeDeviceArray) else int(a)

    with _EMU_RUN:
        dll.emu_set_order(order, 7)
        if name in SCAN_KERNELS:
            assert block == SCAN_THREADS
            kg = int(name.removeprefix("morphogen_scan_k"))
            rc = dll.emu_scan(kg, grid, smem, *[v(a) for a in args])
        elif name in PACKED_KERNELS:
            assert block == SCAN_THREADS
            kg = int(name.removeprefix("morphogen_packed_k"))
            rc = dll.emu_packed(kg, grid, smem, *[v(a) for a in args])
        elif name == REDUCE_KERNEL:
            assert block == REDUCE_LANES * REDUCE_SLICES
            rc = dll.emu_reduce(grid, *[v(a) for a in args])
        elif name in sliced.SLICED_KERNELS:
            assert block == sliced.SLICED_THREADS
            variant = sliced.SLICED_KERNELS.index(name)
            rc = dll.emu_sliced(variant, grid, smem, *[v(a) for a in args])
        elif name in sliced.TABLE_KERNELS:
            assert block == sliced.SLICED_THREADS
            variant = sliced.TABLE_KERNELS.index(name)
            rc = dll.emu_sliced_table(variant, grid, smem, *[v(a) for a in args])
        elif name in sliced.SLICED_PACKED_KERNELS:
            assert block == sliced.SLICED_THREADS
            variant = sliced.SLICED_PACKED_KERNELS.index(name)
            rc = dll.emu_sliced_packed(variant, grid, smem, *[v(a) for a in args])
        elif name == sliced.SLICE_KERNEL:
            assert block == sliced.SLICE_THREADS
            rc = dll.emu_slice_pages(grid, *[v(a) for a in args])
        elif name in gpu_kernels.PATCH_KERNELS:
            rc = dll.emu_patch(gpu_kernels.PATCH_KERNELS.index(name), grid, block,
                               *[v(a) for a in args])
        else:
            assert block == gpu_kernels.READ_BW_THREADS
            rc = dll.emu_read_bw(grid, *[v(a) for a in args])
    assert rc == 0, f"emulated {name} failed ({rc})"


def emulated_prg(dll: ctypes.CDLL, seed: bytes) -> tuple[bytes, bytes, int, int]:
    words = np.frombuffer(seed, np.uint32).copy()
    out = np.zeros(10, np.uint32)
    dll.emu_prg_g(words.ctypes.data, out.ctypes.data)
    return out[0:4].tobytes(), out[4:8].tobytes(), int(out[8]), int(out[9])


def make_engine(backend: FakeBackend, **options: Any) -> gpu.GpuEngine:
    # the host tests are written against the fused plan; the sliced one says so explicitly
    options.setdefault("kernel", "fused")
    return gpu.GpuEngine(backend=backend, **options)
