"""Pending page updates folded into the host pages the CPU engines scan.

In place, where it can (`plan_in_place`, `write_in_place`): a shard's pages are its own copy
(`read_verified`'s, never the file's mapping), and the CPU engines scan those very arrays, so a
fold XORs each pending update into its page and swaps in the same segments without the updates:
only the 8-byte words an update changes are written (a block's diff is a few dozen bytes of its
page), whatever the shard's size, and no segment split. The write changes what every version
sharing those segments reads, so, as on a GPU shard (morphogen.party.device_fold), it runs
under the scan gate's write side: the scans in flight (on the version with the updates
pending) finish first, and every later scan reads the folded version, whose answers are the
same bytes.

Otherwise (`fold_on_host`: an engine that scans a copy of its own), every touched chunk becomes
a private copy and the untouched runs around it become segments of their own (views of the
loaded pages, no copy), which no scan in flight reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numba
import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.engine.base import Engine
from morphogen.party.pending import Pending
from morphogen.party.version import Segment, Version


def host_writable(version: Version) -> bool:
    """Whether every segment's scanner reads the segment's pages themselves, and those pages
    are an array of this process's own (`owner_of`), so a write into them is what scans read."""
    return bool(version.segments) and all(
        getattr(s.scanner, "reads_in_place", False) and owner_of(s.pages) is not None
        for s in version.segments)


def owner_of(pages: np.ndarray) -> np.ndarray | None:
    """The C-contiguous (n, 4096) uint8 array owning the memory of `pages` (a row range of
    it, or itself); None for memory of another kind (a mapping, a foreign buffer)."""
    arr = pages
    while isinstance(arr.base, np.ndarray):
        arr = arr.base
    if not (arr.flags.owndata and arr.flags.c_contiguous and arr.dtype == np.uint8
            and arr.ndim == 2 and arr.shape[1] == PAGE_SIZE and pages.flags.c_contiguous):
        return None
    return arr


# (owner, its rows, the pending diffs, which of them go to those rows)
Writes = list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]


