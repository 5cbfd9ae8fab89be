"""The CPU scan kernel for packed keys (numba, multi-threaded): pages XORed into buckets named by
the keys' bits.

A packed key's leaf holds the selection bits of 128 pages, so a worker expands each key's
leaves for a tile of pages (one PRG call per 128 pages per key, a few microseconds a tile).

The keys are cut into groups of at most eight. A page's bits under a group's keys form a
pattern (0..255), and the page is XORed into that group's bucket for the pattern: one whole-page
XOR a group, however many of its keys select the page. After the pass, key b of a group is the
XOR of the buckets whose pattern has bit b set, which a fold gets in two row XORs a bucket
(`_fold`). 24 keys cost three page XORs a page instead of twelve; a key XORing the pages it
selects into its own accumulator costs half a page XOR a page, and the method of Four Russians
over eight pages 2.75 plus a quarter a key.

Every page is XORed into one bucket of each group whatever its bits (pattern 0's bucket is
simply never read), so the work does not depend on the keys' bits.

Patterns come eight pages at a time: each key of a group gives the byte of its leaf word that
covers the eight pages, the bytes stacked as the rows of an 8x8 bit matrix whose transpose
(`_transpose8`) has the eight pages' patterns as its rows: a few ALU operations for eight
pages, where bit by bit the patterns alone took a fifth of the pass at 24 keys.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from morphogen.engine._cpu_kernel import U64_PER_PAGE, _worker_bounds
from morphogen.protocol._dpf_jit import eval_range_into

LEAF_SHIFT = 7
LEAF_PAGES = 1 << LEAF_SHIFT
# A group's keys: 2^8 buckets of 4 KiB (1 MiB) a group.
MAX_GROUP_KEYS = 8

_M1 = np.uint64(0x00AA00AA00AA00AA)
_M2 = np.uint64(0x0000CCCC0000CCCC)
_M3 = np.uint64(0x00000000F0F0F0F0)


@nb.njit(inline="always", cache=True)
def _xor_into(dst, src):
    for i in range(U64_PER_PAGE):
        dst[i] ^= src[i]


@nb.njit(inline="always", cache=True)
def _xor2_into(d0, d1, src):
    for i in range(U64_PER_PAGE):
        v = src[i]
        d0[i] ^= v
        d1[i] ^= v


@nb.njit(inline="always", cache=True)
def _page_into(bk, rows, groups, page):
    """The page XORed into bucket rows[j] of each group j, two groups a pass over the page.

    A pair reads the page once for two buckets: with 2 threads over 256 MiB (bench/scan_cpu.py,
    medians of three alternating runs) 4 queries took 11.2 ms a call, not 12.3; 8 queries
    17.0, not 17.7; 16 queries 28.6, not 33.3. Three groups a pass were slower than two at 8 and
    16 queries.
    """
    for j in range(0, groups - 1, 2):
        _xor2_into(bk[rows[j]], bk[rows[j + 1]], page)
    if groups & 1:
        _xor_into(bk[rows[groups - 1]], page)


@nb.njit(inline="always", cache=True)
def _transpose8(x):
    """The 8x8 bit matrix with element (r, c) at bit 8r + c, transposed."""
    t = (x ^ (x >> np.uint64(7))) & _M1
    x = x ^ t ^ (t << np.uint64(7))
    t = (x ^ (x >> np.uint64(14))) & _M2
    x = x ^ t ^ (t << np.uint64(14))
    t = (x ^ (x >> np.uint64(28))) & _M3
    return x ^ t ^ (t << np.uint64(28))


@nb.njit(inline="always", cache=True)
def _fold(acc, bk, base, k0, size):
    """acc[k0 + b] = XOR of the group's buckets bk[base + pattern] whose pattern has bit b.

    Top bit first: its key takes the upper half's XOR, then the upper half is folded onto the
    lower, which keeps every lower bit's XOR. The buckets are consumed.
    """
    for b in range(size - 1, -1, -1):
        half = 1 << b
        a = acc[k0 + b]
        a[:] = 0
        for pat in range(half, 2 * half):
            _xor_into(a, bk[base + pat])
        for pat in range(half):
            _xor_into(bk[base + pat], bk[base + half + pat])


@nb.njit(cache=True)
def _scan_share(
    pages, first_page, levels, roots, root_ts, cws, tcws, finals, tile, acc, leaves, leaves64,
    sa, sta, sb, stb, bk, group_keys, group_rows, rows, lo, hi,
):
    """One worker's pages [lo, hi) into its buckets `bk`, then its keys folded into `acc`."""
    n_keys = roots.shape[0]
    groups = group_rows.shape[0]
    bk[:rows, :] = 0
    pat8 = np.zeros(groups, np.uint64)
    prow = np.zeros(groups, np.int64)
    pos = lo
    while pos < hi:
        g = first_page + pos
        end = min(hi, pos + (tile - g % tile))
        leaf0 = g >> LEAF_SHIFT
        leaf1 = ((first_page + end - 1) >> LEAF_SHIFT) + 1
        for k in range(n_keys):
            eval_range_into(
                roots[k], root_ts[k], cws[k], tcws[k], finals[k], levels, leaf0, leaf1,
                leaves[k], sa, sta, sb, stb,
            )
        p = pos
        while p < end:
            gp = first_page + p
            li = (gp >> LEAF_SHIFT) - leaf0
            bit = gp & (LEAF_PAGES - 1)
            word = bit >> 6
            shift = np.uint64(bit & 63)
            if gp & 7 == 0 and p + 8 <= end:
                # eight pages in one byte of each key's leaf word
                for j in range(groups):
                    k0 = group_keys[j]
                    x = np.uint64(0)
                    for k in range(k0, group_keys[j + 1]):
                        byte = (leaves64[k, li, word] >> shift) & np.uint64(0xFF)
                        x |= byte << np.uint64(8 * (k - k0))
                    pat8[j] = _transpose8(x)
                for i in range(8):
                    page = pages[p + i]
                    s = np.uint64(8 * i)
                    for j in range(groups):
                        prow[j] = group_rows[j] + np.int64((pat8[j] >> s) & np.uint64(0xFF))
                    _page_into(bk, prow, groups, page)
                p += 8
            else:
                page = pages[p]
                for j in range(groups):
                    k0 = group_keys[j]
                    pat = np.uint64(0)
                    for k in range(k0, group_keys[j + 1]):
                        b = (leaves64[k, li, word] >> shift) & np.uint64(1)
                        pat |= b << np.uint64(k - k0)
                    prow[j] = group_rows[j] + np.int64(pat)
                _page_into(bk, prow, groups, page)
                p += 1
        pos = end
    for j in range(groups):
        k0 = group_keys[j]
        _fold(acc, bk, group_rows[j], k0, group_keys[j + 1] - k0)


