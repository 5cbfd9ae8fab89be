"""The fused, multi-threaded CPU scan kernel (numba).

Each worker owns a contiguous, tile-aligned run of pages. Per tile it expands every key's
subtree into a small mask buffer, then streams each page of the tile once and applies ALL keys
to it while it sits in L1: one pass over memory per call however many keys it carries.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from morphogen._dpf_jit import eval_range_into

U64_PER_PAGE = 512


@nb.njit(inline="always", cache=True)
def _and_xor_page(acc, page, m0, m1):
    # four u64 per step in the mask's (m0, m1) period: one 32-byte AND + XOR for AVX2
    for j in range(0, U64_PER_PAGE, 4):
        acc[j] ^= page[j] & m0
        acc[j + 1] ^= page[j + 1] & m1
        acc[j + 2] ^= page[j + 2] & m0
        acc[j + 3] ^= page[j + 3] & m1


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


# From this many keys on, keys are the vectorised dimension: accumulators are laid out
# (512, keys) so one 32-byte op serves four keys of one page word. Below it, too few keys fill
# a vector and the per-key layout (vectorised along the page) is faster.
MIN_KEYS_TRANSPOSED = 8


def padded_keys(n_keys: int) -> int:
    return (n_keys + 3) // 4 * 4


@nb.njit(inline="always", cache=True)
def _and_xor_page_keys(acc_t, page, m0, m1, n_keys):
    """acc_t[j, k] ^= page[j] & mask_k word (j % 2), for all keys k at once."""
    for j in range(0, U64_PER_PAGE, 2):
        a = acc_t[j]
        b = acc_t[j + 1]
        x = page[j]
        y = page[j + 1]
        for k in range(n_keys):
            a[k] ^= x & m0[k]
        for k in range(n_keys):
            b[k] ^= y & m1[k]


@nb.njit(parallel=True, cache=True)
def scan_pages(
    pages, first_page, d, roots, root_ts, cws, tcws, finals,
    tile, acc, acc_t, masks, masks64, masks_t, sa, sta, sb, stb, out,
):
    """out[k] (as 512 u64) = XOR over pages i of pages[i] AND tile(mask_k(first_page + i)).

    pages: (n, 512) u64. Per worker w: acc[w] (>=K, 512) or acc_t[w] (512, >=Kpad) u64
    accumulators; masks/masks64[w] (>=K, tile, 4|2) u32|u64 views of one buffer and masks_t[w]
    (tile, 2, >=Kpad) u64 their transpose; sa/sb (W, 4, L) u32, sta/stb (W, L) u32 scratch.
    """
    n = pages.shape[0]
    n_keys = roots.shape[0]
    transposed = n_keys >= MIN_KEYS_TRANSPOSED
    kp = (n_keys + 3) // 4 * 4
    workers = acc.shape[0]
    for w in nb.prange(workers):
        if transposed:
            acc_t[w, :, :kp] = 0
            masks_t[w, :, :, :kp] = 0
        else:
            acc[w, :n_keys, :] = 0
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
            if transposed:
                for p in range(count):
                    for k in range(n_keys):
                        masks_t[w, p, 0, k] = masks64[w, k, p, 0]
                        masks_t[w, p, 1, k] = masks64[w, k, p, 1]
                for p in range(count):
                    _and_xor_page_keys(
                        acc_t[w], pages[pos + p], masks_t[w, p, 0], masks_t[w, p, 1], kp
                    )
            else:
                for p in range(count):
                    page = pages[pos + p]
                    for k in range(n_keys):
                        _and_xor_page(acc[w, k], page, masks64[w, k, p, 0], masks64[w, k, p, 1])
            pos = end
    for k in range(n_keys):
        for j in range(U64_PER_PAGE):
            x = np.uint64(0)
            for w in range(workers):
                x ^= acc_t[w, j, k] if transposed else acc[w, k, j]
            out[k, j] = x
