"""The CPU scan kernel for packed keys (numba, multi-threaded): a conditional XOR of whole pages.

A packed key's leaf holds the selection bits of 128 pages, so a worker expands each key's
leaves for a tile of pages (one PRG call per 128 pages per key, a few microseconds a tile) and
then streams the tile's pages once, eight at a time: for each key one loop over the page words
XORs into its accumulator the eight pages masked by the key's eight bits (`0 - bit`, all ones
or zero). A page's mask is the same for all its words, so no even/odd split is needed.

Eight pages a pass, not one: with a page at a time each selected key costs a load and a store
of its 4 KiB accumulator (from L2 once the keys' accumulators outgrow L1); eight pages share
one. Measured on 2 cores, 24 keys: 1.8x the branchy one-page-at-a-time loop, and as fast
for 3 keys. Keys go two to a pass (`_xor_masked8x2`), so each page word is loaded once per
two keys: 3 keys on one core from 0.75 to 0.9 of NumPy's read rate. Branch-free, so the work
does not depend on the keys' bits either.

With many keys (`many_keys` and more) the eight pages are first combined into two tables of
the 16 XORs of each half (the method of Four Russians: 22 page XORs a group, once), and each
key then XORs in two table rows: two ALU ops a word a key instead of sixteen. Measured (one
core, 16 k pages, against the two-keys-a-pass loop): 48 keys 2.0x, 24 keys 1.4x, 12 even,
3 keys 0.5x; hence `PACKED_TABLE_KEYS` (cpu.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from morphogen.engine._cpu_kernel import U64_PER_PAGE, _worker_bounds
from morphogen.protocol._dpf_jit import eval_range_into

LEAF_SHIFT = 7
LEAF_PAGES = 1 << LEAF_SHIFT


@nb.njit(inline="always", cache=True)
def _xor_masked(acc, page, m):
    for i in range(U64_PER_PAGE):
        acc[i] ^= page[i] & m


@nb.njit(inline="always", cache=True)
def _xor_masked8(acc, q0, q1, q2, q3, q4, q5, q6, q7, bits):
    z = np.uint64(0)
    one = np.uint64(1)
    m0 = z - (bits & one)
    m1 = z - ((bits >> np.uint64(1)) & one)
    m2 = z - ((bits >> np.uint64(2)) & one)
    m3 = z - ((bits >> np.uint64(3)) & one)
    m4 = z - ((bits >> np.uint64(4)) & one)
    m5 = z - ((bits >> np.uint64(5)) & one)
    m6 = z - ((bits >> np.uint64(6)) & one)
    m7 = z - ((bits >> np.uint64(7)) & one)
    for i in range(U64_PER_PAGE):
        acc[i] ^= ((q0[i] & m0) ^ (q1[i] & m1) ^ (q2[i] & m2) ^ (q3[i] & m3)
                   ^ (q4[i] & m4) ^ (q5[i] & m5) ^ (q6[i] & m6) ^ (q7[i] & m7))


@nb.njit(inline="always", cache=True)
def _masks8(bits):
    z = np.uint64(0)
    one = np.uint64(1)
    return (z - (bits & one), z - ((bits >> np.uint64(1)) & one),
            z - ((bits >> np.uint64(2)) & one), z - ((bits >> np.uint64(3)) & one),
            z - ((bits >> np.uint64(4)) & one), z - ((bits >> np.uint64(5)) & one),
            z - ((bits >> np.uint64(6)) & one), z - ((bits >> np.uint64(7)) & one))


@nb.njit(inline="always", cache=True)
def _xor_masked8x2(acc0, acc1, q0, q1, q2, q3, q4, q5, q6, q7, bits0, bits1):
    """`_xor_masked8` for two keys in one pass: each page word is loaded once for both."""
    a0, a1, a2, a3, a4, a5, a6, a7 = _masks8(bits0)
    b0, b1, b2, b3, b4, b5, b6, b7 = _masks8(bits1)
    for i in range(U64_PER_PAGE):
        x0 = q0[i]
        x1 = q1[i]
        x2 = q2[i]
        x3 = q3[i]
        x4 = q4[i]
        x5 = q5[i]
        x6 = q6[i]
        x7 = q7[i]
        acc0[i] ^= ((x0 & a0) ^ (x1 & a1) ^ (x2 & a2) ^ (x3 & a3)
                    ^ (x4 & a4) ^ (x5 & a5) ^ (x6 & a6) ^ (x7 & a7))
        acc1[i] ^= ((x0 & b0) ^ (x1 & b1) ^ (x2 & b2) ^ (x3 & b3)
                    ^ (x4 & b4) ^ (x5 & b5) ^ (x6 & b6) ^ (x7 & b7))


@nb.njit(inline="always", cache=True)
def _copy_row(dst, src):
    for i in range(U64_PER_PAGE):
        dst[i] = src[i]


@nb.njit(inline="always", cache=True)
def _xor_row(dst, x, y):
    for i in range(U64_PER_PAGE):
        dst[i] = x[i] ^ y[i]


@nb.njit(inline="always", cache=True)
def _half_table(t, a, b, c, d):
    """t[j] = XOR of the pages (a, b, c, d) whose bit is set in j; one row a loop (a loop
    writing all sixteen rows at once does not vectorise)."""
    for i in range(U64_PER_PAGE):
        t[0, i] = 0
    _copy_row(t[1], a)
    _copy_row(t[2], b)
    _xor_row(t[3], a, b)
    _copy_row(t[4], c)
    for j in range(5, 8):
        _xor_row(t[j], t[j - 4], c)
    _copy_row(t[8], d)
    for j in range(9, 16):
        _xor_row(t[j], t[j - 8], d)


@nb.njit(inline="always", cache=True)
def _build_tables(tab, q0, q1, q2, q3, q4, q5, q6, q7):
    """tab[h, j] = XOR of the pages of half h (q0..q3, q4..q7) whose bit is set in j."""
    _half_table(tab[0], q0, q1, q2, q3)
    _half_table(tab[1], q4, q5, q6, q7)


@nb.njit(inline="always", cache=True)
def _xor_rows(acc, r0, r1):
    for i in range(U64_PER_PAGE):
        acc[i] ^= r0[i] ^ r1[i]


@nb.njit(parallel=True, cache=True)
def scan_packed(
    pages, first_page, levels, roots, root_ts, cws, tcws, finals,
    tile, acc, leaves, leaves64, sa, sta, sb, stb, out, tables, many_keys,
):
    """out[k] (512 u64) = XOR of pages[i] over the i whose bit of key k is set.

    pages: (n, 512) u64; `tile` a multiple of 128 pages (tiles are leaf-aligned in global
    numbering). Per worker w: acc[w] (>=K, 512) u64, leaves/leaves64[w] (>=K, tile/128 + 1,
    4|2) u32|u64 views of one buffer, sa/sb[w] (4, L) u32 and sta/stb[w] (L,) u32 scratch.
    """
    n = pages.shape[0]
    n_keys = roots.shape[0]
    workers = acc.shape[0]
    for w in nb.prange(workers):
        a = acc[w]
        a[:n_keys, :] = 0
        lo, hi = _worker_bounds(first_page, n, tile, workers, w)
        pos = lo
        while pos < hi:
            g = first_page + pos
            end = min(hi, pos + (tile - g % tile))
            leaf0 = g >> LEAF_SHIFT
            leaf1 = ((first_page + end - 1) >> LEAF_SHIFT) + 1
            for k in range(n_keys):
                eval_range_into(
                    roots[k], root_ts[k], cws[k], tcws[k], finals[k], levels, leaf0, leaf1,
                    leaves[w, k], sa[w], sta[w], sb[w], stb[w],
                )
            p = pos
            while p < end:
                gp = first_page + p
                li = (gp >> LEAF_SHIFT) - leaf0
                bit = gp & (LEAF_PAGES - 1)
                word = bit >> 6
                shift = np.uint64(bit & 63)
                if gp & 7 == 0 and p + 8 <= end:
                    # eight pages in one byte of one leaf word
                    q0, q1, q2, q3 = pages[p], pages[p + 1], pages[p + 2], pages[p + 3]
                    q4, q5, q6, q7 = pages[p + 4], pages[p + 5], pages[p + 6], pages[p + 7]
                    if n_keys >= many_keys:
                        tab = tables[w]
                        _build_tables(tab, q0, q1, q2, q3, q4, q5, q6, q7)
                        for k in range(n_keys):
                            byte = (leaves64[w, k, li, word] >> shift) & np.uint64(0xFF)
                            _xor_rows(a[k], tab[0, byte & np.uint64(15)],
                                      tab[1, byte >> np.uint64(4)])
                    else:
                        for k in range(0, n_keys - 1, 2):
                            _xor_masked8x2(a[k], a[k + 1], q0, q1, q2, q3, q4, q5, q6, q7,
                                           leaves64[w, k, li, word] >> shift,
                                           leaves64[w, k + 1, li, word] >> shift)
                        if n_keys % 2:
                            k = n_keys - 1
                            _xor_masked8(a[k], q0, q1, q2, q3, q4, q5, q6, q7,
                                         leaves64[w, k, li, word] >> shift)
                    p += 8
                else:
                    page = pages[p]
                    for k in range(n_keys):
                        m = np.uint64(0) - ((leaves64[w, k, li, word] >> shift) & np.uint64(1))
                        _xor_masked(a[k], page, m)
                    p += 1
            pos = end
    for k in range(n_keys):
        for i in range(U64_PER_PAGE):
            x = np.uint64(0)
            for w in range(workers):
                x ^= acc[w, k, i]
            out[k, i] = x
