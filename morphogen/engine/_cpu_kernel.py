"""The fused, multi-threaded CPU scan kernel (numba).

Each worker owns a contiguous, tile-aligned run of pages. Per tile it expands every key's
subtree into a small mask buffer, then streams each page of the tile once and applies ALL keys
to it while it sits in L1: one pass over memory per call however many keys it carries.

A mask repeats every 16 bytes (two u64 words), shorter than an AVX2 vector, so a loop over the
page words would need shuffles per key. Instead each page is split once into its even and odd
words; every key then costs two clean broadcast AND-XOR loops. Accumulators stay in that split
order until the end of the call.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from morphogen.protocol._dpf_jit import eval_range_into

U64_PER_PAGE = 512
_HALF = U64_PER_PAGE // 2


@nb.njit(inline="always", cache=True)
def _split_words(page, split):
    """split[:256] = even words of the page, split[256:] = odd words."""
    for i in range(_HALF):
        split[i] = page[2 * i]
        split[_HALF + i] = page[2 * i + 1]


@nb.njit(inline="always", cache=True)
def _and_xor_split(acc, split, m0, m1):
    for i in range(_HALF):
        acc[i] ^= split[i] & m0
    for i in range(_HALF, U64_PER_PAGE):
        acc[i] ^= split[i] & m1


@nb.njit(inline="always", cache=True)
def _worker_bounds(first_page, n, tile, workers, w):
    """Tile-aligned (global numbering) share [lo, hi) of worker w, as local page indices."""
    g_lo = first_page
    g_hi = first_page + n
    t_lo = g_lo // tile
    t_hi = (g_hi + tile - 1) // tile
    tiles = t_hi - t_lo
    a = t_lo + (tiles * w) // workers
    b = t_lo + (tiles * (w + 1)) // workers
    lo = max(g_lo, a * tile)
    hi = min(g_hi, b * tile)
    if hi < lo:
        hi = lo
    return lo - first_page, hi - first_page


@nb.njit(parallel=True, cache=True)
def scan_pages(
    pages, first_page, d, roots, root_ts, cws, tcws, finals,
    tile, acc, split, masks, masks64, sa, sta, sb, stb, out,
):
    """out[k] (as 512 u64) = XOR over pages i of pages[i] AND tile(mask_k(first_page + i)).

    pages: (n, 512) u64. Per worker w: acc[w] (>=K, 512) u64 accumulators in split order,
    split[w] (512,) u64, masks/masks64[w] (>=K, tile, 4|2) u32|u64 views of one buffer,
    sa/sb[w] (4, L) u32 and sta/stb[w] (L,) u32 subtree-expansion scratch.
    """
    n = pages.shape[0]
    n_keys = roots.shape[0]
    workers = acc.shape[0]
    for w in nb.prange(workers):
        a = acc[w]
        a[:n_keys, :] = 0
        sp = split[w]
        lo, hi = _worker_bounds(first_page, n, tile, workers, w)
        pos = lo
        while pos < hi:
            g = first_page + pos
            end = min(hi, pos + (tile - g % tile))
            count = end - pos
            for k in range(n_keys):
                eval_range_into(
                    roots[k], root_ts[k], cws[k], tcws[k], finals[k], d, g, g + count,
                    masks[w, k], sa[w], sta[w], sb[w], stb[w],
                )
            for p in range(count):
                _split_words(pages[pos + p], sp)
                for k in range(n_keys):
                    _and_xor_split(a[k], sp, masks64[w, k, p, 0], masks64[w, k, p, 1])
            pos = end
    for k in range(n_keys):
        for i in range(_HALF):
            even = np.uint64(0)
            odd = np.uint64(0)
            for w in range(workers):
                even ^= acc[w, k, i]
                odd ^= acc[w, k, _HALF + i]
            out[k, 2 * i] = even
            out[k, 2 * i + 1] = odd
