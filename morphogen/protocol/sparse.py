"""Page changes as the bytes that changed: a batch's data buffer with its zero runs left out.

A block re-signs a few thousand pages but changes a few dozen bytes of each (a record's slot,
a 32-byte hash in each tree page above it, the descriptor), so its XOR diffs are nearly all
zeros. Sent and stored as whole pages, a block cost what it touched (4 KiB a page, more pages
the larger the table); as runs of the bytes that differ it costs what it changed.

Form (little-endian): ``u64 size`` (the dense buffer's length), ``u64 runs``, then ``runs``
starts (u64, strictly increasing, each past the end of the run before), ``runs`` lengths
(u32, each at least 1), then the runs' bytes back to back. Zero runs shorter than `GAP` bytes
inside a change are kept (a run's 12 bytes of header cost more than they save).

`pack` writes one form of a buffer, its *canonical* form: every run starts and ends with a
changed byte, holds no `GAP` zeros in a row, and starts `GAP` bytes or more past the run
before (or where that run reached `LONGEST`). A batch's digest (`ChangeBatch.digest`, version
2) hashes that form, so `GAP` and `LONGEST` are part of the protocol: changing either changes
every such digest. Any other valid form (a client's own runs) is read as well, and
`canonical` turns it into this one.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Iterator

import numba
import numpy as np

GAP = 12
LONGEST = (1 << 32) - 1  # a run's length is a u32: a longer stretch of changes is split
_HEAD = struct.Struct("<QQ")


class SparseError(ValueError):
    """Bytes that are not a sparse buffer, or not of the size expected."""


@numba.njit(cache=True, inline="always")
def _room(n, gap, longest):
    """Starts and ends for the runs of an n-byte buffer: at most this many, as runs are at
    least `gap` zeros apart or split at `longest`."""
    bound = n // (gap + 1) + n // longest + 2
    return np.empty(bound, np.int64), np.empty(bound, np.int64)


@numba.njit(cache=True, inline="always")
def joins(start, end, i, gap, longest):
    """Whether a changed byte at `i` joins the run [start, end) before it: the rule that makes
    a form canonical, and so part of digest version 2 (`pack`, `canonical`, `compose`)."""
    return i - end < gap and i + 1 - start <= longest


@numba.njit(cache=True, inline="always")
def _add(starts, ends, k, i, gap, longest):
    """The nonzero byte at `i` (past every byte added before it) joins run k, or starts run
    k + 1; returns the last run's index."""
    if k >= 0 and joins(starts[k], ends[k], i, gap, longest):
        ends[k] = i + 1
        return k
    starts[k + 1] = i
    ends[k + 1] = i + 1
    return k + 1


@numba.njit(cache=True)
def _runs(buf, words, gap, longest):
    """Starts and ends of the runs covering the nonzero bytes of `buf`, merging runs closer
    than `gap`, none longer than `longest`: one pass, eight zero bytes at a time (`words`:
    `buf`'s whole 8-byte words), never an index of every changed byte."""
    n = len(buf)
    starts, ends = _room(n, gap, longest)
    k = -1
    i = 0
    while i < n:
        if i % 8 == 0 and i // 8 < len(words) and words[i // 8] == 0:
            i += 8
            continue
        if buf[i] != 0:
            k = _add(starts, ends, k, i, gap, longest)
        i += 1
    return starts[:k + 1].copy(), ends[:k + 1].copy()


@numba.njit(cache=True)
def _gather(buf, starts, ends, out):
    at = 0
    for r in range(len(starts)):
        n = ends[r] - starts[r]
        out[at:at + n] = buf[starts[r]:ends[r]]
        at += n


def pack(data: bytes | bytearray | memoryview | np.ndarray) -> bytes:
    """The sparse form of `data`."""
    buf = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) \
        else np.ascontiguousarray(data, np.uint8).reshape(-1)
    whole = len(buf) // 8 * 8
    starts, ends = _runs(buf, buf[:whole].view(np.uint64), GAP, LONGEST)
    return _form(len(buf), starts, ends, lambda out: _gather(buf, starts, ends, out))


def _form(size: int, starts: np.ndarray, ends: np.ndarray,
          fill: Callable[[np.ndarray], None]) -> bytes:
    """The sparse form of a `size`-byte buffer with these runs, `fill(out)` writing the
    runs' bytes back to back into `out`."""
    payload = np.empty(int((ends - starts).sum(dtype=np.int64)), np.uint8)
    fill(payload)
    return form_of(size, starts, ends, payload)


