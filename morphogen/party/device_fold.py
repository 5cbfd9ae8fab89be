"""Pending page updates folded into a GPU shard's device copy, in place.

On the CPU engines a fold writes pending updates into private host copies of the touched
chunks (morphogen.party.epoch). On a GPU shard the scans read the device copy, so the fold
writes the updates there (GpuShard.write_pages: 4 KiB a changed page crosses the bus, untouched
pages never again) and keeps the segment: its scanner, its table scanners and its lease stay
what they were. The host side only needs the changed pages' bytes for later PageWrites and the
self-test (`Version.written`: one host page per page ever changed, at most the range once).

A write changes the data the device answers from, so it must fall between scans of whole
versions: ShardState holds its scan gate (gpu_writes.ScanGate) around every scan, from the
version's lease to its last partial, and the write side around the write and the version swap.
Scans in flight finish on their epoch first; scans after the swap read the folded version,
whose answers are the same bytes (a fold never changes an epoch's answers) without the
per-query CPU pass over pending updates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.party.version import Version


def device_writable(version: Version) -> bool:
    """Whether every segment of the version scans a device copy that takes writes."""
    return all(callable(getattr(s.scanner, "write_pages", None)) for s in version.segments)


def fold_on_device(base: Version, swap: Callable[[Version], None]) -> Version:
    """Write `base`'s pending updates into its segments' device copies and `swap` in the
    version that no longer carries them (the caller holds the scan gate's write side).
    A failed write leaves the device copy undefined: the caller must stop serving it."""
    merged: dict[int, np.ndarray] = {}
    for u in base.pending:
        diff = np.frombuffer(u.diff, np.uint8)
        if u.page in merged:
            merged[u.page] = merged[u.page] ^ diff
        else:
            merged[u.page] = diff.copy()
    written = dict(base.written)
    for page, diff in merged.items():
        written[page] = (base.stored_page(page) ^ diff).tobytes()
    pages = np.fromiter(merged, np.int64, len(merged))
    diffs = (np.stack(list(merged.values())) if merged
             else np.zeros((0, PAGE_SIZE), np.uint8))
    for seg in base.segments:
        lo, hi = seg.first_page, seg.first_page + seg.pages.shape[0]
        mine = (pages >= lo) & (pages < hi)
        if mine.any():
            seg.scanner.write_pages(pages[mine], diffs[mine])  # type: ignore[attr-defined]
    folded = replace(base, pending=(), written=written)
    swap(folded)
    return folded
