"""The bit-sliced page layout of the tensor-core scan (sliced_scan_kernel.cu), host side.

Pure NumPy and arithmetic, no CUDA: the layout as a reference implementation (`slice_pages`),
the digest the read benchmark checks against, and the launch planning of the sliced scan.
The layout itself is described at the top of `sliced_scan_kernel.cu`; in short, pages are
grouped in 256-page chunks aligned in the global page numbering, and each chunk is stored as
the A fragments of `mma.m16n8k256 .b1`: bit position b, group G of 16 page lanes, warp lane
(g, tig), component r holds 32 pages' bits of one page lane at one bit position.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from morphogen.constants import MAX_DOMAIN_BITS, PAGE_SIZE
from morphogen.engine.gpu_plan import PATH_SLOTS, BlockGrid

# Layout and kernel geometry (generated into the CUDA source as #defines of the same names by
# gpu_kernels.kernel_source()).
SLICE_PAGES = 256  # pages per chunk: the K dimension of mma.m16n8k256
SLICE_BYTES = SLICE_PAGES * PAGE_SIZE
SLICE_U4 = SLICE_BYTES // 16  # uint4 per sliced chunk (1 MiB)
SLICED_THREADS = 256  # threads of a sliced-scan block: 8 warps
SLICED_TILE_BITS = SLICE_PAGES.bit_length() - 1  # log2(SLICE_PAGES): a chunk is one subtree
SLICED_TREE_SLOTS = SLICE_PAGES // 2  # nodes of the level above the leaves
LANE_BITS = 128  # bit positions of a 16-byte page lane
MT_STRIDE = LANE_BITS + 1  # u32 per (key, K-word) row of mt; the odd stride spreads banks
SLICE_KERNEL = "morphogen_slice_pages"
SLICE_THREADS = 256  # threads of a morphogen_slice_pages block
# n-tiles of 8 keys per block -> kernel; a block takes at most 8 * max(N_TILES) keys
N_TILES = (1, 2)
# The kernels: (n-tiles, L2 prefetch) each; the prefetching one only where it pays (see
# PREFETCH_MAX_GROUPS), as a kernel of its own so the others keep their registers.
SLICED_VARIANTS = ((1, False), (2, False), (2, True))


def sliced_kernel_name(n_tiles: int, prefetch: bool) -> str:
    return f"morphogen_sliced_scan_n{n_tiles}" + ("_prefetch" if prefetch else "")


SLICED_KERNELS = tuple(sliced_kernel_name(nt, pf) for nt, pf in SLICED_VARIANTS)


def table_kernel_name(n_tiles: int, prefetch: bool) -> str:
    """The variant of the table scan (sliced_table_kernel.cu): a page range starting and
    stopping anywhere, numbered from the table's first page."""
    return f"morphogen_sliced_table_n{n_tiles}" + ("_prefetch" if prefetch else "")


TABLE_KERNELS = tuple(table_kernel_name(nt, pf) for nt, pf in SLICED_VARIANTS)


def packed_kernel_name(n_tiles: int, prefetch: bool) -> str:
    """The variant of the packed-key scan (sliced_packed_kernel.cu), whole shards and tables."""
    return f"morphogen_sliced_packed_n{n_tiles}" + ("_prefetch" if prefetch else "")


SLICED_PACKED_KERNELS = tuple(packed_kernel_name(nt, pf) for nt, pf in SLICED_VARIANTS)
CHUNK_LEAVES = 3  # packed leaves a chunk's 256 selection bits can span
SLICED_MAX_GROUP_KEYS = 8 * max(N_TILES)

