"""The ChaCha8 length-doubling PRG G(seed) -> (L, R, tL, tR) of PROTOCOL.md section 2.

This pure-Python form serves key generation and single-point evaluation; the bulk paths
(range evaluation, the scan engines) use the jitted twin in `morphogen.protocol._chacha`, which the
tests hold to the same known answers.
"""

from __future__ import annotations

import struct

from morphogen.constants import SEED_BYTES

_MASK32 = 0xFFFFFFFF
SIGMA = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)


def _rotl(x: int, n: int) -> int:
    return ((x << n) | (x >> (32 - n))) & _MASK32


def _quarter_round(s: list[int], a: int, b: int, c: int, d: int) -> None:
    s[a] = (s[a] + s[b]) & _MASK32
    s[d] = _rotl(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & _MASK32
    s[b] = _rotl(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b]) & _MASK32
    s[d] = _rotl(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & _MASK32
    s[b] = _rotl(s[b] ^ s[c], 7)


def chacha8_block(seed_words: tuple[int, int, int, int], counter: int) -> list[int]:
    """One ChaCha8 block keyed by seed||seed with a zero nonce."""
    init = [*SIGMA, *seed_words, *seed_words, counter & _MASK32, 0, 0, 0]
    s = list(init)
    for _ in range(4):
        _quarter_round(s, 0, 4, 8, 12)
        _quarter_round(s, 1, 5, 9, 13)
        _quarter_round(s, 2, 6, 10, 14)
        _quarter_round(s, 3, 7, 11, 15)
        _quarter_round(s, 0, 5, 10, 15)
        _quarter_round(s, 1, 6, 11, 12)
        _quarter_round(s, 2, 7, 8, 13)
        _quarter_round(s, 3, 4, 9, 14)
    return [(x + y) & _MASK32 for x, y in zip(s, init, strict=True)]


def expand(seed: bytes) -> tuple[bytes, bytes, int, int]:
    """G(seed): the left and right child seeds and their control bits."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a PRG seed is {SEED_BYTES} bytes, got {len(seed)}")
    words = struct.unpack("<4I", seed)
    b0 = chacha8_block(words, 0)
    b1 = chacha8_block(words, 1)
    left = struct.pack("<4I", *b0[0:4])
    right = struct.pack("<4I", *b0[4:8])
    return left, right, b1[0] & 1, b1[1] & 1
