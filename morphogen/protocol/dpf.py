"""Two-party distributed point function (BGI tree) with the key bytes of PROTOCOL.md 3-4.

`generate_keys` makes the pair for one target page; `DpfKey` is one party's key with a strict
parser; `KeyBatch` stacks keys of one domain into the numpy layout every engine consumes.
"""

from __future__ import annotations

import functools
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from morphogen.constants import (
    KEY_HEADER_BYTES,
    KEY_LEVEL_BYTES,
    MASK_BYTES,
    MAX_DOMAIN_BITS,
    MIN_DOMAIN_BITS,
    SEED_BYTES,
    key_length,
)
from morphogen.protocol import prg

_HEADER = KEY_HEADER_BYTES
_LEVEL = KEY_LEVEL_BYTES

if sys.byteorder != "little":  # pragma: no cover - the u32 views below assume it
    raise ImportError("morphogen needs a little-endian host")


class KeyFormatError(ValueError):
    """Key bytes that are not a well-formed DPF key; `index` is the key's row in a batch."""

    def __init__(self, reason: str, index: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.index = index


class DomainError(ValueError):
    """A target, page or key domain outside what the caller or server allows."""


def _xor(a: bytes, b: bytes) -> bytes:
    return (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(len(a), "little")


def _check_domain_bits(domain_bits: int) -> None:
    if not MIN_DOMAIN_BITS <= domain_bits <= MAX_DOMAIN_BITS:
        raise DomainError(
            f"domain bits must be in {MIN_DOMAIN_BITS}..{MAX_DOMAIN_BITS}, got {domain_bits}"
        )


def _check_page(page: int, domain_bits: int) -> None:
    if not 0 <= page < (1 << domain_bits):
        raise DomainError(f"page {page} is outside the domain of 2^{domain_bits} pages")


_ALL_ONES = b"\xff" * MASK_BYTES


@functools.cache
def _flag_columns(domain_bits: int) -> np.ndarray:
    """Byte offsets of a key's flags: root_t, party, then each level's two control bits."""
    levels = [_HEADER + _LEVEL * i + 16 + j for i in range(domain_bits) for j in (0, 1)]
    return np.array([16, 17, *levels], np.intp)


def malformed_key(rows: np.ndarray) -> tuple[int, str] | None:
    """The first of `rows` that breaks a byte rule of PROTOCOL.md section 4, and why (None when
    none does). `rows` is `(K, key_length(d))` uint8 with one domain `d`, lengths already
    checked: the rules are the flag bytes, checked for the whole batch at once."""
    d = int(rows[0, 18])
    columns = _flag_columns(d)
    flags = rows[:, columns].tobytes()
    width = len(columns)
    # every flag a bit and root_t == party: no rule below can fire (bytes ops: a request's few
    # keys cost microseconds, where numpy's per-call overhead would dominate)
    if not flags.translate(None, b"\x00\x01") and flags[0::width] == flags[1::width]:
        return None
    root_t, party = rows[:, 16], rows[:, 17]
    flags = rows[:, _HEADER : _HEADER + _LEVEL * d].reshape(len(rows), d, _LEVEL)[:, :, 16:]
    bad_level = (flags > 1).any(axis=2)  # (K, d)
    rules = (
        (party > 1, lambda i: f"party byte must be 0 or 1, got {party[i]}"),
        (root_t > 1, lambda i: f"root control bit must be 0 or 1, got {root_t[i]}"),
        (root_t != party, lambda i: "root control bit does not match the party"),
        (bad_level.any(axis=1), lambda i: (
            f"control-bit correction at level {int(np.argmax(bad_level[i]))} is not 0 or 1")),
    )
    bad = np.logical_or.reduce([mask for mask, _ in rules])
    if not bad.any():
        return None
    i = int(np.argmax(bad))
    return i, next(why(i) for mask, why in rules if mask[i])


@dataclass(frozen=True, repr=False)
class DpfKey:
    """One party's key. `repr` shows only public shape: keys are secrets and never printed."""

    root_seed: bytes
    root_t: int
    party: int
    domain_bits: int
    cw: tuple[bytes, ...]
    tcw_left: tuple[int, ...]
    tcw_right: tuple[int, ...]
    final_cw: bytes
    _raw: bytes = field(default=b"", compare=False)

    def __repr__(self) -> str:
        return f"DpfKey(party={self.party}, domain_bits={self.domain_bits})"

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> DpfKey:
        """Parse and fully validate key bytes; raises KeyFormatError on anything malformed."""
        data = bytes(data)
        if len(data) < _HEADER:
            raise KeyFormatError(f"key too short: {len(data)} bytes")
        d = data[18]
        if not MIN_DOMAIN_BITS <= d <= MAX_DOMAIN_BITS:
            raise KeyFormatError(f"key domain bits must be in 1..32, got {d}")
        if len(data) != key_length(d):
            raise KeyFormatError(
                f"a key of domain bits {d} is {key_length(d)} bytes, got {len(data)}"
            )
        problem = malformed_key(np.frombuffer(data, np.uint8).reshape(1, -1))
        if problem is not None:
            raise KeyFormatError(problem[1])
        levels = [data[_HEADER + _LEVEL * i : _HEADER + _LEVEL * (i + 1)] for i in range(d)]
        return cls(
            root_seed=data[0:16],
            root_t=data[16],
            party=data[17],
            domain_bits=d,
            cw=tuple(lv[:16] for lv in levels),
            tcw_left=tuple(lv[16] for lv in levels),
            tcw_right=tuple(lv[17] for lv in levels),
            final_cw=data[_HEADER + _LEVEL * d :],
            _raw=data,
        )

    def to_bytes(self) -> bytes:
        if self._raw:
            return self._raw
        parts = [self.root_seed, bytes((self.root_t, self.party, self.domain_bits))]
        for c, tl, tr in zip(self.cw, self.tcw_left, self.tcw_right, strict=True):
            parts += [c, bytes((tl, tr))]
        parts.append(self.final_cw)
        return b"".join(parts)

    def eval(self, page: int) -> bytes:
        """This party's 16-byte mask at `page` (a d-level path walk)."""
        d = self.domain_bits
        _check_page(page, d)
        s, t = self.root_seed, self.root_t
        for i in range(d):
            left, right, tl, tr = prg.expand(s)
            if (page >> (d - 1 - i)) & 1:
                s2, t2, tc = right, tr, self.tcw_right[i]
            else:
                s2, t2, tc = left, tl, self.tcw_left[i]
            if t:
                s2, t2 = _xor(s2, self.cw[i]), t2 ^ tc
            s, t = s2, t2
        return _xor(s, self.final_cw) if t else s


def generate_keys(
    domain_bits: int, target: int, *, seeds: tuple[bytes, bytes] | None = None
) -> tuple[DpfKey, DpfKey]:
    """Keys (for server A, for server B) whose masks XOR to ff*16 at `target`, else to zero.

    `seeds` fixes the two root seeds for known-answer tests; normal use draws them from the
    operating system's CSPRNG. The work runs jitted (microseconds a key);
    `generate_keys_reference` is the same construction in plain Python.
    """
    from morphogen.protocol import _dpf_jit

    roots = _check_keygen(domain_bits, target, seeds)
    d = domain_bits
    seed_words = np.frombuffer(roots[0] + roots[1], "<u4").reshape(2, 4).copy()
    cw = np.empty((d, 4), np.uint32)
    tcw = np.empty((d, 2), np.uint8)
    final = np.empty(4, np.uint32)
    _dpf_jit.generate_into(seed_words, target, d, cw, tcw, final)
    cw_bytes = cw.tobytes()
    return _key_pair(
        roots,
        [cw_bytes[16 * i : 16 * (i + 1)] for i in range(d)],
        [int(x) for x in tcw[:, 0]],
        [int(x) for x in tcw[:, 1]],
        final.tobytes(),
    )


def _key_pair(
    roots: tuple[bytes, bytes],
    cws: Sequence[bytes],
    tcw_left: Sequence[int],
    tcw_right: Sequence[int],
    final_cw: bytes,
) -> tuple[DpfKey, DpfKey]:
    common = dict(
        domain_bits=len(cws),
        cw=tuple(cws),
        tcw_left=tuple(tcw_left),
        tcw_right=tuple(tcw_right),
        final_cw=final_cw,
    )
    return (
        DpfKey(root_seed=roots[0], root_t=0, party=0, **common),
        DpfKey(root_seed=roots[1], root_t=1, party=1, **common),
    )


def _check_keygen(
    domain_bits: int, target: int, seeds: tuple[bytes, bytes] | None
) -> tuple[bytes, bytes]:
    _check_domain_bits(domain_bits)
    _check_page(target, domain_bits)
    if seeds is None:
        seeds = (secrets.token_bytes(SEED_BYTES), secrets.token_bytes(SEED_BYTES))
    if len(seeds) != 2 or any(len(s) != SEED_BYTES for s in seeds):
        raise ValueError("two 16-byte root seeds are needed")
    return seeds[0], seeds[1]


def generate_keys_reference(
    domain_bits: int, target: int, *, seeds: tuple[bytes, bytes] | None = None
) -> tuple[DpfKey, DpfKey]:
    """`generate_keys` step by step in plain Python, as PROTOCOL.md section 3 reads."""
    roots = _check_keygen(domain_bits, target, seeds)
    s, t = list(roots), [0, 1]
    cws, tls, trs = [], [], []
    for i in range(domain_bits):
        a = (target >> (domain_bits - 1 - i)) & 1
        e = [prg.expand(s[0]), prg.expand(s[1])]
        keep_i, lose_i = (1, 0) if a else (0, 1)
        cw = _xor(e[0][lose_i], e[1][lose_i])
        t_keep = [e[b][2 + keep_i] for b in (0, 1)]
        t_lose = [e[b][2 + lose_i] for b in (0, 1)]
        tcw_keep = t_keep[0] ^ t_keep[1] ^ t[0] ^ t[1]
        tcw_lose = t_lose[0] ^ t_lose[1] ^ t[0] ^ t[1] ^ 1
        tl, tr = (tcw_lose, tcw_keep) if a else (tcw_keep, tcw_lose)
        cws.append(cw)
        tls.append(tl)
        trs.append(tr)
        for b in (0, 1):
            kept = e[b][keep_i]
            s[b] = _xor(kept, cw) if t[b] else kept
            t[b] = t_keep[b] ^ (tcw_keep if t[b] else 0)
    return _key_pair(roots, cws, tls, trs, _xor(_xor(s[0], s[1]), _ALL_ONES))


_KEY_FIELDS = ("root_seed", "root_t", "cw", "tcw", "final_cw")


class StackedKeys:
    """What every stacked key batch shares (KeyBatch, packed.PackedKeyBatch): the five arrays
    of `_KEY_FIELDS`, read-only from construction on, pickled through the constructor, cut
    and joined key-wise. A base, not a common class to reach for: a batch of one format is
    never taken for the other (an engine that knows only KeyBatch refuses packed batches)."""

    domain_bits: int

    def __post_init__(self) -> None:
        for name in _KEY_FIELDS:
            getattr(self, name).flags.writeable = False

    def __reduce__(self):
        # through __init__, so that an unpickled batch is read-only like any other
        return type(self), (self.domain_bits, *(getattr(self, f) for f in _KEY_FIELDS))

    def __len__(self) -> int:
        return int(self.root_seed.shape[0])  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(keys={len(self)}, domain_bits={self.domain_bits})"

    @classmethod
    def _joined(cls, batches: Sequence[StackedKeys]):
        if len(batches) == 1:
            return batches[0]
        d = batches[0].domain_bits
        if any(b.domain_bits != d for b in batches):
            raise DomainError("all keys of one batch must share one domain")
        return cls(d, *(np.concatenate([getattr(b, f) for b in batches])  # type: ignore[call-arg]
                        for f in _KEY_FIELDS))

    def select(self, start: int, stop: int):
        """Keys [start, stop) as a batch of their own (for chunked scans)."""
        return type(self)(self.domain_bits,  # type: ignore[call-arg]
                          *(getattr(self, f)[start:stop] for f in _KEY_FIELDS))


@dataclass(frozen=True, repr=False)
class KeyBatch(StackedKeys):
    """Keys of one domain stacked for the engines: the one form keys take from the server's
    parser to the kernels.

    Its arrays are C-contiguous and read-only, always (the batch owns them: they cross Ray's
    object store and are shared by concurrent scans, and one read-only flag means one jitted
    signature), so a shard scans what it receives without copying it.
    """

    domain_bits: int
    root_seed: np.ndarray  # (K, 4) uint32: the seed bytes as little-endian words
    root_t: np.ndarray  # (K,) uint8
    cw: np.ndarray  # (K, d, 4) uint32
    tcw: np.ndarray  # (K, d, 2) uint8: [..., 0] left, [..., 1] right
    final_cw: np.ndarray  # (K, 4) uint32

    @classmethod
    def from_rows(cls, rows: np.ndarray) -> KeyBatch:
        """Serialized keys, one per row of a `(K, key_length(d))` uint8 array, fully validated
        (KeyFormatError names the first bad row in `index`; DomainError for mixed domains)."""
        if rows.ndim != 2 or rows.dtype != np.uint8 or not len(rows):
            raise ValueError("key rows are a non-empty (K, key length) uint8 array")
        d = int(rows[0, 18]) if rows.shape[1] > 18 else 0
        if not MIN_DOMAIN_BITS <= d <= MAX_DOMAIN_BITS or rows.shape[1] != key_length(d):
            raise KeyFormatError(f"rows of {rows.shape[1]} bytes are not keys of domain {d}")
        if rows[:, 18].tobytes() != bytes((d,)) * len(rows):
            raise DomainError("all keys of one batch must share one domain")
        problem = malformed_key(rows)
        if problem is not None:
            raise KeyFormatError(problem[1], problem[0])
        k = len(rows)
        levels = rows[:, _HEADER : _HEADER + _LEVEL * d].reshape(k, d, _LEVEL)
        return cls(
            domain_bits=d,
            root_seed=rows[:, 0:16].copy().view("<u4"),
            root_t=rows[:, 16].copy(),
            cw=levels[:, :, :16].copy().view("<u4"),
            tcw=levels[:, :, 16:18].copy(),
            final_cw=rows[:, _HEADER + _LEVEL * d :].copy().view("<u4"),
        )

    @classmethod
    def from_keys(cls, keys: Sequence[DpfKey]) -> KeyBatch:
        if not keys:
            raise ValueError("a key batch needs at least one key")
        d = keys[0].domain_bits
        if any(k.domain_bits != d for k in keys):
            raise DomainError("all keys of one batch must share one domain")
        raw = b"".join(k.to_bytes() for k in keys)
        return cls.from_rows(np.frombuffer(raw, np.uint8).reshape(len(keys), -1))

    @classmethod
    def concat(cls, batches: Sequence[KeyBatch]) -> KeyBatch:
        """One batch of the keys of `batches`, in order (a coalesced group)."""
        return cls._joined(batches)

    def keys(self) -> list[DpfKey]:
        """The batch back as key objects (the reference engine walks them one by one)."""
        d = self.domain_bits
        out = []
        for i in range(len(self)):
            levels = np.concatenate(
                [self.cw[i].view(np.uint8).reshape(d, 16), self.tcw[i]], axis=1
            )
            header = bytes((int(self.root_t[i]), int(self.root_t[i]), d))
            raw = b"".join(
                (self.root_seed[i].tobytes(), header, levels.tobytes(), self.final_cw[i].tobytes())
            )
            out.append(DpfKey.from_bytes(raw))
        return out



def as_batch(keys: Sequence[DpfKey] | KeyBatch) -> KeyBatch:
    return keys if isinstance(keys, KeyBatch) else KeyBatch.from_keys(keys)


def eval_range(key: DpfKey, start: int, stop: int) -> np.ndarray:
    """Masks of pages [start, stop) as a (stop-start, 16) uint8 array (breadth-first)."""
    from morphogen.protocol import _dpf_jit

    d = key.domain_bits
    if not 0 <= start <= stop <= (1 << d):
        raise DomainError(f"range [{start}, {stop}) is outside the domain of 2^{d} pages")
    b = KeyBatch.from_keys([key])
    out = np.empty((stop - start, 4), np.uint32)
    if stop > start:
        _dpf_jit.eval_range_into(
            b.root_seed[0], b.root_t[0], b.cw[0], b.tcw[0], b.final_cw[0], d, start, stop,
            out, *_dpf_jit.new_scratch(),
        )
    return out.view(np.uint8).reshape(stop - start, MASK_BYTES)


def eval_points(keys: Sequence[DpfKey] | KeyBatch, pages: Sequence[int] | np.ndarray) -> np.ndarray:
    """Masks of every key at every page: (K, len(pages), 16) uint8."""
    from morphogen.protocol import _dpf_jit

    batch = as_batch(keys)
    pts = np.ascontiguousarray(pages, dtype=np.int64).reshape(-1)
    d = batch.domain_bits
    if pts.size and (pts.min() < 0 or pts.max() >= (1 << d)):
        raise DomainError(f"a page is outside the domain of 2^{d} pages")
    out = np.empty((len(batch), pts.size, 4), np.uint32)
    _dpf_jit.eval_points_into(
        batch.root_seed, batch.root_t, batch.cw, batch.tcw, batch.final_cw, d, pts, out
    )
    return out.view(np.uint8).reshape(len(batch), pts.size, MASK_BYTES)