# Tuning switches of the sliced scan, generated as #defines like the geometry. Each changes the
# speed, never an answer; MORPHOGEN_GPU_TUNING overrides them for a run (gpu_kernels), which is
# how bench/gpu/variants.py compares them and tests/gpu checks the ones it tries.
# 1: the count parities are folded with IMADs (FMA pipe), two instructions an MMA on the integer
# pipe instead of four, as that pipe is the one the PRG saturates; 0: with byte permutes.
SLICED_FOLD_IMAD = 1
# The prefetching kernel: a warp asks L2 for the first SLICED_PREFETCH_ROUNDS bit-position rounds
# of a chunk's A fragments (8 KiB each) while the chunk's masks are expanded, then in each round
# for the round that far ahead of its MMAs; with SLICED_PREFETCH_BULK in one bulk prefetch
# (cp.async.bulk) by one lane, else a line prefetch per lane.
SLICED_PREFETCH_ROUNDS = 2
SLICED_PREFETCH_BULK = 1
SLICED_TUNING = {
    "SLICED_FOLD_IMAD": (0, 1),
    "SLICED_PREFETCH_ROUNDS": tuple(range(1, 17)),
    "SLICED_PREFETCH_BULK": (0, 1),
}
# Launches of 2 n-tiles and at most this many key groups prefetch. It pays where a chunk is read
# by few key groups, whose MMAs would otherwise each wait out an HBM latency (24 keys, 2 groups
# of 12, on an H100: 9.7 -> 9.0 ms on 16 GiB). With groups of 8 keys (two blocks an SM) the
# prefetched lines are evicted before use and read twice (3 keys: 6.0 -> 9.3 ms); with many
# groups L2 holds the chunk already (96 keys: 26.9 -> 27.8 ms). bench/gpu/NOTES.md.
PREFETCH_MAX_GROUPS = 2


def chunk_range(first_page: int, num_pages: int) -> tuple[int, int]:
    """(first global chunk, chunk count) holding global pages [first_page, first_page + n)."""
    if num_pages < 1:
        return first_page // SLICE_PAGES, 0
    first = first_page // SLICE_PAGES
    last = (first_page + num_pages - 1) // SLICE_PAGES
    return first, last - first + 1


def chunk_page_order() -> np.ndarray:
    """K position (kword * 32 + j) -> chunk page, as the kernels use it."""
    kw = np.arange(8)[:, None]
    j = np.arange(32)[None, :]
    return (64 * (kw >> 1) + 2 * j + (kw & 1)).reshape(-1)


def natural_chunks(pages: np.ndarray, first_page: int) -> np.ndarray:
    """The shard's pages placed in whole global-aligned chunks, zero outside the shard."""
    n = pages.shape[0]
    first, count = chunk_range(first_page, n)
    out = np.zeros((count * SLICE_PAGES, PAGE_SIZE), np.uint8)
    start = first_page - first * SLICE_PAGES
    out[start : start + n] = pages
    return out.reshape(count, SLICE_PAGES, PAGE_SIZE)


def slice_chunk(chunk: np.ndarray) -> np.ndarray:
    """One natural (256, 4096) chunk -> its 262144 sliced u32 words (the device's bytes)."""
    # bits[p][lane][b]: bit b (0..127) of page-lane `lane` of chunk page p
    bits = np.unpackbits(chunk.reshape(SLICE_PAGES, 256, 16), axis=2, bitorder="little")
    bits = bits[chunk_page_order()]  # K order: (kword = 4 rhi + tig, j)
    # K axis -> (rhi, tig, j); lane axis -> (G, rlo, g); r = rlo + 2 rhi
    bits = bits.reshape(2, 4, 32, 16, 2, 8, 128)
    # target order: b, G, g, tig, rhi, rlo, j
    bits = bits.transpose(6, 3, 5, 1, 0, 4, 2)
    packed = np.packbits(np.ascontiguousarray(bits), axis=-1, bitorder="little")
    return packed.reshape(-1).view("<u4").copy()


def slice_pages(pages: np.ndarray, first_page: int) -> np.ndarray:
    """The whole sliced buffer of a shard, as the device holds it (u32 words)."""
    chunks = natural_chunks(pages, first_page)
    if chunks.shape[0] == 0:
        return np.zeros(0, np.uint32)
    return np.concatenate([slice_chunk(c) for c in chunks])


