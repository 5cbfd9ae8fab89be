"""Jitted ChaCha8 PRG on seeds held as four little-endian u32 words.

Written branch-free on scalar u32 values so that LLVM can vectorise the loops that call it
across tree nodes (AVX2: eight nodes per instruction).
"""

from __future__ import annotations

import numba as nb
import numpy as np

_S0 = np.uint32(0x61707865)
_S1 = np.uint32(0x3320646E)
_S2 = np.uint32(0x79622D32)
_S3 = np.uint32(0x6B206574)


@nb.njit(inline="always", cache=True)
def _rotl(x, n):
    # numba widens u32 arithmetic to 64 bits; truncating back makes this a true 32-bit rotate
    return np.uint32(((x << n) | (x >> (32 - n))) & 0xFFFFFFFF)


@nb.njit(inline="always", cache=True)
def _qr(a, b, c, d):
    a = np.uint32((a + b) & 0xFFFFFFFF)
    d = _rotl(d ^ a, 16)
    c = np.uint32((c + d) & 0xFFFFFFFF)
    b = _rotl(b ^ c, 12)
    a = np.uint32((a + b) & 0xFFFFFFFF)
    d = _rotl(d ^ a, 8)
    c = np.uint32((c + d) & 0xFFFFFFFF)
    b = _rotl(b ^ c, 7)
    return a, b, c, d


@nb.njit(inline="always", cache=True)
def _double_round(x):
    x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15 = x
    x0, x4, x8, x12 = _qr(x0, x4, x8, x12)
    x1, x5, x9, x13 = _qr(x1, x5, x9, x13)
    x2, x6, x10, x14 = _qr(x2, x6, x10, x14)
    x3, x7, x11, x15 = _qr(x3, x7, x11, x15)
    x0, x5, x10, x15 = _qr(x0, x5, x10, x15)
    x1, x6, x11, x12 = _qr(x1, x6, x11, x12)
    x2, x7, x8, x13 = _qr(x2, x7, x8, x13)
    x3, x4, x9, x14 = _qr(x3, x4, x9, x14)
    return x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15


@nb.njit(inline="always", cache=True)
def _block(w0, w1, w2, w3, ctr):
    """ChaCha8 block keyed by seed||seed, zero nonce; returns words 0..7 (all G needs)."""
    x0, x1, x2, x3 = _S0, _S1, _S2, _S3
    x4, x5, x6, x7 = w0, w1, w2, w3
    x8, x9, x10, x11 = w0, w1, w2, w3
    x12, x13, x14, x15 = ctr, np.uint32(0), np.uint32(0), np.uint32(0)
    # written out, not looped: LLVM vectorises only innermost loops, so a rounds loop here
    # would keep the callers' loops over tree nodes scalar
    x = (x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15)
    x = _double_round(x)
    x = _double_round(x)
    x = _double_round(x)
    x = _double_round(x)
    x0, x1, x2, x3, x4, x5, x6, x7 = x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]
    m = 0xFFFFFFFF
    return (
        np.uint32((x0 + _S0) & m), np.uint32((x1 + _S1) & m),
        np.uint32((x2 + _S2) & m), np.uint32((x3 + _S3) & m),
        np.uint32((x4 + w0) & m), np.uint32((x5 + w1) & m),
        np.uint32((x6 + w2) & m), np.uint32((x7 + w3) & m),
    )


@nb.njit(inline="always", cache=True)
def g_words(w0, w1, w2, w3):
    """G(seed) -> (l0, l1, l2, l3, r0, r1, r2, r3, tL, tR) with t bits as u32 0/1."""
    l0, l1, l2, l3, r0, r1, r2, r3 = _block(w0, w1, w2, w3, np.uint32(0))
    c0, c1, _, _, _, _, _, _ = _block(w0, w1, w2, w3, np.uint32(1))
    return l0, l1, l2, l3, r0, r1, r2, r3, c0 & np.uint32(1), c1 & np.uint32(1)
