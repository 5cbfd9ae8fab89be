"""A stable sort of 64-bit keys on every core, for keys spread evenly over their range (hashes,
tags): the keys dealt into buckets by their top bits in two passes over parallel pieces, then
each bucket sorted on its own. numpy's sort runs on one core, and a table's build sorts its
tags twice (the repeat check and the key index), the largest serial steps left after the
placement itself.
"""

from __future__ import annotations

import numba
import numpy as np

BUCKET_BITS = 16
SMALL = 1 << 18  # below this many keys numpy's sort is as quick
TIE_RUNS = 1024  # `rows_argsort`: more runs alike in their first 8 bytes than this, one sort


@numba.njit(cache=True, parallel=True)
def _deal(keys, shift, buckets, pieces):
    n = len(keys)
    step = (n + pieces - 1) // pieces
    counts = np.zeros((pieces, buckets), np.int64)
    for c in numba.prange(pieces):
        for i in range(c * step, min(n, (c + 1) * step)):
            counts[c, np.int64(keys[i] >> shift)] += 1
    # each piece's rows of a bucket after the earlier pieces' rows of it: stable
    at = np.empty((pieces, buckets), np.int64)
    starts = np.empty(buckets + 1, np.int64)
    total = 0
    for b in range(buckets):
        starts[b] = total
        for c in range(pieces):
            at[c, b] = total
            total += counts[c, b]
    starts[buckets] = total
    order = np.empty(n, np.int64)
    ranked = np.empty(n, np.uint64)
    for c in numba.prange(pieces):
        pos = at[c].copy()
        for i in range(c * step, min(n, (c + 1) * step)):
            b = np.int64(keys[i] >> shift)
            order[pos[b]] = i
            ranked[pos[b]] = keys[i]
            pos[b] += 1
    for b in numba.prange(buckets):
        a, e = starts[b], starts[b + 1]
        if e - a > 1:
            o = np.argsort(ranked[a:e], kind="mergesort")
            order[a:e] = order[a:e][o]
            ranked[a:e] = ranked[a:e][o]
    return order, ranked


def argsort(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, keys[order]) with `order` what `np.argsort(keys, kind="stable")` gives."""
    keys = np.ascontiguousarray(keys, np.uint64).reshape(-1)
    if len(keys) < SMALL:
        order = np.argsort(keys, kind="stable")
        return order, keys[order]
    pieces = 4 * max(1, numba.get_num_threads())
    return _deal(keys, np.uint64(64 - BUCKET_BITS), 1 << BUCKET_BITS, pieces)


def rows_argsort(rows: np.ndarray) -> np.ndarray:
    """The stable order of byte rows (`(n, width)` uint8) compared as bytes: one `argsort`
    of their first 8 bytes, then each run of rows alike in those sorted by the rest. Rows
    that are addresses or hashes almost never tie there; where many runs do, one sort of
    every column."""
    rows = np.ascontiguousarray(rows, np.uint8)
    n, width = rows.shape
    head = np.zeros((n, 8), np.uint8)
    head[:, :min(8, width)] = rows[:, :8]
    order, ranked = argsort(head.view(">u8").reshape(-1).astype(np.uint64))
    if width <= 8 or n < 2:
        return order
    alike = np.diff(np.concatenate([[0], (ranked[1:] == ranked[:-1]).view(np.int8), [0]]))
    starts, ends = np.flatnonzero(alike == 1), np.flatnonzero(alike == -1) + 1
    if len(starts) > TIE_RUNS:
        return np.lexsort(rows.T[::-1])
    for a, e in zip(starts.tolist(), ends.tolist(), strict=True):
        run = order[a:e]
        order[a:e] = run[np.lexsort(rows[run, 8:].T[::-1])]
    return order
