"""The pages a block will write, made writable in the owner's mapped file before the block is
applied: while the follower waits on the node for the block's values.

An owner's working pages are a shared mapping of a file on disk (`working`). Writing a page
the kernel has written back since it was last written takes a page fault (the file system
is told the page is dirty again), and reading a page not yet mapped in this process takes
another: about 4 us each on an ext4 disk (bench/page_faults.py). A block of 3,000 records
scattered over a mainnet-sized table writes some 3,000 data pages and nearly as many tree
pages, almost none of them still mapped and dirty from an earlier block, so these faults
grow with the table until every page of a block is one or two: what a block's apply pays
beyond what it changes. Where the table outgrows the page cache, most are reads from disk.

The keys a block changes are known from its trace before their values are read from the
node. `block` does, in a thread, in kernels that do not hold the interpreter's lock:

1. `locate`: each key's tag and three candidate buckets;
2. `read_ahead`: the candidates' pages and the key index's slots where the keys' lookups
   start asked of the kernel at once (MADV_WILLNEED), so that a cold cache's reads are
   queued together instead of taken one fault at a time;
3. the key index's slots read (`KeyIndex.touch`): each change first asks whether the table
   holds its key, and most of a block's keys are held, their slots only read;
4. `plan`: a held key's page is the candidate that holds its tag; a new key's, the first
   candidate with a free slot; above each, the tree pages on its path, and each changed
   table's descriptor;
5. `populate`: those pages read ahead, then faulted in writable (MADV_POPULATE_WRITE, Linux
   5.14 and later; elsewhere nothing), a run of pages a call. That costs more a page than
   the faults it saves (some 22 us against 4 + 4, bench/page_faults.py), but not on the
   apply's path.

An apply that starts before it has ended stops it between two calls and takes the rest of
the faults itself, so a node that answers fast is never waited for longer than one call. A
page that turns out not to be written (the key evicted, the slot taken, a deleted key the
table never held) costs only its write-back of the same bytes; no byte of either file is
written here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import numba
import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.keyword import key_index
from morphogen.keyword.descriptor import Part
from morphogen.keyword.hashing import candidates_many, pack_keys
from morphogen.keyword.key_index import KeyIndex
from morphogen.keyword.layout import TAG_SIZE
from morphogen.keyword.pages import tag_of
from morphogen.keyword.tree import paths
from morphogen.storage import advice

log = logging.getLogger(__name__)


class Located(NamedTuple):
    """A block's keys in one table: their tags, (keys, 16), and candidate buckets, (keys, 3)."""

    part: Part
    tags: np.ndarray
    trios: np.ndarray


def locate(parts: list[Part], by_table: Mapping[str, Iterable[bytes]]) -> list[Located]:
    """The keys `by_table` (table name -> keys) located in the tables `parts`; tables the
    matrix does not hold are passed over."""
    out = []
    for part in parts:
        wanted = list(by_table.get(part.name, ()))
        if not wanted:
            continue
        d = part.descriptor
        tags = np.frombuffer(b"".join(tag_of(d.dataset, k) for k in wanted),
                             np.uint8).reshape(-1, TAG_SIZE)
        out.append(Located(part, tags, candidates_many(*pack_keys(wanted), d.seeds,
                                                       d.geometry.num_buckets)))
    return out


def tags(located: list[Located]) -> np.ndarray:
    """Every located key's tag, in the tables' order: what the key index is asked."""
    if not located:
        return np.zeros((0, TAG_SIZE), np.uint8)
    return np.concatenate([x.tags for x in located])


def read_ahead(pages: np.ndarray, located: list[Located], index: KeyIndex | None = None,
               stop: threading.Event | None = None) -> None:
    """Ask the kernel to read in every page `plan` and the index's lookups will read first:
    the candidates' pages of the mapped matrix `pages`, and the index's home slots."""
    if index is not None:
        index.read_ahead(tags(located))
    which = [x.part.first + x.trios.reshape(-1) // x.part.descriptor.geometry.rows_per_page
             for x in located]
    if which:
        advice.advise(_base(pages), np.unique(np.concatenate(which)), advice.WILLNEED, stop)


def plan(pages: np.ndarray, located: list[Located]) -> np.ndarray:
    """The matrix pages a block changing the located keys will write: each key's data page,
    the tree pages above them and each changed table's descriptor; sorted, unique."""
    out: list[np.ndarray] = []
    for part, tags_, trios in located:
        g, at = part.descriptor.geometry, part.first
        found = np.empty(len(tags_), np.int64)
        _data_pages(pages[at:at + g.data_pages], tags_, trios, g.rows_per_page,
                    g.row_size if g.layout == "row" else 0, g.slot_size, g.slots_per_bucket,
                    found)
        data = np.unique(found[found >= 0])
        tree = [g.level_first(k) + above
                for k, above in enumerate(paths(data, len(g.levels)), 1)]
        out.append(np.concatenate([data, *tree, [g.descriptor_page]]) + at)
    return np.unique(np.concatenate(out)) if out else np.zeros(0, np.int64)


def touch_index(index: KeyIndex, tags_: np.ndarray, stop: threading.Event | None = None,
                chunk: int = 512) -> None:
    """Read the key index's slots that the block's lookups of `tags_` read (`KeyIndex.touch`),
    `chunk` tags a call, until `stop` is set."""
    for first in range(0, len(tags_), chunk):
        if stop is not None and stop.is_set():
            return
        index.touch(tags_[first:first + chunk])


def block(pages: np.ndarray, parts: list[Part], by_table: Mapping[str, Iterable[bytes]],
          index: KeyIndex | None = None, stop: threading.Event | None = None) -> int:
    """The pages and the index's slots of a block changing the keys `by_table`, in memory and
    mapped (the index's read, the pages writable) by the time it ends or `stop` is set.
    Returns how many pages the block will write (`plan`), 0 when stopped before knowing."""
    located = locate(parts, by_table)
    read_ahead(pages, located, index, stop)
    if index is not None:
        touch_index(index, tags(located), stop)
    if stop is not None and stop.is_set():
        return 0
    which = plan(pages, located)
    advice.advise(_base(pages), which, advice.WILLNEED, stop)  # the tree pages, above all
    populate(pages, which, stop)
    return len(which)


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
    """Load (or compile) the kernels now: a follower calls it as it starts."""
    _data_pages(np.zeros((1, PAGE_SIZE), np.uint8), np.zeros((1, TAG_SIZE), np.uint8),
                np.zeros((1, 3), np.int64), 1, 0, 48, 2, np.empty(1, np.int64))
    key_index.warm()
    advice.warm()


def populate(pages: np.ndarray, which: np.ndarray,
             stop: threading.Event | None = None) -> bool:
    """Fault the pages `which` of the mapped array `pages` in, writable, one madvise a run of
    consecutive pages, until `stop` is set (looked at every 16 runs; what is left, the apply
    takes itself). False where the kernel does not offer it (nothing more is done)."""
    if advice.advise(_base(pages), which, advice.POPULATE_WRITE, stop, chunk=16):
        return True
    log.debug("MADV_POPULATE_WRITE refused: no prefetch")
    return False


def _base(pages: np.ndarray) -> int:
    if pages.ndim != 2 or pages.shape[1] != PAGE_SIZE or not pages.flags.c_contiguous:
        raise ValueError("a block's pages are a mapped (pages, 4096) array")
    return pages.ctypes.data