def form_of(size: int, starts: np.ndarray, ends: np.ndarray, payload: np.ndarray) -> bytes:
    """The sparse form of a `size`-byte buffer with these runs, whose bytes are `payload`
    back to back."""
    return b"".join((_HEAD.pack(size, len(starts)), starts.astype("<u8").tobytes(),
                     (ends - starts).astype("<u4").tobytes(), payload.tobytes()))


@numba.njit(cache=True)
def _xor_runs(rows, at, was, which, gap, longest):
    """`_runs` of the buffer whose row j is rows[at[j]] ^ was[which[j]] (8-byte words),
    without making it: one pass over both, a word at a time, skipping equal words."""
    width = rows.shape[1] * 8
    starts, ends = _room(len(at) * width, gap, longest)
    k = -1
    for j in range(len(at)):
        row, old = rows[at[j]], was[which[j]]
        for w in range(rows.shape[1]):
            x = row[w] ^ old[w]
            if x == 0:
                continue
            for b in range(8):
                if ((x >> np.uint64(8 * b)) & np.uint64(0xFF)) == 0:  # little-endian bytes
                    continue
                k = _add(starts, ends, k, j * width + w * 8 + b, gap, longest)
    return starts[:k + 1].copy(), ends[:k + 1].copy()


@numba.njit(cache=True)
def _xor_gather(rows, at, was, which, starts, ends, out):
    width = rows.shape[1]
    o = 0
    for r in range(len(starts)):
        for i in range(starts[r], ends[r]):
            j, c = i // width, i % width
            out[o] = rows[at[j], c] ^ was[which[j], c]
            o += 1


def pack_xor(pages: np.ndarray, at: np.ndarray, was: np.ndarray,
             which: np.ndarray | None = None) -> bytes:
    """`pack` of the XOR of pages[at] with the rows `was[which]` (`which` None: `was` has a row
    for each of `at`, in order), read from both in place: what changed in pages a block
    rewrote, without a dense copy of their diffs."""
    which = np.arange(len(at)) if which is None else which
    if (pages.ndim != 2 or was.ndim != 2 or was.shape[1] != pages.shape[1]
            or len(which) != len(at) or pages.shape[1] % 8):
        raise ValueError("pack_xor takes a (pages, width) array, pages' rows to XOR, and a "
                         "row as each was for as many")
    if sys.byteorder != "little":  # the kernel reads a word's bytes lowest first
        return pack((np.asarray(pages)[at] ^ np.asarray(was)[which]).tobytes())
    rows = np.asarray(pages).view(np.uint8)
    was = np.ascontiguousarray(was, np.uint8)
    at = np.ascontiguousarray(at, np.int64)
    which = np.ascontiguousarray(which, np.int64)
    starts, ends = _xor_runs(rows.view(np.uint64), at, was.view(np.uint64), which, GAP,
                             LONGEST)
    return _form(len(at) * rows.shape[1], starts, ends,
                 lambda out: _xor_gather(rows, at, was, which, starts, ends, out))


def _parsed(raw: bytes | bytearray | memoryview, size: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, payload offsets, payload) of the runs of a sparse form of `size` bytes,
    checked whole."""
    raw = memoryview(raw).cast("B")
    if len(raw) < _HEAD.size:
        raise SparseError(f"a sparse buffer starts with {_HEAD.size} bytes, got {len(raw)}")
    total, runs = _HEAD.unpack_from(raw)
    if total != size:
        raise SparseError(f"the sparse buffer is of {total} bytes, {size} expected")
    if runs > total or _HEAD.size + 12 * runs > len(raw):
        raise SparseError(f"{runs} runs do not fit in {len(raw)} bytes")
    starts = np.frombuffer(raw, "<u8", runs, _HEAD.size)
    # each start checked as the unsigned number it is before any sum: a start near 2^63
    # wrapped `start + length` negative, and a run past the buffer passed as in order
    if runs and int(starts.max()) > total:
        raise SparseError("the runs overlap, are empty or leave the buffer")
    starts = starts.astype(np.int64)
    lengths = np.frombuffer(raw, "<u4", runs, _HEAD.size + 8 * runs).astype(np.int64)
    body = _HEAD.size + 12 * runs
    ends = starts + lengths  # at most total + 2^32: no overflow
    if runs and (int(lengths.min()) < 1 or int(ends.max()) > total
                 or bool((starts[1:] < ends[:-1]).any())):
        raise SparseError("the runs overlap, are empty or leave the buffer")
    if len(raw) - body != int(lengths.sum()):
        raise SparseError(f"{len(raw) - body} bytes of runs, {int(lengths.sum())} named")
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    return starts, ends, offsets, np.frombuffer(raw, np.uint8, len(raw) - body, body)


@numba.njit(cache=True)
def _is_canonical(payload, starts, ends, offsets, gap, longest):
    """Whether these runs are the ones `pack` finds (`_runs` and `_add`) in the buffer they
    make: one pass over the runs' bytes, none over the zeros between them."""
    for r in range(len(starts)):
        first = offsets[r]
        last = first + ends[r] - starts[r] - 1
        if payload[first] == 0 or payload[last] == 0:
            return False
        if r > 0 and joins(starts[r - 1], ends[r - 1], starts[r], gap, longest):
            return False  # `pack` would have joined it to the run before
        zeros = 0
        for j in range(first, last):
            if payload[j] == 0:
                zeros += 1
                if zeros >= gap:
                    return False  # `pack` would have split it there
            else:
                zeros = 0
    return True


