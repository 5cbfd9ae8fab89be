"""Candidate buckets of a key: the reference's cuckoo addressing, bit for bit.

Each of the three candidates is SipHash-1-3 with both keys 0 (Rust's `DefaultHasher`) over the
seed as 8 little-endian bytes followed by the key bytes, modulo the number of buckets. The
scalar function serves clients (three hashes per lookup); the builder hashes millions of keys
with the vectorised twin, which tests hold to the scalar one and to vectors from Rust itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

NUM_CANDIDATES = 3
_MASK = (1 << 64) - 1


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _MASK


def _sip_round(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    v0 = (v0 + v1) & _MASK
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3) & _MASK
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3) & _MASK
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1) & _MASK
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash13(data: bytes) -> int:
    """SipHash-1-3 of `data` with the all-zero key (one compression round, three final)."""
    v0, v1, v2, v3 = 0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573
    n = len(data)
    end = n - n % 8
    for i in range(0, end, 8):
        m = int.from_bytes(data[i:i + 8], "little")
        v3 ^= m
        v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
        v0 ^= m
    last = ((n & 0xFF) << 56) | int.from_bytes(data[end:], "little")
    v3 ^= last
    v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    v0 ^= last
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


def seeded_hash(key: bytes, seed: int) -> int:
    """The reference's per-candidate hash: `write_u64(seed)`, then `write(key)`."""
    if not 0 <= seed <= _MASK:
        raise ValueError(f"seed {seed} is not a 64-bit unsigned integer")
    return siphash13(seed.to_bytes(8, "little") + bytes(key))


def candidates(key: bytes, seeds: Sequence[int], num_buckets: int) -> tuple[int, int, int]:
    """The three candidate buckets of `key` in a table of `num_buckets` buckets."""
    if len(seeds) != NUM_CANDIDATES:
        raise ValueError(f"a cuckoo table has {NUM_CANDIDATES} seeds, not {len(seeds)}")
    if num_buckets < 1:
        raise ValueError("num_buckets must be at least 1")
    a, b, c = (seeded_hash(key, s) % num_buckets for s in seeds)
    return a, b, c


# -- vectorised: many keys at once (the builder) ------------------------------------------------

@numba.njit(cache=True, inline="always")
def _rotl64(x, b):
    return (x << np.uint64(b)) | (x >> np.uint64(64 - b))


@numba.njit(cache=True, inline="always")
def _round(v0, v1, v2, v3):
    v0 = v0 + v1
    v1 = _rotl64(v1, 13) ^ v0
    v0 = _rotl64(v0, 32)
    v2 = v2 + v3
    v3 = _rotl64(v3, 16) ^ v2
    v0 = v0 + v3
    v3 = _rotl64(v3, 21) ^ v0
    v2 = v2 + v1
    v1 = _rotl64(v1, 17) ^ v2
    v2 = _rotl64(v2, 32)
    return v0, v1, v2, v3


@numba.njit(cache=True, inline="always")
def _seeded(flat, start, klen, m):
    # the message is seed (8 bytes) + key: the seed is exactly the first word, so it is
    # compressed first and the key's bytes follow as if the buffer were contiguous
    v0 = np.uint64(0x736F6D6570736575)
    v1 = np.uint64(0x646F72616E646F6D)
    v2 = np.uint64(0x6C7967656E657261)
    v3 = np.uint64(0x7465646279746573)
    v3 ^= m
    v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    v0 ^= m
    full = klen - klen % 8
    for i in range(0, full, 8):
        m = np.uint64(0)
        for j in range(8):
            m |= np.uint64(flat[start + i + j]) << np.uint64(8 * j)
        v3 ^= m
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
        v0 ^= m
    total = klen + 8
    m = np.uint64(total & 0xFF) << np.uint64(56)
    for j in range(klen - full):
        m |= np.uint64(flat[start + full + j]) << np.uint64(8 * j)
    v3 ^= m
    v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    v0 ^= m
    v2 ^= np.uint64(0xFF)
    for _ in range(3):
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


@numba.njit(cache=True)
def _candidates_many(flat, offsets, seeds, num_buckets, out):
    nb = np.uint64(num_buckets)
    for r in range(offsets.shape[0] - 1):
        for s in range(seeds.shape[0]):
            out[r, s] = _seeded(flat, offsets[r], offsets[r + 1] - offsets[r], seeds[s]) % nb


@numba.njit(cache=True)
def _fixed_hashes(keys, seeds, out):
    for r in range(keys.shape[0]):
        row = keys[r]
        for s in range(seeds.shape[0]):
            out[r, s] = _seeded(row, 0, row.shape[0], seeds[s])


def seeded_hashes(keys: np.ndarray, seeds: Sequence[int]) -> np.ndarray:
    """`(len(keys), 3)` uint64 hashes of keys of one length (rows of `keys`), before the
    modulo: `candidates_many` is these `% num_buckets`, so a builder hashes before it knows
    the table's size."""
    if len(seeds) != NUM_CANDIDATES:
        raise ValueError(f"a cuckoo table has {NUM_CANDIDATES} seeds, not {len(seeds)}")
    out = np.empty((len(keys), NUM_CANDIDATES), dtype=np.uint64)
    _fixed_hashes(np.ascontiguousarray(keys, np.uint8), np.asarray(seeds, dtype=np.uint64), out)
    return out


def pack_keys(keys: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Keys as one flat byte array and `len(keys) + 1` offsets (what the kernels take)."""
    lengths = np.fromiter((len(k) for k in keys), dtype=np.int64, count=len(keys))
    offsets = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.frombuffer(b"".join(keys), dtype=np.uint8) if len(keys) else np.zeros(0, np.uint8)
    return np.ascontiguousarray(flat), offsets


def candidates_many(flat: np.ndarray, offsets: np.ndarray, seeds: Sequence[int],
                    num_buckets: int) -> np.ndarray:
    """`(len(offsets) - 1, 3)` int64 candidate buckets of packed keys (see `pack_keys`)."""
    if len(seeds) != NUM_CANDIDATES:
        raise ValueError(f"a cuckoo table has {NUM_CANDIDATES} seeds, not {len(seeds)}")
    out = np.empty((len(offsets) - 1, NUM_CANDIDATES), dtype=np.uint64)
    _candidates_many(flat, offsets, np.asarray(seeds, dtype=np.uint64), num_buckets, out)
    return out.astype(np.int64)


def warm() -> None:
    """Load (or compile) the batch kernel now: a follower calls it as it starts, so that its
    first block does not wait for it."""
    candidates_many(*pack_keys([bytes(20)] * 2), (1, 2, 3), 64)
