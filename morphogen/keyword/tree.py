"""The hash tree over a keyword table's data pages: one signed root names every page of a version.

Level 0 is the data pages themselves. A page of level k + 1 holds the 32-byte BLAKE3 hashes of
128 consecutive pages of level k, back to back (entries past the level's end are zero); the
levels end with the first of one page, and the root is that page's hash. Leaf and node hashes
are domain-separated, so no page can stand in for a page of another level.

Each level is a table of the same party (`Geometry.tables`), so the page of a level on a key's
path is read privately with the scan of that level only: 1/128 of the level below. A lookup
checks its candidate pages by hashing up their paths to the root the owner signed once for the
version, so a page of another version, another index or another table fails like a flipped
bit, and a client checks one signature per version instead of one per page.
"""

from __future__ import annotations

from collections.abc import Iterable

import blake3
import numpy as np

from morphogen.constants import PAGE_SIZE

HASH_SIZE = 32
FANOUT = PAGE_SIZE // HASH_SIZE  # 128 children a node
LEAF_DOMAIN = b"morphogen-keyword-leaf-v2\0"
NODE_DOMAIN = b"morphogen-keyword-node-v2\0"
SCHEME = "blake3-tree-128(leaf|node domains)"


def level_sizes(data_pages: int) -> list[int]:
    """Pages of each level above the data, lowest first; the last has one page."""
    if data_pages < 1:
        raise ValueError("a table has at least one data page")
    sizes = []
    n = data_pages
    while True:
        n = -(-n // FANOUT)
        sizes.append(n)
        if n == 1:
            return sizes


def leaf_hash(page: bytes | memoryview | np.ndarray) -> bytes:
    h = blake3.blake3(LEAF_DOMAIN)
    h.update(page)
    return h.digest()


def node_hash(page: bytes | memoryview | np.ndarray) -> bytes:
    h = blake3.blake3(NODE_DOMAIN)
    h.update(page)
    return h.digest()


def _hashes(pages: np.ndarray, leaf: bool) -> np.ndarray:
    """Every page's hash: one hasher a page, made from the domain and the page together (half
    the cost of copying one that hashed the domain already and updating it: 2.4 against 5.1 us
    a page, bench/tree_hash.py), in the calling thread. BLAKE3 holds the interpreter's lock
    for an input this small, so threads only queue for it: two ran at 0.7x of one."""
    out = np.empty((len(pages), HASH_SIZE), np.uint8)
    if not len(pages):
        return out
    domain = LEAF_DOMAIN if leaf else NODE_DOMAIN
    rows = memoryview(np.ascontiguousarray(pages, np.uint8)).cast("B")
    size = pages.shape[1]
    new = blake3.blake3
    digests = b"".join([new(domain + rows[a:a + size]).digest()
                        for a in range(0, len(pages) * size, size)])
    out[:] = np.frombuffer(digests, np.uint8).reshape(-1, HASH_SIZE)
    return out


def build(data: np.ndarray) -> list[np.ndarray]:
    """Every level's pages over the data pages `data`, lowest first."""
    levels = []
    below, leaf = data, True
    for size in level_sizes(len(data)):
        level = np.zeros((size, PAGE_SIZE), np.uint8)
        hashes = _hashes(below, leaf)
        level.reshape(-1)[:hashes.size] = hashes.reshape(-1)
        levels.append(level)
        below, leaf = level, False
    return levels


def root_of(top: np.ndarray | bytes) -> str:
    """The root: the hash of the one page of the top level, in hex."""
    return node_hash(top).hex()


def paths(changed: Iterable[int], levels: int) -> list[np.ndarray]:
    """The pages of each of the `levels` levels above the data that the paths of the data pages
    `changed` pass through (each sorted, unique), lowest first: what a change of those pages
    rewrites in the tree."""
    out, below = [], np.unique(np.fromiter(changed, np.int64))
    for _ in range(levels):
        below = np.unique(below // FANOUT)
        out.append(below)
    return out


def rehash(levels: list[np.ndarray], data: np.ndarray, changed: Iterable[int]
           ) -> list[set[int]]:
    """Rewrite the paths of the changed data pages in `levels` (in place); returns the pages
    written at each level, lowest first."""
    below, pages, leaf = data, np.unique(np.fromiter(changed, np.int64)), True
    written = paths(pages, len(levels))
    for level, parents in zip(levels, written, strict=True):
        if len(pages):
            level.reshape(-1, HASH_SIZE)[pages] = _hashes(below[pages], leaf)
        below, pages, leaf = level, parents, False
    return [set(w.tolist()) for w in written]


def entry(page: bytes | memoryview, index: int) -> bytes:
    """The hash a level page holds for its child `index` (0..127 within the page)."""
    at = (index % FANOUT) * HASH_SIZE
    return bytes(page[at:at + HASH_SIZE])
