"""Jitted DPF tree evaluation: prefix walks and breadth-first subtree expansion.

Seeds live as four u32 words in structure-of-arrays form (`(4, n)`) and control bits as u32
0/1, so every level of the breadth-first expansion is one branch-free loop over nodes that LLVM
vectorises across nodes. Masks come out as `(n, 4)` u32 rows: on a little-endian host that is
exactly the 16 mask bytes of PROTOCOL.md.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from morphogen.protocol._chacha import g_words

# A subtree of at most 2**MAX_SUBTREE_LEVELS leaves is expanded at once: the scratch stays in
# L1/L2 and a range larger than that costs one extra prefix walk per block (d PRG calls per
# 4096 outputs at most).
MAX_SUBTREE_LEVELS = 12
MAX_SUBTREE_LEAVES = 1 << MAX_SUBTREE_LEVELS


def new_scratch() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Ping-pong buffers for one breadth-first expansion (allocate once, reuse)."""
    return (
        np.zeros((4, MAX_SUBTREE_LEAVES), np.uint32),
        np.zeros(MAX_SUBTREE_LEAVES, np.uint32),
        np.zeros((4, MAX_SUBTREE_LEAVES), np.uint32),
        np.zeros(MAX_SUBTREE_LEAVES, np.uint32),
    )


@nb.njit(cache=True)
def _walk(root, root_t, cw, tcw, levels, path, sa, sta, sb, stb):
    """Follow `levels` levels down from the root along the top bits of `path` (MSB first).

    The node lands in sa[:, 0] / sta[0]. Each step expands one node with `_expand_level`, so
    the whole module holds a single compiled copy of the PRG (each copy costs seconds of LLVM
    time).
    """
    sa[0, 0] = root[0]
    sa[1, 0] = root[1]
    sa[2, 0] = root[2]
    sa[3, 0] = root[3]
    sta[0] = np.uint32(root_t)
    for i in range(levels):
        _expand_level(
            sa, sta, sb, stb, 1,
            cw[i, 0], cw[i, 1], cw[i, 2], cw[i, 3],
            np.uint32(tcw[i, 0]), np.uint32(tcw[i, 1]),
        )
        child = (path >> (levels - 1 - i)) & 1
        sa[0, 0] = sb[0, child]
        sa[1, 0] = sb[1, child]
        sa[2, 0] = sb[2, child]
        sa[3, 0] = sb[3, child]
        sta[0] = stb[child]


# Bit-reversal of every MAX_SUBTREE_LEVELS-bit index; a block of h levels shifts it down.
_REVERSED = np.array(
    [int(f"{i:0{MAX_SUBTREE_LEVELS}b}"[::-1], 2) for i in range(MAX_SUBTREE_LEAVES)], np.int64
)


@nb.njit(cache=True)
def _expand_level(src, src_t, dst, dst_t, n, c0, c1, c2, c3, tcl, tcr):
    """Children of n nodes: dst[i] = left(src[i]), dst[n + i] = right(src[i]).

    Contiguous (not interleaved) stores keep the loop vectorisable; the price is that after h
    levels a leaf's position is its path bit-reversed, which `_expand_block` undoes.
    """
    for i in range(n):
        t = src_t[i]
        m = np.uint32(0) - t
        l0, l1, l2, l3, r0, r1, r2, r3, tl, tr = g_words(src[0, i], src[1, i], src[2, i], src[3, i])
        k0 = c0 & m
        k1 = c1 & m
        k2 = c2 & m
        k3 = c3 & m
        dst[0, i] = l0 ^ k0
        dst[1, i] = l1 ^ k1
        dst[2, i] = l2 ^ k2
        dst[3, i] = l3 ^ k3
        dst_t[i] = tl ^ (tcl & t)
        dst[0, n + i] = r0 ^ k0
        dst[1, n + i] = r1 ^ k1
        dst[2, n + i] = r2 ^ k2
        dst[3, n + i] = r3 ^ k3
        dst_t[n + i] = tr ^ (tcr & t)


