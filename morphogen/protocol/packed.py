"""The packed DPF key format (docs/packed-keys.md): the BGI tree stops 7 levels early and each
128-bit leaf holds the selection bits of 128 pages, so a full scan costs one PRG `G` per 128
pages per key instead of one per page.

The tree is PROTOCOL.md's, with the same ChaCha8 `G`, walked for `d - 7` levels towards leaf
`x >> 7`; only the final correction word differs (`s0 ^ s1 ^ e(x & 127)` instead of
`s0 ^ s1 ^ ff*16`). So the jitted v1 walkers (`_dpf_jit`) evaluate leaves unchanged, called
with `d - 7` levels.

`PackedKey` is one party's key with a strict parser; `PackedKeyBatch` stacks keys of one
domain for the engines, as `KeyBatch` does for v1 keys. The two batch types are unrelated
classes on purpose: an engine that knows only v1 keys must fail on a packed batch, never walk
it as a v1 one.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from morphogen.constants import (
    KEY_FORMAT_PACKED,
    KEY_FORMAT_V1,
    KEY_LEVEL_BYTES,
    MASK_BYTES,
    MAX_DOMAIN_BITS,
    MIN_DOMAIN_BITS,
    PACKED_HEADER_BYTES,
    PACKED_LEAF_BITS,
    PACKED_LEAF_PAGES,
    PACKED_TAG,
    key_format_of,
    packed_key_length,
    packed_levels,
)
from morphogen.protocol import prg
from morphogen.protocol.dpf import (
    DomainError,
    KeyBatch,
    KeyFormatError,
    StackedKeys,
    _check_keygen,
    _xor,
    eval_points,
)

_HEADER = PACKED_HEADER_BYTES
_LEVEL = KEY_LEVEL_BYTES


def _unit(bit: int) -> bytes:
    """16 bytes with only bit `bit` (LSB-first within little-endian bytes) set."""
    return (1 << bit).to_bytes(MASK_BYTES, "little")


@functools.cache
def _flag_columns(levels: int) -> np.ndarray:
    """Byte offsets of a packed key's flags: root_t, party, then each level's control bits."""
    cols = [_HEADER + _LEVEL * i + 16 + j for i in range(levels) for j in (0, 1)]
    return np.array([16, 17, *cols], np.intp)


def malformed_packed(rows: np.ndarray) -> tuple[int, str] | None:
    """The first of `rows` (K, packed_key_length(d)) breaking a flag rule, and why; the same
    rules as v1 (`dpf.malformed_key`) plus the format tag. Every row is read whole whatever
    its bytes: the work does not depend on where a bad byte sits."""
    levels = packed_levels(int(rows[0, 18]))
    columns = _flag_columns(levels)
    flags = rows[:, columns]
    raw, width = flags.tobytes(), len(columns)
    # every flag a bit, root_t == party and every tag right: no rule below can fire (bytes
    # ops: a request's keys cost microseconds, where numpy's per-call overhead would dominate)
    if (not raw.translate(None, b"\x00\x01") and raw[0::width] == raw[1::width]
            and rows[:, 19].tobytes() == bytes((PACKED_TAG,)) * len(rows)):
        return None
    root_t, party, tag = rows[:, 16], rows[:, 17], rows[:, 19]
    bad_level = flags[:, 2:] > 1
    rules = (
        (tag != PACKED_TAG, lambda i: f"format tag must be {PACKED_TAG}, got {tag[i]}"),
        (party > 1, lambda i: f"party byte must be 0 or 1, got {party[i]}"),
        (root_t > 1, lambda i: f"root control bit must be 0 or 1, got {root_t[i]}"),
        (root_t != party, lambda i: "root control bit does not match the party"),
        (bad_level.any(axis=1), lambda i: (
            f"control-bit correction at level {int(np.argmax(bad_level[i])) // 2} "
            "is not 0 or 1")),
    )
    bad = np.logical_or.reduce([mask for mask, _ in rules])
    if not bad.any():
        return None
    i = int(np.argmax(bad))
    return i, next(why(i) for mask, why in rules if mask[i])


def _check_length(length: int, d: int) -> None:
    if not MIN_DOMAIN_BITS <= d <= MAX_DOMAIN_BITS:
        raise KeyFormatError(f"key domain bits must be in 1..32, got {d}")
    if length != packed_key_length(d):
        raise KeyFormatError(
            f"a packed key of domain bits {d} is {packed_key_length(d)} bytes, got {length}"
        )


@dataclass(frozen=True, repr=False)
class PackedKey:
    """One party's packed key. `repr` shows only public shape: keys are secrets."""

    root_seed: bytes
    root_t: int
    party: int
    domain_bits: int
    cw: tuple[bytes, ...]
    tcw_left: tuple[int, ...]
    tcw_right: tuple[int, ...]
    final_cw: bytes
    _raw: bytes = field(default=b"", compare=False)

    format = KEY_FORMAT_PACKED

    def __repr__(self) -> str:
        return f"PackedKey(party={self.party}, domain_bits={self.domain_bits})"

    @property
    def levels(self) -> int:
        return packed_levels(self.domain_bits)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> PackedKey:
        """Parse and fully validate key bytes; raises KeyFormatError on anything malformed."""
        data = bytes(data)
        if len(data) < _HEADER:
            raise KeyFormatError(f"key too short: {len(data)} bytes")
        _check_length(len(data), data[18])
        problem = malformed_packed(np.frombuffer(data, np.uint8).reshape(1, -1))
        if problem is not None:
            raise KeyFormatError(problem[1])
        n = packed_levels(data[18])
        levels = [data[_HEADER + _LEVEL * i : _HEADER + _LEVEL * (i + 1)] for i in range(n)]
        return cls(
            root_seed=data[0:16], root_t=data[16], party=data[17], domain_bits=data[18],
            cw=tuple(lv[:16] for lv in levels),
            tcw_left=tuple(lv[16] for lv in levels),
            tcw_right=tuple(lv[17] for lv in levels),
            final_cw=data[_HEADER + _LEVEL * n :],
            _raw=data,
        )

    def to_bytes(self) -> bytes:
        if self._raw:
            return self._raw
        parts = [self.root_seed,
                 bytes((self.root_t, self.party, self.domain_bits, PACKED_TAG))]
        for c, tl, tr in zip(self.cw, self.tcw_left, self.tcw_right, strict=True):
            parts += [c, bytes((tl, tr))]
        parts.append(self.final_cw)
        return b"".join(parts)

    def leaf(self, index: int) -> bytes:
        """This party's 128-bit leaf `index` (pages 128 index .. 128 index + 127), by a plain
        Python walk of `levels` PRG calls."""
        n = self.levels
        if not 0 <= index < (1 << n):
            raise DomainError(f"leaf {index} is outside the {1 << n} leaves of this key")
        s, t = self.root_seed, self.root_t
        for i in range(n):
            left, right, tl, tr = prg.expand(s)
            if (index >> (n - 1 - i)) & 1:
                s2, t2, tc = right, tr, self.tcw_right[i]
            else:
                s2, t2, tc = left, tl, self.tcw_left[i]
            if t:
                s2, t2 = _xor(s2, self.cw[i]), t2 ^ tc
            s, t = s2, t2
        return _xor(s, self.final_cw) if t else s

    def eval(self, page: int) -> int:
        """This party's selection bit (0 or 1) of `page`."""
        if not 0 <= page < (1 << self.domain_bits):
            raise DomainError(f"page {page} is outside the domain of 2^{self.domain_bits} pages")
        leaf = self.leaf(page >> PACKED_LEAF_BITS)
        return (int.from_bytes(leaf, "little") >> (page & (PACKED_LEAF_PAGES - 1))) & 1


