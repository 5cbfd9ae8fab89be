"""The arguments of one scan launch, for every kernel the GPU engine plans: v1 or packed keys,
fused or sliced layout, a whole shard or a table's part (gpu_tables.ScanRange). Pure argument
building: the scalar types are the ones gpu_kernels.py's table names, the buffers the shard's
and the workspace's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from morphogen.constants import PAGE_SIZE
from morphogen.engine.gpu_backend import Backend
from morphogen.engine.gpu_kernels import U32, U64
from morphogen.engine.gpu_plan import SCAN_THREADS, LaunchPlan
from morphogen.engine.gpu_tables import ScanRange, table_launch_args
from morphogen.engine.sliced import (
    SLICE_BYTES,
    SLICE_PAGES,
    SLICED_THREADS,
    SlicedPlan,
    chunk_range,
)


@dataclass(frozen=True)
class DeviceCopy:
    """Where a shard's pages are on the device: its buffer, first global page, and for the
    sliced layout the global chunk the buffer starts at."""

    pages_dev: Any
    first_page: int
    num_pages: int
    first_chunk: int

    def chunks_holding(self, num_pages: int) -> int:
        """Sliced chunks holding the shard's first `num_pages` pages (at least one)."""
        return max(1, chunk_range(self.first_page, min(num_pages, self.num_pages))[1])


def sliced_packed_args(
    backend: Backend, copy: DeviceCopy, num_pages: int, rng: ScanRange, keys: Any,
    num_keys: int, levels: int, num_groups: int, partial: Any,
) -> tuple[Any, ...]:
    """The arguments of the packed sliced scan (sliced_packed_kernel.cu) over `rng`'s first
    `num_pages` pages, a whole shard or a table's part alike: a view from the chunk holding the
    range's first page, whose position there is the offset of the range's first key index."""
    c_lo, count = chunk_range(rng.first_page, num_pages)
    view = backend.view(copy.pages_dev, (c_lo - copy.first_chunk) * SLICE_BYTES)
    return (view, U64(count), U64(rng.first_index), keys, U32(num_keys), U32(levels),
            U32(num_groups), partial, U32(rng.first_page - c_lo * SLICE_PAGES),
            U64(rng.first_index), U64(rng.first_index + num_pages))


def scan_args(
    backend: Backend, copy: DeviceCopy, plan: LaunchPlan | SlicedPlan, rng: ScanRange,
    num_pages: int, num_keys: int, domain_bits: int, levels: int, packed: bool, keys: Any,
    partial: Any,
) -> tuple[int, tuple[Any, ...]]:
    """(threads a block, kernel arguments) of the scan launch `plan` over `rng`'s first
    `num_pages` pages; `levels`: the keys' tree levels (d for v1 keys, d - 7 for packed)."""
    if packed and isinstance(plan, LaunchPlan):
        # the fused layout stores pages as they are: a view at the range's first page,
        # numbered from its first index, serves a whole shard and a table alike
        view = (backend.view(copy.pages_dev, (rng.first_page - copy.first_page) * PAGE_SIZE)
                if rng.table else copy.pages_dev)
        return SCAN_THREADS, (view, U64(num_pages), U64(rng.first_index), keys, U32(num_keys),
                              U32(levels), U32(plan.tile_bits), U32(plan.num_groups), partial)
    if packed:
        return SLICED_THREADS, sliced_packed_args(backend, copy, num_pages, rng, keys, num_keys,
                                                  levels, plan.num_groups, partial)
    if rng.table:
        threads = SLICED_THREADS if isinstance(plan, SlicedPlan) else SCAN_THREADS
        return threads, table_launch_args(backend, copy.pages_dev, copy.first_page, plan,
                                          num_pages, rng, keys, num_keys, domain_bits, partial)
    if isinstance(plan, SlicedPlan):
        return SLICED_THREADS, (copy.pages_dev, U64(copy.chunks_holding(num_pages)),
                                U64(copy.first_chunk), keys, U32(num_keys), U32(domain_bits),
                                U32(plan.num_groups), partial)
    return SCAN_THREADS, (copy.pages_dev, U64(num_pages), U64(copy.first_page), keys,
                          U32(num_keys), U32(domain_bits), U32(plan.tile_bits),
                          U32(plan.num_groups), partial)