@nb.njit(cache=True)
def _expand_block(root, root_t, cw, tcw, final, d, first, h, out, out_row, sa, sta, sb, stb):
    """Masks of the aligned block [first, first + 2**h) into out[out_row : out_row + 2**h]."""
    _walk(root, root_t, cw, tcw, d - h, first >> h, sa, sta, sb, stb)
    src, src_t, dst, dst_t = sa, sta, sb, stb
    n = 1
    for level in range(d - h, d):
        _expand_level(
            src, src_t, dst, dst_t, n,
            cw[level, 0], cw[level, 1], cw[level, 2], cw[level, 3],
            np.uint32(tcw[level, 0]), np.uint32(tcw[level, 1]),
        )
        src, src_t, dst, dst_t = dst, dst_t, src, src_t
        n *= 2
    f0, f1, f2, f3 = final[0], final[1], final[2], final[3]
    for i in range(n):
        m = np.uint32(0) - src_t[i]
        row = out_row + (_REVERSED[i] >> (MAX_SUBTREE_LEVELS - h))
        out[row, 0] = src[0, i] ^ (f0 & m)
        out[row, 1] = src[1, i] ^ (f1 & m)
        out[row, 2] = src[2, i] ^ (f2 & m)
        out[row, 3] = src[3, i] ^ (f3 & m)


@nb.njit(cache=True)
def eval_range_into(root, root_t, cw, tcw, final, d, start, stop, out, sa, sta, sb, stb):
    """Masks of pages [start, stop) into out[0 : stop-start] (u32 rows of 4).

    The range is cut into its canonical aligned power-of-two blocks (at most 2 per level), each
    expanded breadth-first: about one PRG call per output plus one prefix walk per block.
    """
    pos = start
    while pos < stop:
        h = 0
        while (
            h < MAX_SUBTREE_LEVELS
            and h < d
            and (pos & ((1 << (h + 1)) - 1)) == 0
            and pos + (1 << (h + 1)) <= stop
        ):
            h += 1
        _expand_block(root, root_t, cw, tcw, final, d, pos, h, out, pos - start, sa, sta, sb, stb)
        pos += 1 << h


@nb.njit(cache=True)
def eval_points_into(roots, root_ts, cws, tcws, finals, d, pages, out):
    """out[k, j] = mask of key k at pages[j] (full path walk: d PRG calls per point)."""
    sa = np.empty((4, 2), np.uint32)
    sta = np.empty(2, np.uint32)
    sb = np.empty((4, 2), np.uint32)
    stb = np.empty(2, np.uint32)
    for k in range(roots.shape[0]):
        for j in range(pages.shape[0]):
            _walk(roots[k], root_ts[k], cws[k], tcws[k], d, pages[j], sa, sta, sb, stb)
            m = np.uint32(0) - sta[0]
            out[k, j, 0] = sa[0, 0] ^ (finals[k, 0] & m)
            out[k, j, 1] = sa[1, 0] ^ (finals[k, 1] & m)
            out[k, j, 2] = sa[2, 0] ^ (finals[k, 2] & m)
            out[k, j, 3] = sa[3, 0] ^ (finals[k, 3] & m)


@nb.njit(cache=True)
def generate_into(seeds, target, d, cw_out, tcw_out, final_out):
    """Key generation (PROTOCOL.md section 3) for root seeds `seeds` (2, 4) u32.

    Both parties' seeds are expanded as the two nodes of one `_expand_level` call (with zero
    corrections it is plain G): child c of party b lands at index 2c + b.
    """
    sa = np.empty((4, 2), np.uint32)
    sta = np.empty(2, np.uint32)
    sb = np.empty((4, 4), np.uint32)
    stb = np.empty(4, np.uint32)
    for w in range(4):
        sa[w, 0] = seeds[0, w]
        sa[w, 1] = seeds[1, w]
    sta[0] = 0
    sta[1] = 1
    zero = np.uint32(0)
    for i in range(d):
        a = (target >> (d - 1 - i)) & 1
        _expand_level(sa, sta, sb, stb, 2, zero, zero, zero, zero, zero, zero)
        keep = 2 * a
        lose = 2 * (1 - a)
        t0 = sta[0]
        t1 = sta[1]
        for w in range(4):
            cw_out[i, w] = sb[w, lose] ^ sb[w, lose + 1]
        tcw_keep = stb[keep] ^ stb[keep + 1] ^ t0 ^ t1
        tcw_lose = stb[lose] ^ stb[lose + 1] ^ t0 ^ t1 ^ np.uint32(1)
        if a:
            tcw_out[i, 0] = tcw_lose
            tcw_out[i, 1] = tcw_keep
        else:
            tcw_out[i, 0] = tcw_keep
            tcw_out[i, 1] = tcw_lose
        for b in range(2):
            m = np.uint32(0) - sta[b]
            for w in range(4):
                sa[w, b] = sb[w, keep + b] ^ (cw_out[i, w] & m)
            sta[b] = stb[keep + b] ^ (tcw_keep & sta[b])
    for w in range(4):
        final_out[w] = sa[w, 0] ^ sa[w, 1] ^ np.uint32(0xFFFFFFFF)
