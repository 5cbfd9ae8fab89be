"""One epoch's data on one shard: a `Version` (snapshot range, segments, pending updates) and
how its answers and pages are computed from them.

The answer of a version for a key is

    scan(pages of its segments) XOR  sum over pending updates u of (u.diff AND tile(mask(u.page)))

so a version built with more pending updates answers for them at once, and a fold that writes
them into private page copies (new segments, no pending updates) changes no answer's bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.engine.base import ShardScanner
from morphogen.party.pending import Pending
from morphogen.party.tables import Loader, SubScanners, TableSlice
from morphogen.protocol.identity import EpochIdentity
from morphogen.protocol.packed import AnyBatch, masks_at
from morphogen.snapshot.reader import Snapshot

# Bytes of the (keys x updates x page) temporary when pending updates are applied to a scan.
_PENDING_STEP_BYTES = 8 << 20


class Lease:
    """Scans in flight on one segment, and whether a newer version retired it."""

    __slots__ = ("scans", "retired", "closed")

    def __init__(self) -> None:
        self.scans = 0
        self.retired = False
        self.closed = False


@dataclass(frozen=True, eq=False)
class Segment:
    """A run of a version's pages and the engine's scanner over them (shared by the versions
    that keep it); `lease` counts the scans holding it."""

    first_page: int
    pages: np.ndarray  # (n, 4096) uint8: a view of the snapshot or a private chunk copy
    scanner: ShardScanner
    lease: Lease = field(default_factory=Lease, repr=False)
    subs: SubScanners = field(default_factory=SubScanners, repr=False)  # parts of tables


@dataclass(frozen=True)
class Version:
    """Everything one epoch's answers are computed from. Never mutated once built."""

    identity: EpochIdentity
    snapshot: Snapshot
    first_page: int
    stop_page: int
    segments: tuple[Segment, ...]
    pending: Pending = field(default_factory=Pending)
    folded: frozenset[int] = field(default_factory=frozenset)  # chunks a fold has written
    # a staged rotation's (pages, diffs) against the device copy it shares: written at commit
    device_diffs: tuple[np.ndarray, np.ndarray] | None = field(default=None, hash=False,
                                                               compare=False)

    @property
    def epoch_id(self) -> int:
        return self.identity.epoch_id

    def page(self, page: int) -> np.ndarray:
        """The page's bytes in this epoch (pending updates applied)."""
        return page_with(self, self.pending, page)

    def stored_page(self, page: int) -> np.ndarray:
        """The page's bytes in this version's segments (pending updates not applied)."""
        for seg in self.segments:
            if seg.first_page <= page < seg.first_page + seg.pages.shape[0]:
                return np.asarray(seg.pages[page - seg.first_page])
        raise IndexError(page)

    @cached_property
    def _pending_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(pages (U,), diffs (U, 256, 16)) of the pending updates: views of their arrays."""
        pending = self.pending
        return pending.pages, pending.diffs.reshape(len(pending), PAGE_SIZE // 16, 16)

    def scan(self, batch: AnyBatch) -> np.ndarray:
        return self.scan_timed(batch)[0]

    def scan_timed(self, batch: AnyBatch) -> tuple[np.ndarray, dict[str, float]]:
        """The answers and seconds by phase: `h2d`, `kernel`, `d2h` from an engine that
        times its device phases, `scan` for the rest, `pending` for the pending updates."""
        acc = np.zeros((len(batch), PAGE_SIZE), np.uint8)
        phases: dict[str, float] = {}
        for seg in self.segments:
            acc ^= _scan_one(seg.scanner, batch, phases)
        pages, diffs = self._pending_arrays
        _apply_pending(acc, batch, pages, diffs, phases)
        return acc, phases

    def scan_table_timed(
        self, batch: AnyBatch, part: TableSlice, load: Loader
    ) -> tuple[np.ndarray, dict[str, float]]:
        """`scan_timed` of this version's pages inside a table only, the keys evaluated at
        `page - table.first_page` (`load` builds a segment's scanner of them, on first use)."""
        table = part.table
        lo, hi = part.pages
        acc = np.zeros((len(batch), PAGE_SIZE), np.uint8)
        phases: dict[str, float] = {}
        for seg in self.segments:
            if table.first_page == 0 and seg.first_page + seg.pages.shape[0] <= table.stop_page:
                # a table from the matrix's first page numbers its pages as the matrix does:
                # a segment wholly inside it is scanned by its own scanner (the device's, on
                # a GPU shard), not by a second one over the same pages
                scanner = seg.scanner
            else:
                scanner = seg.subs.get(table, seg.first_page, seg.pages, seg.scanner, load)
            if scanner is not None:
                acc ^= _scan_one(scanner, batch, phases)
        pages, diffs = self._pending_arrays
        mine = (pages >= lo) & (pages < hi)
        _apply_pending(acc, batch, pages[mine] - table.first_page, diffs[mine], phases)
        return acc, phases


def _scan_one(scanner: ShardScanner, batch: AnyBatch, phases: dict[str, float]) -> np.ndarray:
    timed = getattr(scanner, "scan_timed", None)
    if timed is not None:
        part, t = timed(batch)
        for name in ("h2d", "kernel", "d2h"):
            phases[name] = phases.get(name, 0.0) + getattr(t, f"{name}_ms") / 1000
        return part
    start = time.perf_counter()
    part = scanner.scan(batch)
    phases["scan"] = phases.get("scan", 0.0) + time.perf_counter() - start
    return part


def _apply_pending(acc: np.ndarray, batch: AnyBatch, pages: np.ndarray, diffs: np.ndarray,
                   phases: dict[str, float]) -> None:
    """XOR into `acc` the pending updates' diffs at DPF indices `pages`."""
    if not len(pages):
        return
    start = time.perf_counter()
    # the same work for every key whatever its target: all pending pages, every key
    # (K, U, 16): a packed key's bit as ff*16 or 00*16, the same XOR as its scan's
    masks = masks_at(batch, pages)
    k = len(batch)
    step = max(1, _PENDING_STEP_BYTES // (k * PAGE_SIZE))
    for j0 in range(0, len(pages), step):
        j1 = min(len(pages), j0 + step)
        part = diffs[None, j0:j1] & masks[:, j0:j1, None, :]  # (K, u, 256, 16)
        acc ^= np.bitwise_xor.reduce(part, axis=1).reshape(k, PAGE_SIZE)
    phases["pending"] = time.perf_counter() - start


def page_with(base: Version, pending: Pending, page: int) -> np.ndarray:
    """The page's stored bytes in `base` with `pending` applied (a version being built)."""
    return base.stored_page(page) ^ pending.diff_of(page)