def sliced_digest(pages: np.ndarray, first_page: int, step_chunks: int = 64) -> bytes:
    """XOR of every 16-byte word of the sliced buffer, without building it: slicing is linear
    over GF(2) and the same for every chunk, so it commutes with XOR-ing the chunks together."""
    n = pages.shape[0]
    if n == 0:
        return bytes(16)
    folded = np.zeros((SLICE_PAGES, PAGE_SIZE), np.uint8)
    start = first_page % SLICE_PAGES  # chunk offset of the shard's page 0
    head = min(n, (SLICE_PAGES - start) % SLICE_PAGES)
    folded[start : start + head] ^= pages[:head]
    whole = (n - head) // SLICE_PAGES * SLICE_PAGES
    step = step_chunks * SLICE_PAGES
    for lo in range(head, head + whole, step):
        block = np.asarray(pages[lo : min(lo + step, head + whole)])
        folded ^= np.bitwise_xor.reduce(block.reshape(-1, SLICE_PAGES, PAGE_SIZE), axis=0)
    tail = n - head - whole
    folded[:tail] ^= pages[head + whole :]
    words = slice_chunk(folded).reshape(-1, 4)
    return np.bitwise_xor.reduce(words, axis=0).astype("<u4").tobytes()


def sliced_smem_bytes(n_tiles: int, table: bool = False) -> int:
    """Dynamic shared memory of one sliced-scan block (see the kernel's layout comment); a
    table scan keeps a second subtree's transposed masks (sliced_table_kernel.cu)."""
    kg = 8 * n_tiles
    mt = 8 * MT_STRIDE * 4 * (2 if table else 1)
    per_key = SLICED_TREE_SLOTS * 16 + PATH_SLOTS * 16 + mt + SLICED_TREE_SLOTS
    return kg * (per_key + PATH_SLOTS)


def sliced_packed_smem_bytes(n_tiles: int) -> int:
    """Dynamic shared memory of one packed sliced-scan block: the answer rows (the chunk's
    leaves and selection words live in their head until then), and a cached path per key for
    each of a chunk's CHUNK_LEAVES leaves with the leaf it reached (sliced_packed_kernel.cu)."""
    kg = 8 * n_tiles
    return kg * PAGE_SIZE + CHUNK_LEAVES * kg * (PATH_SLOTS * 17 + 4)


@dataclass(frozen=True)
class SlicedPlan(BlockGrid):
    """One sliced launch: `grid` blocks of SLICED_THREADS, then the reduce launch."""

    kernel: str
    num_keys: int
    n_tiles: int
    num_groups: int
    page_blocks: int
    smem_bytes: int
    prefetch: bool = False


def plan_sliced_launch(
    num_keys: int,
    num_chunks: int,
    domain_bits: int,
    *,
    sm_count: int,
    blocks_per_sm: Callable[[str, int], int],
    max_partial_rows: int | None = None,
    page_blocks: int | None = None,
    table: bool = False,
    packed: bool = False,
) -> SlicedPlan:
    """Key groups of at most SLICED_MAX_GROUP_KEYS keys, split evenly (every block does the
    same PRG work); one wave of resident blocks shared between the groups, each block taking a
    contiguous run of chunks. `table`: the table scan's kernels (TABLE_KERNELS); `packed`: the
    packed-key kernels (SLICED_PACKED_KERNELS), which serve whole shards and tables alike."""
    if not 1 <= domain_bits <= MAX_DOMAIN_BITS:
        raise ValueError(f"domain bits must be in 1..{MAX_DOMAIN_BITS}, got {domain_bits}")
    if num_keys < 1:
        raise ValueError("a launch needs at least one key")
    if num_chunks < 1:
        raise ValueError("a launch needs at least one chunk")
    groups = -(-num_keys // SLICED_MAX_GROUP_KEYS)
    per_group = -(-num_keys // groups)
    nt = min(t for t in N_TILES if 8 * t >= per_group)
    prefetch = nt > 1 and groups <= PREFETCH_MAX_GROUPS
    if packed:
        kernel, smem = packed_kernel_name(nt, prefetch), sliced_packed_smem_bytes(nt)
    else:
        kernel = (table_kernel_name if table else sliced_kernel_name)(nt, prefetch)
        smem = sliced_smem_bytes(nt, table)
    if page_blocks is None:
        resident = sm_count * max(1, int(blocks_per_sm(kernel, smem)))
        page_blocks = max(1, min(num_chunks, resident // groups))
    if max_partial_rows is not None:
        page_blocks = min(page_blocks, max(1, max_partial_rows // num_keys))
    if page_blocks < 1:
        raise ValueError("page_blocks must be at least 1")
    return SlicedPlan(kernel, num_keys, nt, groups, page_blocks, smem, prefetch)