def generate_packed_keys(
    domain_bits: int, target: int, *, seeds: tuple[bytes, bytes] | None = None
) -> tuple[PackedKey, PackedKey]:
    """Keys (for server A, for server B) whose selections differ at `target` only.

    `seeds` fixes the root seeds for known-answer vectors; normal use draws them from the
    operating system's CSPRNG (`secrets`). The tree is v1's over `d - 7` levels towards leaf
    `target >> 7`; its v1 final word `s0 ^ s1 ^ ff*16` becomes `s0 ^ s1 ^ e(target & 127)`.
    """
    from morphogen.protocol import _dpf_jit

    roots = _check_keygen(domain_bits, target, seeds)
    n = packed_levels(domain_bits)
    words = np.frombuffer(roots[0] + roots[1], "<u4").reshape(2, 4).copy()
    cw = np.empty((n, 4), np.uint32)
    tcw = np.empty((n, 2), np.uint8)
    final = np.empty(4, np.uint32)
    _dpf_jit.generate_into(words, target >> PACKED_LEAF_BITS, n, cw, tcw, final)
    delta = _xor(b"\xff" * MASK_BYTES, _unit(target & (PACKED_LEAF_PAGES - 1)))
    cw_bytes = cw.tobytes()
    common = dict(
        domain_bits=domain_bits,
        cw=tuple(cw_bytes[16 * i : 16 * (i + 1)] for i in range(n)),
        tcw_left=tuple(int(x) for x in tcw[:, 0]),
        tcw_right=tuple(int(x) for x in tcw[:, 1]),
        final_cw=_xor(final.tobytes(), delta),
    )
    return (PackedKey(root_seed=roots[0], root_t=0, party=0, **common),
            PackedKey(root_seed=roots[1], root_t=1, party=1, **common))


