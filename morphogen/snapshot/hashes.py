"""Chunk hashes and their root: the name of a snapshot's bytes.

The page data (zero-padded to whole pages) is cut into chunks of ``chunk_pages`` pages, the
last one possibly shorter; each chunk is hashed on its own, and the root hashes the page count,
the chunk size and the chunk digests in order. The root is what a snapshot's checksum and its
epoch identity name: any byte changed anywhere changes it, yet a shard checks its own page
range by hashing only the chunks that overlap it, never the whole file.

BLAKE3: it hashes at several GiB/s on one core and spreads a large buffer over several cores
(``max_threads``) with the GIL released, so checking the chunks costs less than reading them
(bench/verify_speed.py measures both). blake2b, the standard library's fastest, runs at under
1 GiB/s on one core and would make every shard start slower than its disk.
"""

from __future__ import annotations

import os

import blake3

from morphogen.constants import PAGE_SIZE

# 64 MiB: few enough hashes for the manifest to stay small (1024 for 64 GiB), large enough for
# BLAKE3 to use every core, small enough that a shard whose range starts or ends mid-chunk
# reads little outside it.
DEFAULT_CHUNK_PAGES = 16384
CHECKSUM_PREFIX = "blake3-chunks:"
DIGEST_HEX = 64
_ROOT_TAG = b"morphogen-chunk-root-v1"


def chunk_count(num_pages: int, chunk_pages: int) -> int:
    return -(-num_pages // chunk_pages)


def chunk_pages_range(index: int, num_pages: int, chunk_pages: int) -> tuple[int, int]:
    """Pages ``[a, b)`` of chunk ``index``."""
    a = index * chunk_pages
    return a, min(num_pages, a + chunk_pages)


def _hash_threads() -> int:
    """Every core this process may run on but one: a verified read hashes one step while its
    reading thread fetches the next, and a hash pool as wide as the machine would take turns
    with that thread rather than run beside it."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


HASH_THREADS = _hash_threads()


def new_hasher(threads: int = HASH_THREADS) -> blake3.blake3:
    """A chunk's hasher: `threads` threads on large updates, the GIL released meanwhile."""
    return blake3.blake3(max_threads=threads)


def root_hex(num_pages: int, chunk_pages: int, digests: list[str] | tuple[str, ...]) -> str:
    """The root over the chunk digests (hex), bound to the page count and chunk size so that
    the same digests can never be read as another cut of the pages."""
    h = blake3.blake3(_ROOT_TAG)
    h.update(int(num_pages).to_bytes(8, "little"))
    h.update(int(chunk_pages).to_bytes(8, "little"))
    for d in digests:
        h.update(bytes.fromhex(d))
    return h.hexdigest()


def checksum_str(root: str) -> str:
    """A manifest's checksum field (and an identity's snapshot name) for a root in hex."""
    return CHECKSUM_PREFIX + root


def is_digest_hex(value: object) -> bool:
    return (
        isinstance(value, str)
        and len(value) == DIGEST_HEX
        and all(c in "0123456789abcdef" for c in value)
    )


class ChunkHasher:
    """Chunk digests of a byte stream fed in pieces of any size (a writer's chunks)."""

    def __init__(self, chunk_pages: int, threads: int = HASH_THREADS) -> None:
        if chunk_pages < 1:
            raise ValueError("chunk_pages must be >= 1")
        self._chunk_bytes = chunk_pages * PAGE_SIZE
        self._threads = threads
        self._hasher = new_hasher(threads)
        self._filled = 0
        self.digests: list[str] = []

    def update(self, data: memoryview) -> None:
        data = data.cast("B") if data.format != "B" else data
        while len(data):
            take = min(len(data), self._chunk_bytes - self._filled)
            self._hasher.update(data[:take])
            self._filled += take
            data = data[take:]
            if self._filled == self._chunk_bytes:
                self._close_chunk()

    def finish(self) -> list[str]:
        """The digests of every chunk, the last (short) one included."""
        if self._filled:
            self._close_chunk()
        return self.digests

    def _close_chunk(self) -> None:
        self.digests.append(self._hasher.hexdigest())
        self._hasher = new_hasher(self._threads)
        self._filled = 0
