"""One shard's pages on the GPU (`GpuShard`): uploaded once into one device allocation in the
shard's layout, scanned by concurrent callers on workspaces of a bounded pool, written in place
by page updates between scans.

- Loading (`GpuShard(...)`, through `GpuEngine.load`) uploads the pages through pinned staging
  buffers, so host memory stays bounded, and warms every kernel variant before returning: the
  first request pays no lazy module loading, and a kernel that cannot launch fails the load.
- `GpuShard.scan` takes a free workspace from the shard's bounded pool (waiting while none is
  free), packs its keys into the kernel's records (`pack_keys`), plans each launch
  (`plan_launch`), runs it on the workspace's own stream, at most max_keys keys a launch, and
  gives the workspace back. Concurrent scans overlap on different workspaces; they are never
  merged into one launch (merging concurrent queries is the router's coalescer's job).
- `GpuShard.table_scanner` scans a range of the shard numbered from a table's first page;
  `GpuShard.write_pages` XORs page diffs into the device copy between scans.
- CUDA and allocation errors surface as `GpuError`; `scan_timed` also returns the h2d / kernel
  / d2h times measured with CUDA events (what they include: `PhaseTimings`).

Apart from the engine (gpu.py), which chooses the layout and compiles the kernels once for all
its shards. Like it, this module imports without CuPy, Ray or pydantic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from morphogen.constants import MAX_DOMAIN_BITS, PAGE_SIZE, packed_levels
from morphogen.engine.base import check_domain, check_pages
from morphogen.engine.gpu_backend import Backend, DeviceInfo
from morphogen.engine.gpu_bench import read_bandwidth
from morphogen.engine.gpu_errors import cuda_errors
from morphogen.engine.gpu_kernels import READ_BW_KERNEL, U32, CompiledKernels
from morphogen.engine.gpu_keys import key_words, pack_keys
from morphogen.engine.gpu_launch import DeviceCopy, scan_args
from morphogen.engine.gpu_plan import (
    LANES_PER_PAGE,
    REDUCE_KERNEL,
    REDUCE_LANES,
    REDUCE_SLICES,
    LaunchPlan,
    plan_launch,
    reduce_grid,
)
from morphogen.engine.gpu_pool import Workspace, WorkspacePool, fit_pool_size
from morphogen.engine.gpu_tables import GpuTableScanner, ScanRange
from morphogen.engine.gpu_timings import PhaseTimings
from morphogen.engine.gpu_upload import upload_pages, upload_sliced_pages
from morphogen.engine.gpu_writes import (
    PATCH_PAGES_KERNEL,
    PATCH_SLICED_KERNEL,
    DeviceWriter,
    ScanGate,
    buffer_slots,
)
from morphogen.engine.sliced import (
    SLICE_BYTES,
    SLICE_KERNEL,
    SLICE_PAGES,
    SlicedPlan,
    chunk_range,
    plan_sliced_launch,
)
from morphogen.protocol.dpf import DpfKey, KeyBatch, as_batch
from morphogen.protocol.packed import PackedKeyBatch

# The device layouts of a shard's pages, one per scan kernel: "fused" (scan_kernel.cu, pages as
# stored, integer AND-XOR) or "sliced" (sliced_scan_kernel.cu, pages bit-sliced at load,
# tensor-core AND-popc). The layout is one per shard: both would double the device memory a
# matrix needs.
SCAN_LAYOUTS = ("fused", "sliced")
# The layouts with packed-key kernels (docs/packed-keys.md): an engine of another layout
# advertises only v1 keys, so a party on its shards refuses packed ones.
PACKED_LAYOUTS = ("fused", "sliced")


class ShardSettings(Protocol):
    """What a shard takes from its engine (`GpuEngine`), read once when it loads."""

    backend: Backend
    info: DeviceInfo
    layout: str
    key_group_max: int
    max_keys: int
    load_chunk_bytes: int
    pool_size: int


class GpuShard:
    """One shard's pages on the device; `scan` is thread-safe."""

    packed_layouts = PACKED_LAYOUTS

    def __init__(
        self,
        engine: ShardSettings,
        compiled: CompiledKernels,
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
        self._whole = ScanRange(self.first_page, self.num_pages, self.first_page, table=False)
        self._partial_rows: int | None = None
        self._closed = False
        self._holders = 1  # share() adds one, close() drops one
        self._holders_lock = threading.Lock()
        backend = self._backend
        with cuda_errors(backend, "loading the pages"):
            with backend.activate():
                if self.layout == "sliced":
                    self._pages_dev = upload_sliced_pages(
                        backend, pages, self.first_page, engine.load_chunk_bytes,
                        compiled.kernels[SLICE_KERNEL], self._info.sm_count,
                    )
                    self._device_bytes = max(self._num_chunks, 1) * SLICE_BYTES
                else:
                    self._pages_dev = upload_pages(backend, pages, engine.load_chunk_bytes)
                    self._device_bytes = max(self.num_pages, 1) * PAGE_SIZE
                self._partial_rows = self._max_partial_rows()
                pool = self._fit_pool(engine.pool_size)
                workspaces = [
                    Workspace(backend, i, self._max_keys, self._partial_rows) for i in range(pool)
                ]
        self._pool = WorkspacePool(workspaces)
        self.pool_size = pool
        self._gate = ScanGate()
        patch = PATCH_SLICED_KERNEL if self.layout == "sliced" else PATCH_PAGES_KERNEL
        self._writer = DeviceWriter(backend, compiled.kernels[patch], self._info.sm_count)
        self._warm_up(workspaces[0])

    # -- sizing ------------------------------------------------------------------------------

    def _plan(self, num_keys: int, domain_bits: int, num_pages: int,
              rng: ScanRange, packed: bool = False) -> LaunchPlan | SlicedPlan:
        """The launch for `num_keys` keys over the first `num_pages` pages of `rng` (all of
        them, except in the warm-up); for the sliced layout, over the chunks that hold them.
        `packed`: keys of the packed format."""
        if self.layout == "sliced":
            chunks = (chunk_range(rng.first_page, num_pages)[1] if rng.table
                      else self._chunks_holding(num_pages))
            return plan_sliced_launch(
                num_keys,
                max(1, chunks),
                domain_bits,
                sm_count=self._info.sm_count,
                blocks_per_sm=self._compiled.blocks_per_sm,
                max_partial_rows=self._partial_rows,
                table=rng.table,
                packed=packed,
            )
        return plan_launch(
            num_keys,
            num_pages,
            domain_bits,
            sm_count=self._info.sm_count,
            blocks_per_sm=self._compiled.blocks_per_sm,
            key_group_max=self._key_group_max,
            max_partial_rows=self._partial_rows,
            packed=packed,
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
        per = Workspace.device_bytes(self._max_keys, self._partial_rows)
        return fit_pool_size(wanted, per, self._backend.free_memory())

    # -- scanning ----------------------------------------------------------------------------

    def scan(self, keys: Sequence[DpfKey] | KeyBatch | PackedKeyBatch) -> np.ndarray:
        return self.scan_timed(keys)[0]

    def scan_timed(self, keys: Sequence[DpfKey] | KeyBatch | PackedKeyBatch
                   ) -> tuple[np.ndarray, PhaseTimings]:
        """The answers and where the time went (see PhaseTimings)."""
        return self.scan_range_timed(keys, self._whole)

    def table_scanner(self, first_page: int, num_pages: int,
                      first_index: int) -> GpuTableScanner:
        """A scanner of this shard's global pages [first_page, first_page + num_pages), the
        keys evaluated at `first_index` onwards (a table's part: first_index = first_page -
        table.first_page), scanned on the device copy at any offset (sliced_table_kernel.cu);
        no memory of its own."""
        rng = ScanRange.of_table(first_page, num_pages, first_index, self.first_page,
                                 self.num_pages)
        return GpuTableScanner(self, rng)

    def scan_range_timed(self, keys: Sequence[DpfKey] | KeyBatch | PackedKeyBatch,
                         rng: ScanRange) -> tuple[np.ndarray, PhaseTimings]:
        """`scan_timed` over the pages of `rng` (the whole shard, or a table's part)."""
        if self._closed:
            raise RuntimeError("the shard is closed")
        start = time.perf_counter()
        packed = isinstance(keys, PackedKeyBatch)
        batch = keys if packed else as_batch(keys)
        if packed and self.layout not in self.packed_layouts:
            raise ValueError(f"the {self.layout} layout does not scan packed keys")
        check_domain(batch, rng.first_index, rng.num_pages)
        k = len(batch)
        if rng.num_pages == 0:
            zero = PhaseTimings(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)
            return np.zeros((k, PAGE_SIZE), np.uint8), zero
        result = np.empty((k, PAGE_SIZE), np.uint8)
        d = batch.domain_bits
        h2d = kern = d2h = 0.0
        launches = shared = 0
        with self._pool.lease() as lease, self._gate.scan() as generation:
            ws = lease.workspace
            for lo in range(0, k, self._max_keys):
                part = batch.select(lo, min(k, lo + self._max_keys))
                n = len(part)
                pack_keys(part, ws.keys_host)
                with cuda_errors(self._backend, "running a scan"):
                    out = self._launch(ws, n, d, rng.num_pages, rng, packed)
                    times = self._phase_times(ws)
                result[lo : lo + n] = out
                h2d, kern, d2h = h2d + times[0], kern + times[1], d2h + times[2]
                launches += 1
                shared += self._pool.overlapped(lease)
        timings = PhaseTimings(
            h2d_ms=h2d,
            kernel_ms=kern,
            d2h_ms=d2h,
            wait_ms=lease.wait_ms,
            total_ms=(time.perf_counter() - start) * 1e3,
            launches=launches,
            shared_launches=shared,
            generation=generation,
        )
        return result, timings

    # -- page updates ------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        """Writes applied to the device copy so far (PhaseTimings.generation of a scan)."""
        return self._gate.generation

    def write_pages(self, pages: Sequence[int] | np.ndarray, diffs: np.ndarray) -> int:
        """XOR `diffs` ((n, 4096) uint8, PageUpdate diffs) into global `pages` of the device
        copy, in place (gpu_writes.py): the scans in flight finish on the data they started
        on, the ones after read the new data, and no answer pays for the write afterwards.
        Returns the generation the write made (scans report the one they read)."""
        if self._closed:
            raise RuntimeError("the shard is closed")
        base = self._first_chunk * SLICE_PAGES if self.layout == "sliced" else self.first_page
        slots, diffs = buffer_slots(pages, diffs, self.first_page, self.num_pages, base)
        with self._gate.write(), cuda_errors(self._backend, "writing pages"):
            self._writer.apply(slots, diffs, self._pages_dev)
        return self._gate.generation

    def _launch(
        self, ws: Workspace, num_keys: int, domain_bits: int, num_pages: int,
        rng: ScanRange, packed: bool = False,
    ) -> np.ndarray:
        """Keys already packed in ws.keys_host; returns a view of ws.out_host (num_keys rows)."""
        b = self._backend
        plan = self._plan(num_keys, domain_bits, num_pages, rng, packed)
        kernels = self._compiled.kernels
        levels = packed_levels(domain_bits) if packed else domain_bits
        key_bytes = num_keys * key_words(levels) * 4
        out_bytes = num_keys * PAGE_SIZE
        copy = DeviceCopy(self._pages_dev, self.first_page, self.num_pages, self._first_chunk)
        threads, args = scan_args(b, copy, plan, rng, num_pages, num_keys, domain_bits, levels,
                                  packed, ws.keys_dev, ws.partial_dev)
        reduce_args = (
            ws.partial_dev, ws.out_dev, U32(plan.page_blocks), U32(num_keys * LANES_PER_PAGE),
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

    def _phase_times(self, ws: Workspace) -> tuple[float, float, float]:
        """(key copy, scan + reduce, answer copy) ms of the launch just synchronized on `ws`:
        spans of the workspace stream's timeline, waits for the device included (PhaseTimings)."""
        b = self._backend
        e0, e1, e2, e3 = ws.events
        return b.elapsed_ms(e0, e1), b.elapsed_ms(e1, e2), b.elapsed_ms(e2, e3)

    def _warm_up(self, ws: Workspace) -> None:
        """Runs every scan variant once on a few pages, so the first request pays no lazy
        module loading, and a kernel that cannot launch fails the load, not a request."""
        if self.num_pages == 0:
            return
        d = max(1, (self.first_page + self.num_pages - 1).bit_length())
        pages = min(self.num_pages, 256)
        warmed: set[str] = set()
        # the table kernels too, over a range starting at the shard's first page
        table = ScanRange(self.first_page, pages, 0, table=True)
        formats = (False, True) if self.layout in self.packed_layouts else (False,)
        with cuda_errors(self._backend, "warming the kernels"):
            for n in range(1, self._max_keys + 1):
                for rng, dom in ((self._whole, d), (table, max(1, (pages - 1).bit_length()))):
                    for packed in formats:
                        kernel = self._plan(n, dom, pages, rng, packed).kernel
                        if kernel in warmed:
                            continue
                        warmed.add(kernel)
                        words = key_words(packed_levels(dom) if packed else dom)
                        ws.keys_host[: n * words] = 0  # any seeds; the answer is discarded
                        self._launch(ws, n, dom, pages, rng, packed)

    # -- benchmark support -------------------------------------------------------------------

    def read_pages_timed(self, repeats: int = 1) -> tuple[float, bytes]:
        """A plain read of every byte of the device copy with the bandwidth kernel: (best ms,
        XOR of all its 16-byte words). The benchmark's yardstick: what the card reads in the
        same run. For the sliced layout the XOR is sliced.sliced_digest's, not the pages'."""
        return read_bandwidth(
            self._backend, self._compiled.kernels[READ_BW_KERNEL], self._pages_dev,
            self._device_bytes if self.num_pages else 0, self._info.sm_count, repeats,
        )

    def share(self) -> GpuShard:
        """Another holder of this device copy (a rotation that writes its diff into it): the
        copy is freed when every holder has closed it."""
        with self._holders_lock:
            if self._closed:
                raise RuntimeError("the shard is closed")
            self._holders += 1
        return self

    def close(self) -> None:
        """Drops one holder; the last one waits for the scans in flight, then frees the
        device memory."""
        with self._holders_lock:
            if self._closed:
                return
            self._holders -= 1
            if self._holders > 0:
                return
            self._closed = True
        self._pool.close()
        self._pages_dev = None
