"""A version's pending page updates: one array of page numbers and one of XOR diffs.

A block's publication brings thousands of page diffs to every shard. Held as one object and one
4 KiB `bytes` a page, they cost a Python loop and a copy a page three times over (taking the
batch apart, joining the diffs again for the scans, joining them for the fold); held as the
batch's own rows, a shard takes a publication with a few array operations, whatever its size,
and the scans and the fold read those rows where they are.

The arrays are never written once a `Pending` holds them: the version that takes more updates
gets new arrays (`then`), so a version a scan still reads keeps its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.protocol.changes import PageUpdate


class Pending:
    """Pending updates in the order they apply: `pages` (U,) int64, `diffs` (U, 4096) uint8."""

    __slots__ = ("pages", "diffs")

    def __init__(self, pages: np.ndarray | None = None, diffs: np.ndarray | None = None) -> None:
        if pages is None or diffs is None:
            pages = np.zeros(0, np.int64)
            diffs = np.zeros((0, PAGE_SIZE), np.uint8)
        pages = np.ascontiguousarray(pages, np.int64)
        diffs = np.ascontiguousarray(diffs, np.uint8)
        if pages.ndim != 1 or diffs.shape != (len(pages), PAGE_SIZE):
            raise ValueError("pending updates are (U,) pages and (U, 4096) diffs")
        pages.flags.writeable = False
        diffs.flags.writeable = False
        self.pages, self.diffs = pages, diffs

    def __len__(self) -> int:
        return len(self.pages)

    def __bool__(self) -> bool:
        return len(self.pages) > 0

    def __iter__(self) -> Iterator[PageUpdate]:
        """Each update as an object, in order (the paths that take them one at a time)."""
        for page, diff in zip(self.pages.tolist(), self.diffs, strict=True):
            yield PageUpdate(page, diff.tobytes())

    def then(self, pages: np.ndarray, diffs: np.ndarray) -> Pending:
        """These updates followed by `pages` / `diffs` (taken as they are when none is held
        yet: one copy of a publication's rows, the one the batch was unpacked into)."""
        if not len(self):
            return Pending(pages, diffs)
        if not len(pages):
            return self
        return Pending(np.concatenate([self.pages, pages]),
                       np.concatenate([self.diffs, diffs]))

    def diff_of(self, page: int) -> np.ndarray:
        """The XOR of every pending diff of `page` (zeros where it has none)."""
        out = np.zeros(PAGE_SIZE, np.uint8)
        for i in np.flatnonzero(self.pages == page).tolist():
            out ^= self.diffs[i]
        return out

    def merged(self) -> tuple[np.ndarray, np.ndarray]:
        """(the distinct pages, sorted; each one's diffs XORed into one): what a write of
        these updates into the pages changes."""
        pages, inverse = np.unique(self.pages, return_inverse=True)
        if len(pages) == len(self.pages):
            out = np.empty_like(self.diffs)
            out[inverse] = self.diffs
            return pages, out
        out = np.zeros((len(pages), PAGE_SIZE), np.uint8)
        np.bitwise_xor.at(out, inverse, self.diffs)
        return pages, out
