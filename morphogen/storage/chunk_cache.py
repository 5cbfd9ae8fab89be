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
import secrets
import shutil
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3
from filelock import FileLock, Timeout

from morphogen.constants import PAGE_SIZE
from morphogen.snapshot.hashes import chunk_pages_range
from morphogen.snapshot.manifest import Manifest, SnapshotError

log = logging.getLogger(__name__)

PART_BYTES = 8 << 20  # one ranged GET; a chunk's parts are fetched in parallel
FETCH_THREADS = 8


def node_name() -> str:
    return socket.gethostname()


def chunk_file(root_dir: Path, index: int) -> Path:
    return root_dir / f"chunk-{index:06d}"


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
               chunks: Sequence[int]) -> Path:
        """Every chunk in `chunks` present and verified in this node's cache; returns the
        snapshot's cache directory. `read_range(start, end)` reads bytes of the data object."""
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
            with ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="chunk-fetch") as pool:
                for c in missing:
                    self._fetch(manifest, uri, read_range, root_dir, c, pool)
                    done += self._chunk_bytes(manifest, c)
                    if self.on_progress is not None:
                        self.on_progress(done, total)
            manifest_path = root_dir / "manifest.json"
            if not manifest_path.is_file():
                _write_atomic(manifest_path, manifest.to_json().encode())
        return root_dir

    @staticmethod
    def _chunk_bytes(manifest: Manifest, index: int) -> int:
        a, b = chunk_pages_range(index, manifest.num_pages, manifest.chunk_pages)
        return (b - a) * PAGE_SIZE

    def _fetch(self, manifest: Manifest, uri: str, read_range: Callable[[int, int], bytes],
               root_dir: Path, index: int, pool: ThreadPoolExecutor) -> None:
        a, b = chunk_pages_range(index, manifest.num_pages, manifest.chunk_pages)
        start, end = a * PAGE_SIZE, min(b * PAGE_SIZE, manifest.data_bytes)
        where = f"node {node_name()}: {uri} chunk {index} (pages [{a}, {b}))"
        parts = [(s, min(end, s + PART_BYTES)) for s in range(start, end, PART_BYTES)]
        try:
            data = b"".join(pool.map(lambda r: bytes(read_range(*r)), parts))
        except Exception as exc:  # noqa: BLE001 - every store error becomes one named failure
            raise ChunkFetchError(f"{where}: fetch failed: {exc}") from None
        if len(data) != end - start:
            raise ChunkFetchError(f"{where}: got {len(data)} bytes, expected {end - start} "
                                  "(the object is shorter than its manifest says)")
        data += bytes((b - a) * PAGE_SIZE - len(data))  # a ragged last page hashes zero-padded
        assert manifest.chunk_hashes is not None
        if blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest() != \
                manifest.chunk_hashes[index]:
            raise ChunkFetchError(f"{where}: the fetched bytes do not hash as the manifest "
                                  "says (object corrupted or replaced under its manifest); "
                                  "nothing of it is used")
        _write_atomic(chunk_file(root_dir, index), data)
        self.fetched_bytes += len(data)

    # -- which snapshots this node still needs

    @contextlib.contextmanager
    def holding(self, manifest: Manifest):
        """Mark the snapshot in use by this process for the duration (a shared lock)."""
        root_dir = self.root_dir(manifest)
        root_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(root_dir / ".in-use", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
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


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