@nb.njit(parallel=True, cache=True)
def scan_packed(
    pages, first_page, levels, roots, root_ts, cws, tcws, finals,
    tile, acc, leaves, leaves64, sa, sta, sb, stb, out, buckets, group_keys, group_rows, rows,
):
    """out[k] (512 u64) = XOR of pages[i] over the i whose bit of key k is set.

    pages: (n, 512) u64; `tile` a multiple of 128 pages (tiles are leaf-aligned in global
    numbering). Groups: keys group_keys[j]..group_keys[j+1]-1 (at most 8), their buckets rows
    group_rows[j]..+2^size of buckets[w], `rows` in all (`plan_groups`). Per worker w: acc[w]
    (>=K, 512) u64, buckets[w] (>=rows, 512) u64, leaves/leaves64[w] (>=K, tile/128 + 1,
    4|2) u32|u64 views of one buffer, sa/sb[w] (4, L) u32 and sta/stb[w] (L,) u32 scratch.
    """
    n = pages.shape[0]
    n_keys = roots.shape[0]
    workers = acc.shape[0]
    for w in nb.prange(workers):
        lo, hi = _worker_bounds(first_page, n, tile, workers, w)
        if hi <= lo:  # no pages (a shard smaller than the workers' tiles): no buckets either
            acc[w, :n_keys, :] = 0
        else:
            _scan_share(
                pages, first_page, levels, roots, root_ts, cws, tcws, finals, tile, acc[w],
                leaves[w], leaves64[w], sa[w], sta[w], sb[w], stb[w], buckets[w], group_keys,
                group_rows, rows, lo, hi,
            )
    for k in range(n_keys):
        for i in range(U64_PER_PAGE):
            x = np.uint64(0)
            for w in range(workers):
                x ^= acc[w, k, i]
            out[k, i] = x


def plan_groups(n_keys: int, pages_per_worker: int, max_group_keys: int = MAX_GROUP_KEYS):
    """(group_keys, group_rows, rows: the buckets in all) for a call: the fewest groups of at
    most `max_group_keys` keys, or more and smaller ones where the shard is so small that
    clearing and folding the buckets (about three row passes a bucket) would cost more than the
    XORs they save.

    Groups are as even as possible (at 12 keys 6 + 6, 128 buckets, not 8 + 4, 272).
    """
    cap = max(1, min(int(max_group_keys), MAX_GROUP_KEYS))
    best = None
    for count in range(-(-n_keys // cap), n_keys + 1):
        q, r = divmod(n_keys, count)
        sizes = [q + 1] * r + [q] * (count - r)
        rows = sum(1 << s for s in sizes)
        cost = pages_per_worker * count + 3 * rows
        if best is None or cost < best[0]:
            best = (cost, sizes, rows)
    _, sizes, rows = best
    group_keys = np.zeros(len(sizes) + 1, np.int64)
    group_keys[1:] = np.cumsum(sizes)
    group_rows = np.zeros(len(sizes), np.int64)
    group_rows[1:] = np.cumsum([1 << s for s in sizes[:-1]])
    return group_keys, group_rows, rows
