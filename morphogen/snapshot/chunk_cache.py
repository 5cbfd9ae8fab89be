"""A node's cache of snapshot chunks fetched from object storage, each verified on the way in.

Layout, under the node's cache directory::

    <root-hex>/manifest.json        the snapshot's manifest (its chunk hashes name every byte)
    <root-hex>/chunk-000012         one chunk of page data, present only once it hashed right
    <root-hex>.lock                 held while anyone on this node downloads into <root-hex>
    <root-hex>/.in-use              shared-locked by every process serving from <root-hex>

Keyed by the root of the chunk hashes, so two snapshots never share a directory and a
directory's content can only be what its name says. A chunk is fetched with parallel ranged
GETs, hashed, written to a temporary name, fsynced and renamed: a download killed at any
point leaves whole verified chunks and stray temporaries, and the next one resumes with the
chunks that are there. Replicas on one node take the download lock in turn, so each chunk is
downloaded once per node whatever the number of replicas. A snapshot no process on the node
holds (`.in-use` free) is removed when another one is opened.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import blake3
from filelock import FileLock, Timeout

from morphogen.constants import PAGE_SIZE
from morphogen.snapshot.hashes import chunk_pages_range
from morphogen.snapshot.manifest import Manifest, SnapshotError
from morphogen.storage.durable import write_atomic

log = logging.getLogger(__name__)

PART_BYTES = 8 << 20  # one ranged GET; a chunk's parts are fetched in parallel
FETCH_THREADS = 8


def node_name() -> str:
    return socket.gethostname()


def chunk_file(root_dir: Path, index: int) -> Path:
    return root_dir / f"chunk-{index:06d}"


_observers: list[Callable[[int, int], None]] = []


def observe_fetches(fn: Callable[[int, int], None]) -> None:
    """Call `fn(bytes_just_fetched, bytes_left)` after every chunk this process fetches (the
    replica's metrics)."""
    _observers.append(fn)


class ChunkFetchError(SnapshotError):
    """A chunk could not be fetched or did not hash as the manifest says."""


class ChunkCache:
    """Chunks of snapshots under one node-local directory."""

    def __init__(self, directory: str | os.PathLike[str],
                 on_progress: Callable[[int, int], None] | None = None) -> None:
        self.dir = Path(directory).expanduser()
        self.on_progress = on_progress  # (bytes fetched so far, bytes to fetch)
        self.fetched_bytes = 0  # by this object: what a test or a benchmark counts

    def root_dir(self, manifest: Manifest) -> Path:
        return self.dir / manifest.root

    def ensure(self, manifest: Manifest, uri: str, read_range: Callable[[int, int], bytes],
               chunks: Sequence[int],
               sink: Callable[[int, bytearray], None] | None = None) -> Path:
        """Every chunk in `chunks` present and verified in this node's cache; returns the
        snapshot's cache directory. `read_range(start, end)` reads bytes of the data object.
        `sink(index, data)` receives each chunk this call fetched, once verified (the caller
        then need not read it back and hash it again)."""
        root_dir = self.root_dir(manifest)
        root_dir.mkdir(parents=True, exist_ok=True)
        missing = [c for c in chunks if not chunk_file(root_dir, c).is_file()]
        if not missing:
            return root_dir
        with FileLock(str(root_dir) + ".lock"):
            for stale in root_dir.glob(".chunk-*.tmp-*"):  # a download killed mid-chunk
                stale.unlink(missing_ok=True)
            missing = [c for c in chunks if not chunk_file(root_dir, c).is_file()]
            total = sum(self._chunk_bytes(manifest, c) for c in missing)
            log.info("%s: fetching %d chunk(s), %.1f MiB of %s into %s", node_name(),
                     len(missing), total / 2**20, uri, root_dir)
            done = 0
            # every part of a window of chunks is in flight at once (the raw GET rate needs
            # FETCH_THREADS requests outstanding, whatever the chunk size), and a chunk is
            # hashed and written while the parts of the next ones download
            per_chunk = max(1, manifest.chunk_pages * PAGE_SIZE // PART_BYTES)
            window = max(2, -(-FETCH_THREADS // per_chunk) + 1)
            with ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="chunk-fetch") as pool:
                pending: list[tuple[int, list]] = []
                todo = list(missing)
                while todo or pending:
                    while todo and len(pending) < window:
                        c = todo.pop(0)
                        pending.append((c, self._start(manifest, read_range, c, pool)))
                    c, parts = pending.pop(0)
                    data = self._finish(manifest, uri, root_dir, c, parts)
                    if sink is not None:
                        sink(c, data)
                    size = self._chunk_bytes(manifest, c)
                    done += size
                    if self.on_progress is not None:
                        self.on_progress(done, total)
                    for fn in _observers:
                        fn(size, total - done)
                    if 10 * done // total != 10 * (done - size) // total or done == total:
                        log.info("%s: %s: %.0f%% of %.1f MiB fetched and verified", node_name(),
                                 uri, 100 * done / total, total / 2**20)
            manifest_path = root_dir / "manifest.json"
            if not manifest_path.is_file():
                write_atomic(manifest_path, manifest.to_json().encode())
        return root_dir

    @staticmethod
    def _chunk_bytes(manifest: Manifest, index: int) -> int:
        a, b = chunk_pages_range(index, manifest.num_pages, manifest.chunk_pages)
        return (b - a) * PAGE_SIZE

    @staticmethod
    def _span(manifest: Manifest, index: int) -> tuple[int, int, int, int]:
        a, b = chunk_pages_range(index, manifest.num_pages, manifest.chunk_pages)
        return a, b, a * PAGE_SIZE, min(b * PAGE_SIZE, manifest.data_bytes)

    def _start(self, manifest: Manifest, read_range: Callable[[int, int], bytes], index: int,
               pool: ThreadPoolExecutor) -> list[Future]:
        _, _, start, end = self._span(manifest, index)
        return [pool.submit(read_range, s, min(end, s + PART_BYTES))
                for s in range(start, end, PART_BYTES)]

    def _finish(self, manifest: Manifest, uri: str, root_dir: Path, index: int,
                parts: list[Future]) -> bytearray:
        a, b, start, end = self._span(manifest, index)
        where = f"node {node_name()}: {uri} chunk {index} (pages [{a}, {b}))"
        # one buffer the size of the chunk, zero-padded (a ragged last page hashes so), each
        # part copied in once
        data = bytearray((b - a) * PAGE_SIZE)
        at = 0
        try:
            for f in parts:
                got = memoryview(f.result())
                if at + len(got) > end - start:
                    raise ValueError("the object is longer than its manifest says")
                data[at:at + len(got)] = got
                at += len(got)
        except Exception as exc:  # noqa: BLE001 - every store error becomes one named failure
            for f in parts:
                f.cancel()
            raise ChunkFetchError(f"{where}: fetch failed: {exc}") from None
        if at != end - start:
            raise ChunkFetchError(f"{where}: got {at} bytes, expected {end - start} "
                                  "(the object is shorter than its manifest says)")
        assert manifest.chunk_hashes is not None
        if blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest() != \
                manifest.chunk_hashes[index]:
            raise ChunkFetchError(f"{where}: the fetched bytes do not hash as the manifest "
                                  "says (object corrupted or replaced under its manifest); "
                                  "nothing of it is used")
        write_atomic(chunk_file(root_dir, index), data)
        self.fetched_bytes += at
        return data

    # -- which snapshots this node still needs

    @contextlib.contextmanager
    def holding(self, manifest: Manifest):
        """Mark the snapshot in use by this process for the duration (a shared lock)."""
        root_dir = self.root_dir(manifest)
        marker = root_dir / ".in-use"
        while True:
            root_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(marker, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                same = os.fstat(fd).st_ino == os.stat(marker).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # an eviction removed the directory between open and lock: again
        try:
            yield
        finally:
            os.close(fd)

    def evict_unused(self, keep: Sequence[str] = ()) -> list[str]:
        """Remove every cached snapshot no process on this node holds, except `keep`."""
        removed = []
        if not self.dir.is_dir():
            return removed
        for entry in self.dir.iterdir():
            if not entry.is_dir() or entry.name in keep or entry.name.startswith("."):
                continue
            lock = FileLock(str(entry) + ".lock", timeout=0)
            try:
                lock.acquire()  # never while someone downloads into it
            except Timeout:
                continue
            try:
                fd = os.open(entry / ".in-use", os.O_CREAT | os.O_RDWR, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a process on this node serves from it
                else:
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(entry.name)
                finally:
                    os.close(fd)
            finally:
                lock.release()
        if removed:
            log.info("%s: evicted cached snapshot(s) %s", node_name(), ", ".join(removed))
        return removed
