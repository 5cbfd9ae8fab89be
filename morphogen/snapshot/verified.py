"""Page data read through its chunk hashes: into private memory, each chunk checked as it lands.

A shard serves a private copy of its page range rather than the file's mapping. A mapping is
the file: a data file overwritten in place changes the pages under a running scan, and one
renamed into place is what the next replica to start maps, while the identity both report was
computed from the manifest. Reading the range into anonymous memory and hashing that memory
(never the file a second time) makes what was checked and what is scanned the same bytes, for
good. The cost is memory: the range is resident and private to the process, not shared page
cache; a GPU shard keeps the copy on the host too, since its pending updates and folds read
host pages.

Reads go through ``preadv`` into the destination (several GiB/s from the page cache, where
faulting a mapping in page by page runs at a fraction of that), and each read step is hashed on
a worker thread (BLAKE3 drops the GIL) while the next one is read, so checking adds little to
the time the read takes (bench/verify_speed.py). A chunk only partly inside the range is read
whole, its outside part into a scratch buffer, since its hash covers all of it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.snapshot.hashes import chunk_count, chunk_pages_range, new_hasher
from morphogen.snapshot.manifest import SnapshotError
from morphogen.snapshot.progress import Meter

# Bytes per read call. Hashing overlaps every read but the last, whatever the size, so the size
# is the disk's choice: reads of 8 MiB measured ~20% slower than 64 MiB from a cold cache
# (less I/O in flight), and no faster from a warm one.
READ_STEP = 64 << 20


def _pread_into(fd: int, buf: memoryview, offset: int, data_bytes: int) -> None:
    """Fill ``buf`` with the page data at ``offset``: the file's bytes up to ``data_bytes``
    (never past it, whatever the file has grown to), zeros beyond (a ragged last page)."""
    want = max(0, min(len(buf), data_bytes - offset))
    done = 0
    while done < want:
        got = os.preadv(fd, [buf[done:want]], offset + done)
        if got == 0:
            break  # truncated since open: the zeros below fail the chunk's hash
        done += got
    if done < len(buf):
        buf[done:] = bytes(len(buf) - done)


def _flat(rows: np.ndarray) -> memoryview:
    return memoryview(rows.reshape(-1))


def read_chunks(
    fd: int,
    data_path: Path,
    num_pages: int,
    data_bytes: int,
    chunk_pages: int,
    start: int,
    stop: int,
    *,
    out: np.ndarray | None = None,
    expected: Sequence[str] | None = None,
    meter: Meter | None = None,
) -> list[str]:
    """The digests of the chunks overlapping pages ``[start, stop)``, read from ``fd``.

    ``out``, a writable ``(stop - start, PAGE_SIZE)`` uint8 array, receives those pages.
    ``expected`` (every chunk's digest) makes a chunk that hashes otherwise a SnapshotError
    naming the file and the chunk, raised once that chunk is read.
    """
    if not 0 <= start < stop <= num_pages:
        raise ValueError(f"page range [{start}, {stop}) is outside [0, {num_pages})")
    first_chunk = start // chunk_pages
    last_chunk = (stop - 1) // chunk_pages
    assert last_chunk < chunk_count(num_pages, chunk_pages)
    chunk_bytes = chunk_pages * PAGE_SIZE
    scratch: list[memoryview | None] = [None, None]
    digests: list[str] = []

    def check(c: int, updates: list[Future[None]], hashed: Future[str]) -> None:
        for u in updates:
            u.result()  # re-raises a failed update rather than comparing a partial hash
        digest = hashed.result()
        digests.append(digest)
        if expected is not None and digest != expected[c]:
            a, b = chunk_pages_range(c, num_pages, chunk_pages)
            raise SnapshotError(
                f"{data_path}: checksum mismatch in chunk {c} (pages {a}..{b - 1}): its bytes "
                f"hash to {digest[:16]}..., the manifest says {expected[c][:16]}... (the data "
                "file was modified or replaced after its manifest was written)"
            )

    with ThreadPoolExecutor(1, thread_name_prefix="chunk-hash") as pool:
        # One worker, so its queue keeps the order: a chunk's pieces are hashed as they land
        # and only the last read step of the range is not overlapped with hashing.
        pending: tuple[int, list[Future[None]], Future[str]] | None = None
        for c in range(first_chunk, last_chunk + 1):
            a, b = chunk_pages_range(c, num_pages, chunk_pages)
            # two scratch buffers in turn: the previous chunk's may still be hashing
            if scratch[c % 2] is None and (out is None or a < start or b > stop):
                scratch[c % 2] = memoryview(np.empty(chunk_bytes, np.uint8))
            spare = scratch[c % 2]
            used = 0
            hasher = new_hasher()
            updates = []
            for lo, hi, inside in ((a, max(a, start), False), (max(a, start), min(b, stop), True),
                                   (min(b, stop), b, False)):
                if lo >= hi:
                    continue
                if inside and out is not None:
                    piece = _flat(out[lo - start : hi - start])
                else:
                    assert spare is not None
                    piece = spare[used : used + (hi - lo) * PAGE_SIZE]
                    used += len(piece)
                for off in range(0, len(piece), READ_STEP):
                    step = piece[off : off + READ_STEP]
                    _pread_into(fd, step, lo * PAGE_SIZE + off, data_bytes)
                    updates.append(pool.submit(hasher.update, step))
            if pending is not None:
                check(*pending)
            pending = (c, updates, pool.submit(hasher.hexdigest))
            if meter is not None:
                meter.advance((b - a) * PAGE_SIZE)
        assert pending is not None
        check(*pending)
    if meter is not None:
        meter.finish()
    return digests
