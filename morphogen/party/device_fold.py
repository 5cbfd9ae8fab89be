"""Pending page updates folded into a GPU shard's device copy, in place.

On the CPU engines a fold writes pending updates into the host pages in place, under the same
gate (morphogen.party.host_fold). On a GPU shard the scans read the device copy, so the fold
writes the updates there (GpuShard.write_pages: 4 KiB a changed page crosses the bus, untouched
pages never again) and keeps the segment: its scanner, its table scanners and its lease stay
what they were. The shard's host copy (`read_verified`'s, its own array) takes the same XORs in
place (host_fold.plan_in_place: the words an update changes), so it always holds what the device
holds: later page writes, the self-test and a rotation's comparison read it, and nothing of a
fold outlives it on the host (no per-page copies that grow with every page ever changed).

A write changes the data the device answers from, so it must fall between scans of whole
versions: ShardState holds its scan gate (gpu_writes.ScanGate) around every scan, from the
version's lease to its last partial, and the write side around the write and the version swap.
Scans in flight finish on their epoch first; scans after the swap read the folded version,
whose answers are the same bytes (a fold never changes an epoch's answers) without the
per-query CPU pass over pending updates.

A rotation to a snapshot of the same range (a compaction, a re-export of the same state) keeps
the device copy too: staging compares the new verified pages with what the device holds and
keeps the diff of the pages that differ (`rotation_diff`), and the commit writes it under the
gate like a fold. The new version's segment shares the device shard (GpuShard.share), so
retiring the old one does not free it. Where more than a quarter of the pages differ, a fresh
load is cheaper and is what happens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from morphogen.party.host_fold import Writes, owner_of, xor_in_place
from morphogen.party.pending import Pending
from morphogen.party.version import Segment, Version
from morphogen.protocol.identity import EpochIdentity
from morphogen.snapshot.reader import Snapshot

# A rotation changing more than this share of the range loads it afresh instead.
ROTATION_DIFF_MAX = 0.25
_COMPARE_PAGES = 1 << 14  # pages compared at a time (64 MiB)


def device_writable(version: Version) -> bool:
    """Whether every segment of the version scans a device copy that takes writes, and its
    host pages are an array of this process's own that takes the same writes."""
    return bool(version.segments) and all(
        callable(getattr(s.scanner, "write_pages", None)) and owner_of(s.pages) is not None
        for s in version.segments)


def fold_on_device(base: Version, writes: Writes, swap: Callable[[Version], None]) -> Version:
    """Write `base`'s pending updates into its segments' device copies and, as
    `plan_in_place(base)` planned (checked whole before anything is written; made before
    the gate, where its kernel loads), into their host copies, then `swap` in the version
    that no longer carries them (the caller holds the scan gate's write side). A failed
    write leaves the copies undefined: the caller must stop serving them."""
    pages, diffs = base.pending.merged()
    for seg in base.segments:
        lo, hi = seg.first_page, seg.first_page + seg.pages.shape[0]
        mine = (pages >= lo) & (pages < hi)
        if mine.any():
            seg.scanner.write_pages(pages[mine], diffs[mine])  # type: ignore[attr-defined]
    xor_in_place(writes)
    folded = replace(base, pending=Pending())
    swap(folded)
    return folded


def rotation_diff(current: Version, pages: np.ndarray,
                  first_page: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(global pages, diffs) that turn what `current`'s device copy holds into `pages` (the
    same range's new verified copy), or None where a fresh load is the better way: the range
    or the segments differ, updates are pending, or too many pages changed."""
    if (len(current.segments) != 1 or current.pending or current.first_page != first_page
            or current.stop_page - first_page != pages.shape[0]
            or not callable(getattr(current.segments[0].scanner, "share", None))
            or not device_writable(current)):
        return None
    seg = current.segments[0]
    n = pages.shape[0]
    changed: list[np.ndarray] = []
    for lo in range(0, n, _COMPARE_PAGES):  # the host copy holds what the device holds
        hi = min(n, lo + _COMPARE_PAGES)
        differs = np.any(np.asarray(seg.pages[lo:hi]) != pages[lo:hi], axis=1)
        changed.append(np.flatnonzero(differs) + lo)
    local = np.concatenate(changed) if changed else np.zeros(0, np.int64)
    if local.size > ROTATION_DIFF_MAX * n:
        return None
    diffs = pages[local] ^ np.asarray(seg.pages)[local]
    return local + first_page, diffs


def stage_rotation(current: Version, snapshot: Snapshot, first_page: int, pages: np.ndarray,
                   epoch_id: int) -> Version | None:
    """The staged version of a rotation to `snapshot`'s range `pages` (verified) that keeps
    `current`'s device copy: its segment shares the device shard, and it carries the diff
    its commit writes. None where a fresh load is the way (rotation_diff)."""
    diff = rotation_diff(current, pages, first_page)
    if diff is None:
        return None
    identity = EpochIdentity.of_snapshot(epoch_id, snapshot.fingerprint())
    shared = current.segments[0].scanner.share()  # type: ignore[attr-defined]
    return Version(identity, snapshot, first_page, first_page + pages.shape[0],
                   (Segment(first_page, pages, shared),), device_diffs=diff)


def commit_rotation(staged: Version, swap: Callable[[Version], None]) -> Version:
    """A staged rotation's diff into the device copy, then the version swapped in (the caller
    holds the scan gate's write side); returns the version swapped in."""
    assert staged.device_diffs is not None
    where, diffs = staged.device_diffs
    if where.size:
        staged.segments[0].scanner.write_pages(where, diffs)  # type: ignore[attr-defined]
    ready = replace(staged, device_diffs=None)
    swap(ready)
    return ready
