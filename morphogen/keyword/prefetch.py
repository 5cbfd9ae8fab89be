"""The pages a block will write, made writable in the owner's mapped file before the block is
applied: while the follower waits on the node for the block's values.

An owner's working pages are a shared mapping of a file on disk (`working`). Writing a page
the kernel has written back since it was last written takes a page fault (the file system
is told the page is dirty again), and reading a page not yet mapped in this process takes
another: about 4 us each on an ext4 disk (bench/page_faults.py). A block of 3,000 records
scattered over a mainnet-sized table writes some 3,000 data pages and nearly as many tree
pages, almost none of them still mapped and dirty from an earlier block, so these faults
grow with the table until every page of a block is one or two: what a block's apply pays
beyond what it changes.

The keys a block changes are known from its trace before their values are read from the
node, and for a key the table holds (most of a block's changes), the page it will be written
to is the candidate page that holds its tag; for a new key, the first candidate with a free
slot; above each, the tree pages on its path. `plan` finds them by reading (the read faults
taken here, in a kernel that does not hold the interpreter's lock while the follower's other
thread decodes the node's answers), and `populate` faults them in writable, a run of pages
a call (MADV_POPULATE_WRITE, Linux 5.14 and later; elsewhere it does nothing). That costs
more a page than the faults it saves (some 22 us against 4 + 4, bench/page_faults.py), but
not on the apply's path: an apply that starts before it has ended stops it between two calls
and takes the rest of the faults itself, so a node that answers fast is never waited for
longer than one call. A page that turns out not to be written (the key evicted, the slot
taken, a deleted key the table never held) costs only its write-back of the same bytes; no
byte of the file is written here.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Iterable, Mapping

import numba
import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.keyword.descriptor import Part
from morphogen.keyword.hashing import candidates_many, pack_keys
from morphogen.keyword.layout import TAG_SIZE
from morphogen.keyword.pages import tag_of
from morphogen.keyword.tree import paths

log = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23  # <linux/mman.h>


def plan(pages: np.ndarray, parts: list[Part], by_table: Mapping[str, Iterable[bytes]]
         ) -> np.ndarray:
    """The matrix pages a block changing the keys `by_table` (table name -> keys) will write:
    each key's data page, the tree pages above them and each changed table's descriptor;
    sorted, unique. Tables `pages` does not hold are passed over."""
    out: list[np.ndarray] = []
    for part in parts:
        wanted = list(by_table.get(part.name, ()))
        if not wanted:
            continue
        g, at = part.descriptor.geometry, part.first
        tags = np.frombuffer(b"".join(tag_of(part.descriptor.dataset, k) for k in wanted),
                             np.uint8).reshape(-1, TAG_SIZE)
        trios = candidates_many(*pack_keys(wanted), part.descriptor.seeds, g.num_buckets)
        found = np.empty(len(wanted), np.int64)
        _data_pages(pages[at:at + g.data_pages], tags, trios, g.rows_per_page,
                    g.row_size if g.layout == "row" else 0, g.slot_size, g.slots_per_bucket,
                    found)
        data = np.unique(found[found >= 0])
        tree = [g.level_first(k) + above
                for k, above in enumerate(paths(data, len(g.levels)), 1)]
        out.append(np.concatenate([data, *tree, [g.descriptor_page]]) + at)
    return np.unique(np.concatenate(out)) if out else np.zeros(0, np.int64)


@numba.njit(cache=True, nogil=True)
def _data_pages(data, tags, trios, rows_per_page, row_size, slot_size, slots, out):
    """out[i]: the page of key i's slot (the first of its candidate buckets whose slots hold
    its tag: the slot an edit of a held key writes), else of the first candidate bucket with
    an empty slot (where an insert goes), else -1. Without the interpreter's lock: it runs
    beside the thread reading the block's values."""
    for i in range(len(tags)):
        out[i] = -1
        free = -1
        for c in range(trios.shape[1]):
            b = trios[i, c]
            page = b // rows_per_page
            base = (b % rows_per_page) * row_size
            for s in range(slots):
                o = base + s * slot_size
                same = True
                empty = True
                for t in range(tags.shape[1]):
                    v = data[page, o + t]
                    same = same and v == tags[i, t]
                    empty = empty and v == 0
                if same:
                    out[i] = page
                    break
                if empty and free < 0:
                    free = page
            if out[i] >= 0:
                break
        if out[i] < 0:
            out[i] = free


def warm() -> None:
    """Load (or compile) the kernel now: a follower calls it as it starts."""
    _data_pages(np.zeros((1, PAGE_SIZE), np.uint8), np.zeros((1, TAG_SIZE), np.uint8),
                np.zeros((1, 3), np.int64), 1, 0, 48, 2, np.empty(1, np.int64))


def populate(pages: np.ndarray, which: np.ndarray,
             stop: threading.Event | None = None) -> bool:
    """Fault the pages `which` of the mapped array `pages` in, writable: one call a run of
    consecutive pages, until `stop` is set (what is left, the apply takes itself). False
    where the kernel does not offer it (nothing is done)."""
    if not len(which):
        return True
    if pages.shape[1] != PAGE_SIZE or not pages.flags.c_contiguous:
        raise ValueError("populate takes a mapped (pages, 4096) array")
    madvise = _madvise()
    if madvise is None:
        return False
    base = pages.ctypes.data
    breaks = np.flatnonzero(np.diff(which) != 1) + 1
    for run in np.split(which, breaks):
        if stop is not None and stop.is_set():
            break
        if madvise(base + int(run[0]) * PAGE_SIZE, len(run) * PAGE_SIZE,
                   MADV_POPULATE_WRITE) != 0:
            log.debug("MADV_POPULATE_WRITE refused (errno %d): no prefetch", ctypes.get_errno())
            return False
    return True


_MADVISE: list = []


def _madvise():  # noqa: ANN202 - a ctypes function, or None
    if not _MADVISE:
        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _MADVISE.append(fn)
    return _MADVISE[0]