def canonical(raw: bytes | bytearray | memoryview, size: int) -> bytes:
    """The canonical form (`pack`'s) of the buffer the sparse form `raw` of `size` bytes
    stands for: `raw` itself where it is that form (a pass over its changed bytes, the case
    of every form this project writes), else packed again from the buffer it makes.
    SparseError as `unpack`."""
    starts, ends, offsets, payload = _parsed(raw, size)
    if _is_canonical(payload, starts, ends, offsets, GAP, LONGEST):
        return bytes(raw)
    return pack(unpack_array(raw, size))


def check(raw: bytes | bytearray | memoryview, size: int) -> None:
    """SparseError unless `raw` is a sparse form of `size` bytes (what `unpack` would take)."""
    _parsed(raw, size)


def unpack(raw: bytes | bytearray | memoryview, size: int) -> bytes:
    """The dense buffer of `size` bytes of a sparse form (SparseError when it is malformed or
    of another size: the size comes from the caller, never from the bytes alone)."""
    return unpack_array(raw, size).tobytes()


def unpack_array(raw: bytes | bytearray | memoryview, size: int) -> np.ndarray:
    """`unpack` as a new array (uint8, `size`), without the copy to bytes: for a reader that
    copies what it keeps out of it anyway (a shard's pages of a batch)."""
    starts, ends, offsets, payload = _parsed(raw, size)
    out = np.zeros(size, np.uint8)
    _scatter_window(payload, starts, ends, offsets, 0, 0, size, out)
    return out


@numba.njit(cache=True)
def _scatter_window(payload, starts, ends, offsets, first, lo, hi, out):
    """The runs' bytes that fall in [lo, hi) into out[0:hi - lo] (zeroed by the caller), from
    run `first` on; returns the first run that may reach past `hi`."""
    r = first
    while r < len(starts) and ends[r] <= lo:
        r += 1
    k = r
    while k < len(starts) and starts[k] < hi:
        a = max(starts[k], lo)
        b = min(ends[k], hi)
        at = offsets[k] + a - starts[k]
        out[a - lo:b - lo] = payload[at:at + b - a]
        k += 1
    return r


def dense_chunks(raw: bytes | bytearray | memoryview, size: int,
                 chunk: int = 1 << 20) -> Iterator[memoryview]:
    """The dense buffer of a sparse form, `chunk` bytes at a time (the last one shorter), never
    whole: each chunk is a view of one buffer, rewritten for the next, so it is read (hashed)
    before the next is asked for. SparseError, before the first chunk, as `unpack`."""
    starts, ends, offsets, payload = _parsed(raw, size)
    buf = np.zeros(min(chunk, size), np.uint8)
    view = memoryview(buf)
    first = 0
    for lo in range(0, size, chunk):
        hi = min(size, lo + chunk)
        buf[:hi - lo] = 0
        first = _scatter_window(payload, starts, ends, offsets, first, lo, hi, buf)
        yield view[:hi - lo]


def warm() -> None:
    """Load (or compile) the kernels now: a process that will publish calls it as it starts,
    so that its first batch does not wait for them."""
    raw = pack(np.arange(64, dtype=np.uint8))
    pack_xor(np.zeros((2, 64), np.uint8), np.array([1]), np.ones((1, 64), np.uint8),
             np.array([0]))
    pack(bytes(range(64)))  # bytes come as a read-only array: numba's other signature
    unpack(raw, 64)
    canonical(raw, 64)
    for _ in dense_chunks(raw, 64, 16):
        pass