@dataclass(frozen=True, repr=False)
class PackedKeyBatch(StackedKeys):
    """Packed keys of one domain stacked for the engines (C-contiguous, read-only arrays, as
    `KeyBatch`'s); `cw`/`tcw` hold `levels = d - 7` rows per key."""

    domain_bits: int
    root_seed: np.ndarray  # (K, 4) uint32
    root_t: np.ndarray  # (K,) uint8
    cw: np.ndarray  # (K, levels, 4) uint32
    tcw: np.ndarray  # (K, levels, 2) uint8
    final_cw: np.ndarray  # (K, 4) uint32

    format = KEY_FORMAT_PACKED

    @property
    def levels(self) -> int:
        return packed_levels(self.domain_bits)

    @classmethod
    def from_rows(cls, rows: np.ndarray) -> PackedKeyBatch:
        """Serialized packed keys, one per row, fully validated (KeyFormatError names the
        first bad row in `index`; DomainError for mixed domains)."""
        if rows.ndim != 2 or rows.dtype != np.uint8 or not len(rows):
            raise ValueError("key rows are a non-empty (K, key length) uint8 array")
        d = int(rows[0, 18]) if rows.shape[1] > _HEADER else 0
        if not MIN_DOMAIN_BITS <= d <= MAX_DOMAIN_BITS or rows.shape[1] != packed_key_length(d):
            raise KeyFormatError(f"rows of {rows.shape[1]} bytes are not packed keys of domain {d}")
        if rows[:, 18].tobytes() != bytes((d,)) * len(rows):
            raise DomainError("all keys of one batch must share one domain")
        problem = malformed_packed(rows)
        if problem is not None:
            raise KeyFormatError(problem[1], problem[0])
        k, n = len(rows), packed_levels(d)
        levels = rows[:, _HEADER : _HEADER + _LEVEL * n].reshape(k, n, _LEVEL)
        return cls(
            domain_bits=d,
            root_seed=rows[:, 0:16].copy().view("<u4"),
            root_t=rows[:, 16].copy(),
            cw=np.ascontiguousarray(levels[:, :, :16]).view("<u4").reshape(k, n, 4),
            tcw=levels[:, :, 16:18].copy(),
            final_cw=rows[:, _HEADER + _LEVEL * n :].copy().view("<u4"),
        )

    @classmethod
    def from_keys(cls, keys: Sequence[PackedKey]) -> PackedKeyBatch:
        if not keys:
            raise ValueError("a key batch needs at least one key")
        if any(not isinstance(k, PackedKey) for k in keys):
            raise KeyFormatError("a packed key batch holds packed keys only")
        d = keys[0].domain_bits
        if any(k.domain_bits != d for k in keys):
            raise DomainError("all keys of one batch must share one domain")
        raw = b"".join(k.to_bytes() for k in keys)
        return cls.from_rows(np.frombuffer(raw, np.uint8).reshape(len(keys), -1))

    @classmethod
    def concat(cls, batches: Sequence[PackedKeyBatch]) -> PackedKeyBatch:
        if len(batches) > 1 and any(not isinstance(b, PackedKeyBatch) for b in batches):
            raise KeyFormatError("a batch never mixes key formats")
        return cls._joined(batches)

    def keys(self) -> list[PackedKey]:
        n, d = self.levels, self.domain_bits
        out = []
        for i in range(len(self)):
            levels = np.concatenate(
                [self.cw[i].view(np.uint8).reshape(n, 16), self.tcw[i]], axis=1)
            t = int(self.root_t[i])
            raw = b"".join((self.root_seed[i].tobytes(), bytes((t, t, d, PACKED_TAG)),
                            levels.tobytes(), self.final_cw[i].tobytes()))
            out.append(PackedKey.from_bytes(raw))
        return out


