"""Tables on a GPU shard: a page range of the shard's device copy, scanned in place.

A table query evaluates its keys at `page - table.first_page`, and a table may start and stop
at any page, so its range rarely falls on the sliced layout's 256-page chunks. The table
kernels (sliced_table_kernel.cu) read the chunks holding the range and shift the masks of the
table's DPF subtrees onto them; the fused layout stores pages as they are, so a view at the
range's first page is enough there. Either way a table scan reads only the chunks of its range,
at the bandwidth of a whole-shard scan, and needs no copy of the pages (docs/gpu.md, "Tables").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.engine.gpu_backend import Backend
from morphogen.engine.gpu_kernels import U32, U64
from morphogen.engine.gpu_plan import LaunchPlan
from morphogen.engine.gpu_timings import PhaseTimings
from morphogen.engine.sliced import SLICE_BYTES, SLICE_PAGES, SlicedPlan, chunk_range
from morphogen.protocol.dpf import DpfKey, KeyBatch

if TYPE_CHECKING:
    from morphogen.engine.gpu_shard import GpuShard


@dataclass(frozen=True)
class ScanRange:
    """Global pages [first_page, first_page + num_pages) of a shard, their DPF indices from
    `first_index` on; `table`: scanned by the table kernels (a whole shard is not)."""

    first_page: int
    num_pages: int
    first_index: int
    table: bool

    @classmethod
    def of_table(cls, first_page: int, num_pages: int, first_index: int, shard_first: int,
                 shard_pages: int) -> ScanRange:
        """A table's part in the shard [shard_first, shard_first + shard_pages), checked."""
        if not (shard_first <= first_page and num_pages >= 1
                and first_page + num_pages <= shard_first + shard_pages):
            raise ValueError(f"pages [{first_page}, {first_page + num_pages}) are not in the "
                             f"shard [{shard_first}, {shard_first + shard_pages})")
        if not 0 <= first_index <= first_page:
            raise ValueError("first_index must be in 0..first_page (a table starts at page "
                             "first_page - first_index)")
        return cls(first_page, num_pages, first_index, table=True)


class GpuTableScanner:
    """A ShardScanner over a range of a GpuShard's device copy (GpuShard.table_scanner). It
    holds no device memory: closing it leaves the shard alone, and it scans only while the
    shard is open."""

    def __init__(self, shard: GpuShard, rng: ScanRange) -> None:
        self._shard = shard
        self._range = rng
        self.num_pages = rng.num_pages
        self.first_page = rng.first_index  # the ShardScanner contract: its keys' numbering

    def scan(self, keys: Sequence[DpfKey] | KeyBatch) -> np.ndarray:
        return self.scan_timed(keys)[0]

    def scan_timed(self, keys: Sequence[DpfKey] | KeyBatch) -> tuple[np.ndarray, PhaseTimings]:
        return self._shard.scan_range_timed(keys, self._range)

    def close(self) -> None:
        pass


def table_launch_args(
    backend: Backend, pages_dev: Any, shard_first_page: int, plan: LaunchPlan | SlicedPlan,
    num_pages: int, rng: ScanRange, keys: Any, num_keys: int, domain_bits: int, partial: Any,
) -> tuple[Any, ...]:
    """The kernel arguments of a scan of `rng`'s first `num_pages` pages: a view of the device
    copy from the chunk (sliced) or the page (fused) holding the range's first page."""
    if isinstance(plan, SlicedPlan):
        c_lo, count = chunk_range(rng.first_page, num_pages)
        table_first = rng.first_page - rng.first_index  # the table's first page
        offset = (c_lo - shard_first_page // SLICE_PAGES) * SLICE_BYTES
        return (backend.view(pages_dev, offset), U64(count),
                U64(c_lo - table_first // SLICE_PAGES),  # the table subtree of chunk c_lo
                keys, U32(num_keys), U32(domain_bits), U32(plan.num_groups), partial,
                U32(table_first % SLICE_PAGES),
                U64(rng.first_index), U64(rng.first_index + num_pages))
    offset = (rng.first_page - shard_first_page) * PAGE_SIZE
    return (backend.view(pages_dev, offset), U64(num_pages), U64(rng.first_index), keys,
            U32(num_keys), U32(domain_bits), U32(plan.tile_bits), U32(plan.num_groups), partial)

