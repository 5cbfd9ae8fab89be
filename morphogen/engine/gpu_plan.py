"""Launch geometry of the fused scan (scan_kernel.cu) and its planning: pure arithmetic, no CUDA.

The geometry constants here are the kernel's: `gpu_kernels.kernel_source()` hands them to the
CUDA program as generated `#define` lines, so the host's plan and the kernel's indexing cannot
drift apart. `plan_launch` turns a key count, a page count and the device's occupancy into the
grid of one scan launch; the reduce launch that follows it is `reduce_grid`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from morphogen.constants import MAX_DOMAIN_BITS, PAGE_SIZE

# Kernel geometry (generated into the CUDA source as #defines of the same names).
SCAN_THREADS = 128  # threads of a scan block
LANES_PER_PAGE = PAGE_SIZE // 16  # 16-byte lanes of a page
LANES_PER_THREAD = LANES_PER_PAGE // SCAN_THREADS  # lanes tid + i * SCAN_THREADS of every page
MAX_TILE_BITS = 10  # a tile is at most 2^10 pages
PATH_SLOTS = MAX_DOMAIN_BITS + 1  # nodes of a cached root-to-subtree path, the root included
REDUCE_LANES = 16  # lanes of the reduce block ...
REDUCE_SLICES = 16  # ... times slices of the partial rows it folds side by side

# The scan kernel's variants: keys per block (one kernel each, instantiated in scan_kernel.cu).
KEY_GROUP_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
SCAN_KERNELS = tuple(f"morphogen_scan_k{kg}" for kg in KEY_GROUP_SIZES)
REDUCE_KERNEL = "morphogen_xor_reduce"
# The packed-key scan (packed_scan_kernel.cu): the same key groups, tiles counted in leaves.
PACKED_KERNELS = tuple(f"morphogen_packed_k{kg}" for kg in KEY_GROUP_SIZES)
LEAF_BITS = 7  # a packed key's leaf holds the selection bits of 2^7 pages

# Dynamic shared memory a scan block may use without an opt-in attribute; tiles are sized to it.
SMEM_BUDGET = 48 * 1024
DEFAULT_KEY_GROUP_MAX = 16
# A page block shorter than this spends more on its tile expansions than on its pages.
MIN_PAGES_PER_BLOCK = 64


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


def choose_leaf_tile_bits(key_group: int, levels: int) -> int:
    """A packed scan's tile, 2^h leaves (h <= levels): just enough leaves that the last level
    of its expansion gives every thread of the block one PRG call (key_group << h >=
    SCAN_THREADS). A larger tile would only add expansion a block's edges waste; the
    expansion is 1/128 of the pages' cost either way."""
    h = 0
    while (key_group << h) < SCAN_THREADS and h < min(levels, MAX_TILE_BITS):
        h += 1
    while h > 0 and scan_smem_bytes(key_group, h) > SMEM_BUDGET:
        h -= 1
    return h


class BlockGrid:
    """What either scan layout's plan derives from its shape: `num_groups` key groups times
    `page_blocks` page blocks, each block writing one partial row per key."""

    num_keys: int
    num_groups: int
    page_blocks: int

    @property
    def grid(self) -> int:
        return self.num_groups * self.page_blocks

    @property
    def partial_bytes(self) -> int:
        return self.page_blocks * self.num_keys * PAGE_SIZE

    @property
    def reduce_grid(self) -> int:
        return reduce_grid(self.num_keys)


@dataclass(frozen=True)
class LaunchPlan(BlockGrid):
    """One fused launch: `grid` blocks of SCAN_THREADS, then one reduce launch."""

    kernel: str
    num_keys: int
    key_group: int
    num_groups: int
    page_blocks: int
    tile_bits: int
    smem_bytes: int


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
    packed: bool = False,
) -> LaunchPlan:
    """Grid shape for `num_keys` keys over `num_pages` pages.

    One wave of resident blocks (`sm_count * blocks_per_sm(kernel, smem)`) split between the
    key groups; each block then streams a contiguous page range (persistent blocks keep the
    accumulators in registers, and the per-block partials stay few). `max_partial_rows`
    bounds page_blocks * num_keys to the workspace's partial buffer; `page_blocks` overrides
    the choice (tests use it to exercise many blocks on few pages). `packed`: the packed-key
    kernel (PACKED_KERNELS), its tile_bits counting leaves of the key's `domain_bits - 7`
    levels.
    """
    if not 1 <= domain_bits <= MAX_DOMAIN_BITS:
        raise ValueError(f"domain bits must be in 1..{MAX_DOMAIN_BITS}, got {domain_bits}")
    if num_pages < 1:
        raise ValueError("a launch needs at least one page")
    if key_group_max not in KEY_GROUP_SIZES:
        raise ValueError(f"key_group_max must be one of {KEY_GROUP_SIZES}, got {key_group_max}")
    kg, groups = choose_key_group(num_keys, key_group_max)
    if packed:
        h = choose_leaf_tile_bits(kg, max(0, domain_bits - LEAF_BITS))
        kernel = f"morphogen_packed_k{kg}"
    else:
        h = choose_tile_bits(kg, domain_bits)
        kernel = f"morphogen_scan_k{kg}"
    smem = scan_smem_bytes(kg, h)
    if page_blocks is None:
        resident = sm_count * max(1, int(blocks_per_sm(kernel, smem)))
        page_blocks = max(1, resident // groups)
        page_blocks = min(page_blocks, max(1, -(-num_pages // MIN_PAGES_PER_BLOCK)))
    if max_partial_rows is not None:
        page_blocks = min(page_blocks, max(1, max_partial_rows // num_keys))
    if page_blocks < 1:
        raise ValueError("page_blocks must be at least 1")
    return LaunchPlan(kernel, num_keys, kg, groups, page_blocks, h, smem)