AnyBatch = KeyBatch | PackedKeyBatch


def batch_format(batch: object) -> str:
    """The key format of a batch (v1 for `KeyBatch`)."""
    return KEY_FORMAT_PACKED if isinstance(batch, PackedKeyBatch) else KEY_FORMAT_V1


def batch_from_rows(rows: np.ndarray) -> AnyBatch:
    """Key rows of one length as the batch of the format that length names."""
    fmt = key_format_of(rows.shape[1]) if rows.ndim == 2 else None
    if fmt == KEY_FORMAT_PACKED:
        return PackedKeyBatch.from_rows(rows)
    return KeyBatch.from_rows(rows)


def concat_batches(batches: Sequence[AnyBatch]) -> AnyBatch:
    """One batch of `batches` in order; they must share one format and one domain."""
    kinds = {type(b) for b in batches}
    if len(kinds) != 1:
        raise KeyFormatError("a batch never mixes key formats")
    return kinds.pop().concat(batches)  # type: ignore[attr-defined]


def leaves_into(batch: PackedKeyBatch, row: int, first_leaf: int, stop_leaf: int,
                out: np.ndarray) -> None:
    """Leaves [first_leaf, stop_leaf) of key `row` into out (n, 4) u32 (breadth-first)."""
    from morphogen.protocol import _dpf_jit

    _dpf_jit.eval_range_into(
        batch.root_seed[row], batch.root_t[row], batch.cw[row], batch.tcw[row],
        batch.final_cw[row], batch.levels, first_leaf, stop_leaf, out, *_dpf_jit.new_scratch(),
    )


def selection_range(key: PackedKey | PackedKeyBatch, start: int, stop: int) -> np.ndarray:
    """Selection bits of pages [start, stop) as a uint8 0/1 array (of the batch's first key)."""
    batch = key if isinstance(key, PackedKeyBatch) else PackedKeyBatch.from_keys([key])
    d = batch.domain_bits
    if not 0 <= start <= stop <= (1 << d):
        raise DomainError(f"range [{start}, {stop}) is outside the domain of 2^{d} pages")
    if stop == start:
        return np.zeros(0, np.uint8)
    lo, hi = start >> PACKED_LEAF_BITS, ((stop - 1) >> PACKED_LEAF_BITS) + 1
    leaves = np.empty((hi - lo, 4), np.uint32)
    leaves_into(batch, 0, lo, hi, leaves)
    bits = np.unpackbits(leaves.view(np.uint8), axis=1, bitorder="little").reshape(-1)
    off = lo << PACKED_LEAF_BITS
    return bits[start - off : stop - off]


def selections_at(batch: PackedKeyBatch, pages: Sequence[int] | np.ndarray) -> np.ndarray:
    """Selection bits of every key at every page: (K, len(pages)) uint8 0/1."""
    from morphogen.protocol import _dpf_jit

    pts = np.ascontiguousarray(pages, dtype=np.int64).reshape(-1)
    d = batch.domain_bits
    if pts.size and (pts.min() < 0 or pts.max() >= (1 << d)):
        raise DomainError(f"a page is outside the domain of 2^{d} pages")
    leaves = np.empty((len(batch), pts.size, 4), np.uint32)
    _dpf_jit.eval_points_into(batch.root_seed, batch.root_t, batch.cw, batch.tcw,
                              batch.final_cw, batch.levels, pts >> PACKED_LEAF_BITS, leaves)
    words = leaves.view(np.uint64)  # (K, U, 2): bit b of a leaf is bit b % 64 of word b // 64
    bit = pts & (PACKED_LEAF_PAGES - 1)
    word = np.take_along_axis(words, (bit >> 6)[None, :, None], axis=2)[..., 0]
    return ((word >> (bit & 63).astype(np.uint64)) & np.uint64(1)).astype(np.uint8)


def masks_at(batch: AnyBatch, pages: Sequence[int] | np.ndarray) -> np.ndarray:
    """Every key's 16-byte mask at every page, (K, U, 16) uint8, for either format: a packed
    key's selection bit as ff*16 or 00*16 (the pending-update path of the answers)."""
    if isinstance(batch, PackedKeyBatch):
        sel = selections_at(batch, pages)
        return np.repeat((sel * np.uint8(0xFF))[:, :, None], MASK_BYTES, axis=2)
    return eval_points(batch, pages)