def plan_in_place(base: Version) -> Writes:
    """Where each of `base`'s pending updates goes in the arrays its segments' pages live in
    (`host_writable(base)`): checked whole before `write_in_place` writes anything, so a plan
    that cannot be carried out leaves every page as it was."""
    pages, diffs = base.pending.pages, base.pending.diffs
    firsts = np.array([s.first_page for s in base.segments], np.int64)
    order = np.argsort(firsts, kind="stable")
    where = order[np.maximum(np.searchsorted(firsts[order], pages, "right") - 1, 0)]
    out: Writes = []
    for i, seg in enumerate(base.segments):
        mine = np.flatnonzero(where == i)
        if not mine.size:
            continue
        rows = pages[mine] - seg.first_page
        if rows.min() < 0 or rows.max() >= seg.pages.shape[0]:
            raise IndexError("a pending update outside every segment of the version")
        owner = owner_of(seg.pages)
        if owner is None:
            raise ValueError("a segment's pages are not an array of this process's own")
        rows += (seg.pages.__array_interface__["data"][0]
                 - owner.__array_interface__["data"][0]) // PAGE_SIZE
        out.append((owner, rows, diffs, mine))
    words = _words(diffs)
    if out and words is not None:
        # compiled (or loaded from numba's cache) here, not under the scan gate, where a first
        # fold's compilation would hold every scan of the shard; the pages are read-only until
        # then, so a writable array of their type stands in for them
        _, rows, _, mine = out[0]
        _xor_changed_words(np.zeros((1, PAGE_SIZE // 8), np.uint64), rows[:0], words, mine[:0])
    return out


@numba.njit(cache=True)
def _xor_changed_words(owner, rows, diffs, which):
    """owner[rows[i]] ^= diffs[which[i]], in order, writing only the words a diff changes: a
    diff is read once from front to back, and a page it leaves alone is never touched."""
    for i in range(rows.shape[0]):
        r = rows[i]
        d = which[i]
        for j in range(diffs.shape[1]):
            x = diffs[d, j]
            if x != 0:
                owner[r, j] ^= x


def _words(arr: np.ndarray) -> np.ndarray | None:
    """`arr` (n, 4096) uint8 as (n, 512) uint64 where its memory allows, else None."""
    if arr.flags.c_contiguous and arr.ctypes.data % 8 == 0:
        return arr.view(np.uint64)
    return None


def write_in_place(base: Version, writes: Writes, c: int,
                   swap: Callable[[Version], None]) -> Version:
    """XOR `plan_in_place(base)` into the pages and `swap` in the version without the pending
    updates (the caller holds the scan gate's write side). Chunks of `c` pages written are
    added to `folded` (what `info()` counts)."""
    xor_in_place(writes)
    pages = base.pending.pages
    folded = replace(base, pending=Pending(), folded=base.folded | frozenset((pages // c).tolist()))
    swap(folded)
    return folded


def xor_in_place(writes: Writes) -> None:
    """The diffs of `plan_in_place`'s plan XORed into the arrays it names."""
    for owner, rows, diffs, mine in writes:
        was = owner.flags.writeable
        owner.flags.writeable = True
        try:
            into, words = _words(owner), _words(diffs)
            if into is not None and words is not None:
                _xor_changed_words(into, rows, words, mine)
            elif np.unique(rows).size == rows.size:
                owner[rows] ^= diffs[mine]
            else:  # a page updated twice: both diffs, in any order (XOR commutes)
                np.bitwise_xor.at(owner, rows, diffs[mine])
        finally:
            owner.flags.writeable = was


def fold_on_host(base: Version, engine: Engine, c: int) -> Version:
    """A version with `base`'s answers and no pending updates: each touched chunk of `c`
    pages a private copy (a segment of its own, loaded), the untouched runs around it
    segments of their own (views)."""
    touched: dict[int, np.ndarray] = {}
    for u in base.pending:
        idx = u.page // c
        if idx not in touched:
            lo = max(base.first_page, idx * c)
            hi = min(base.stop_page, (idx + 1) * c)
            touched[idx] = np.stack([base.stored_page(p) for p in range(lo, hi)])
        lo = max(base.first_page, idx * c)
        touched[idx][u.page - lo] ^= np.frombuffer(u.diff, np.uint8)
    kept = []
    for seg in base.segments:
        lo, hi = seg.first_page, seg.first_page + seg.pages.shape[0]
        if any(lo < (i + 1) * c and i * c < hi for i in touched):
            kept.extend(_split_around(seg, touched, c, engine))
        else:
            kept.append(seg)
    for idx, arr in touched.items():
        lo = max(base.first_page, idx * c)
        # never written again; read-only like the loaded pages, so a jitted engine reuses
        # the kernel it compiled for those instead of compiling another signature
        arr.flags.writeable = False
        kept.append(Segment(lo, arr, engine.load(arr, first_page=lo)))
    kept.sort(key=lambda s: s.first_page)
    return Version(
        identity=base.identity,
        snapshot=base.snapshot,
        first_page=base.first_page,
        stop_page=base.stop_page,
        segments=tuple(kept),
        pending=Pending(),
        folded=base.folded | frozenset(touched),
    )

def _split_around(seg: Segment, touched: dict[int, np.ndarray], c: int,
                  engine: Engine) -> list[Segment]:
    """The parts of `seg` outside the touched chunks, as segments of their own."""
    lo, hi = seg.first_page, seg.first_page + seg.pages.shape[0]
    out, run_start = [], lo
    p = lo
    while p < hi:
        idx = p // c
        chunk_end = min(hi, (idx + 1) * c)
        if idx in touched:
            if run_start < p:
                view = seg.pages[run_start - lo : p - lo]
                out.append(Segment(run_start, view, engine.load(view, run_start)))
            run_start = chunk_end
        p = chunk_end
    if run_start < hi:
        view = seg.pages[run_start - lo : hi - lo]
        out.append(Segment(run_start, view, engine.load(view, run_start)))
    return out
