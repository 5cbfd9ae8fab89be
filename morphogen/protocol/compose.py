"""Many update batches as one, made from their changed bytes (`changes.composed`).

A party's log folds every update since its last rotation into one batch at each compaction
(`morphogen.publication.compaction`), so the batch grows with the pages changed since then:
at a block of a few thousand pages every 12 s, millions of pages within hours. Made as whole
pages, each of them cost 4 KiB of memory several times over and a Python step; here a page
costs what changed in it (its runs, `morphogen.protocol.sparse`) plus one pass over a 4 KiB
scratch page, and the result is the canonical sparse form itself (what `sparse.pack` of the
whole pages would write), never the whole pages.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.protocol import sparse


@numba.njit(cache=True)
def _pieces(starts, ends, offsets, page_size, first_entry, first_byte, entry, at, length, src,
            n):
    """Cut a batch's runs at its page boundaries: piece i is `length[i]` bytes at `at[i]` of
    entry `entry[i]`'s page, read from `src[i]` of the joined payloads. Appends from `n`;
    returns the new count."""
    for r in range(len(starts)):
        s = starts[r]
        while s < ends[r]:
            row = s // page_size
            cut = min(ends[r], (row + 1) * page_size)
            entry[n] = first_entry + row
            at[n] = s - row * page_size
            length[n] = cut - s
            src[n] = first_byte + offsets[r] + s - starts[r]
            n += 1
            s = cut
    return n


@numba.njit(cache=True)
def _grown(arr, need):
    if need <= len(arr):
        return arr
    out = np.empty(max(need, 2 * len(arr)), arr.dtype)
    out[:len(arr)] = arr
    return out


@numba.njit(cache=True)
def _compose(order, pages, replace, first, last, at, length, src, payload, scratch, words,
             gap, longest):
    """The composed batch's pages, flags and canonical runs (starts, ends, bytes): for each
    page, in page order, the last replacement of it with every diff after it XORed in (or
    the XOR of its diffs), materialized in `scratch` (`words`: the same memory as uint64)
    and scanned for its changed bytes, which join runs as `pack`'s do (`sparse.joins`)."""
    page_size = len(scratch)
    n = len(order)
    out_pages = np.empty(n, np.int64)
    out_flags = np.zeros(n, np.uint8)
    starts = np.empty(1024, np.int64)
    ends = np.empty(1024, np.int64)
    data = np.empty(max(1024, len(payload)), np.uint8)
    used = 0
    k = -1
    row = -1
    i = 0
    while i < n:
        page = pages[order[i]]
        j = i
        begin = i
        while j < n and pages[order[j]] == page:
            if replace[order[j]]:
                begin = j
            j += 1
        row += 1
        out_pages[row] = page
        out_flags[row] = replace[order[begin]]
        scratch[:] = 0
        for t in range(begin, j):
            e = order[t]
            for q in range(first[e], last[e]):
                a, s = at[q], src[q]
                for b in range(length[q]):
                    scratch[a + b] ^= payload[s + b]
        base = row * page_size
        for w in range(len(words)):
            if words[w] == 0:
                continue
            for x in range(w * 8, w * 8 + 8):
                if scratch[x] == 0:
                    continue
                pos = base + x
                if k >= 0 and sparse.joins(starts[k], ends[k], pos, gap, longest):
                    data = _grown(data, used + pos - ends[k] + 1)
                    data[used:used + pos - ends[k]] = 0
                    used += pos - ends[k]
                    ends[k] = pos + 1
                else:
                    k += 1
                    starts = _grown(starts, k + 1)
                    ends = _grown(ends, k + 1)
                    data = _grown(data, used + 1)
                    starts[k] = pos
                    ends[k] = pos + 1
                data[used] = scratch[x]
                used += 1
        i = j
    return (out_pages[:row + 1], out_flags[:row + 1], starts[:k + 1], ends[:k + 1],
            data[:used])


def composed_parts(pages: Sequence[np.ndarray], replace: Sequence[np.ndarray],
                   packed: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, bytes]:
    """(pages, replace flags, canonical sparse form of the data) of the batches given as
    their page arrays, flag arrays and sparse forms (any valid form), composed in order."""
    parsed = [sparse._parsed(p, len(pg) * PAGE_SIZE) for pg, p in zip(pages, packed,
                                                                         strict=True)]
    bound = sum(len(s) + len(pg) for (s, _, _, _), pg in zip(parsed, pages, strict=True))
    entry = np.empty(bound, np.int64)
    at = np.empty(bound, np.int64)
    length = np.empty(bound, np.int64)
    src = np.empty(bound, np.int64)
    n = first_entry = first_byte = 0
    for (starts, ends, offsets, payload), pg in zip(parsed, pages, strict=True):
        n = _pieces(starts, ends, offsets, PAGE_SIZE, first_entry, first_byte, entry, at,
                    length, src, n)
        first_entry += len(pg)
        first_byte += len(payload)
    joined = (np.concatenate([p for _, _, _, p in parsed]) if parsed
              else np.zeros(0, np.uint8))
    all_pages = (np.concatenate([np.asarray(p, np.int64) for p in pages]) if pages
                 else np.zeros(0, np.int64))
    all_replace = (np.concatenate([np.asarray(r, np.uint8) for r in replace]) if replace
                   else np.zeros(0, np.uint8))
    # the pieces come in entry order (batches in order, each one's runs in order)
    entries = np.arange(len(all_pages))
    first = np.searchsorted(entry[:n], entries, "left")
    last = np.searchsorted(entry[:n], entries, "right")
    order = np.argsort(all_pages, kind="stable")  # a page's changes in the order they came
    scratch = np.zeros(PAGE_SIZE, np.uint8)
    out_pages, flags, starts, ends, data = _compose(
        order, all_pages, all_replace, first, last, at[:n], length[:n], src[:n], joined,
        scratch, scratch.view(np.uint64), sparse.GAP, sparse.LONGEST)
    return (out_pages, flags.astype(bool),
            sparse.form_of(len(out_pages) * PAGE_SIZE, starts, ends, data))


def warm() -> None:
    """Load (or compile) the kernels now."""
    one = np.zeros(PAGE_SIZE, np.uint8)
    one[7] = 1
    composed_parts([np.array([3], np.int64)], [np.array([False])], [sparse.pack(one)])
