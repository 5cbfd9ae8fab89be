"""Named tables on the party's side (morphogen.snapshot.tables): which shards a query of a
table reaches, what each of them is asked to scan, and the scanners over a segment's part of a
table.

A query of a table costs the scan of that range only: the router calls just the shards whose
pages overlap it, and each scans only its overlap, evaluating the keys at
`page - table.first_page`. The router plans with the layout it cached; the shard checks that
plan against the version it scans (the table's range and its own), so a rotation between the
two is a retry, never an answer missing the partial of a shard the plan left out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from morphogen.engine.base import Engine, ShardScanner
from morphogen.protocol.packed import AnyBatch, batch_format
from morphogen.snapshot.manifest import Manifest
from morphogen.snapshot.tables import Table

# (the segment's scanner, its pages of the table, their first global page, the first one's
# index in the table) -> a scanner of those pages, numbered from that index
Loader = Callable[[ShardScanner, np.ndarray, int, int], ShardScanner]


@dataclass(frozen=True)
class TableKeys:
    """One request's validated keys and the table they are of (None: the whole matrix), as
    the router's coalescer holds them."""

    keys: AnyBatch
    table: Table | None

    def __len__(self) -> int:
        return len(self.keys)

    def group(self) -> Hashable:
        """What requests sharing one scan must agree on: the page range, the key domain and
        the key format (a batch never mixes formats)."""
        return self.table, self.keys.domain_bits, batch_format(self.keys)


class TableMoved(RuntimeError):
    """The version a shard scans does not hold the table, or the shard range, the router
    planned with: a rotation came between (retried once the router re-reads the layout)."""


@dataclass(frozen=True)
class TableSlice:
    """One shard's part of a query of `table`: the shard holds `[first_page, stop_page)` in
    the router's layout."""

    table: Table
    first_page: int
    stop_page: int

    @property
    def pages(self) -> tuple[int, int]:
        """The global pages this shard scans: its range inside the table."""
        got = self.table.overlap(self.first_page, self.stop_page)
        if got is None:
            raise ValueError(f"shard [{self.first_page}, {self.stop_page}) is outside "
                             f"table {self.table.name!r}")
        return got

    def check(self, manifest: Manifest, first_page: int, stop_page: int) -> None:
        """Raise TableMoved unless a version of this snapshot range is what was planned."""
        if (first_page, stop_page) != (self.first_page, self.stop_page):
            raise TableMoved(f"shard range is [{first_page}, {stop_page}), planned "
                             f"[{self.first_page}, {self.stop_page})")
        if manifest.table(self.table.name) != self.table:
            raise TableMoved(f"table {self.table.name!r} is not {self.table} in this epoch")


def shard_slices(table: Table, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, TableSlice]]:
    """`(shard index, slice)` of every shard (ranges in shard order) overlapping `table`."""
    return [(i, TableSlice(table, lo, hi)) for i, (lo, hi) in enumerate(ranges)
            if table.overlap(lo, hi) is not None]


class TableLoader:
    """Builds the scanner of a table's pages in a segment (`first_index`: the first one's
    index in the table).

    The CPU engines take a row slice of the segment's pages (a view, no copy). A GPU shard
    scans the table on its device copy, in place (GpuShard.table_scanner: any offset, no
    copy); it never builds a host engine for a table, so a segment whose scanner cannot scan
    a range of itself on the device is an error, not a slow path."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __call__(self, scanner: ShardScanner, pages: np.ndarray, first_page: int,
                 first_index: int) -> ShardScanner:
        if self._engine.name != "gpu":
            return self._engine.load(pages, first_page=first_index)
        table_scanner = getattr(scanner, "table_scanner", None)
        if table_scanner is None:
            raise TypeError(f"{type(scanner).__name__} cannot scan a table on the device")
        return table_scanner(first_page, pages.shape[0], first_index)


class SubScanners:
    """The scanners over one segment's parts of tables, built on first use and kept as long
    as the segment: page updates keep segments (their diffs are applied beside the scan), a
    fold or a rotation replaces them and closes these with them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_range: dict[tuple[int, int], ShardScanner] = {}
        self._closed = False

    def get(self, table: Table, seg_first: int, pages: np.ndarray, seg_scanner: ShardScanner,
            load: Loader) -> ShardScanner | None:
        """The scanner of `table`'s pages among the segment's (`pages`, starting at global
        page `seg_first`, scanned whole by `seg_scanner`), numbered from the table's first
        page; None where they miss it."""
        span = table.overlap(seg_first, seg_first + pages.shape[0])
        if span is None:
            return None
        key = (table.first_page, table.stop_page)
        with self._lock:
            if self._closed:
                raise RuntimeError("the segment is closed")
            scanner = self._by_range.get(key)
            if scanner is None:
                lo, hi = span
                # a row slice: a view of the segment's pages, no copy on the CPU engines
                scanner = load(seg_scanner, pages[lo - seg_first : hi - seg_first], lo,
                               lo - table.first_page)
                self._by_range[key] = scanner
            return scanner

    def close(self) -> None:
        with self._lock:
            self._closed = True
            scanners, self._by_range = list(self._by_range.values()), {}
        for s in scanners:
            s.close()
