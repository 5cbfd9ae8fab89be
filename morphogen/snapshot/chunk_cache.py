"""A node's cache of snapshot chunks fetched from object storage, each verified on the way in.

Layout, under the node's cache directory::

    <root-hex>/manifest.json        the snapshot's manifest (its chunk hashes name every byte)
    <root-hex>/chunk-000012         one chunk of page data, present only once it hashed right
    <root-hex>.lock                 shared-locked while anyone on this node fetches into it
    <root-hex>/.chunk-000012.lock   held by the one process fetching that chunk
    <root-hex>/.in-use              shared-locked by every process serving from <root-hex>

Keyed by the root of the chunk hashes, so two snapshots never share a directory and a
directory's content can only be what its name says. A chunk is fetched with parallel ranged
GETs, hashed, written to a temporary name, fsynced and renamed: a download killed at any
point leaves whole verified chunks and stray temporaries, and the next one resumes with the
chunks that are there. Replicas on one node fetch different chunks at once and wait for the
ones another is fetching, so each chunk is downloaded once per node whatever the number of
replicas. Before a fetch writes anything, the disk must have room for all of it. A snapshot
no process on the node holds (`.in-use` free) is removed when another one is opened.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import blake3
from filelock import FileLock, Timeout

from morphogen.constants import PAGE_SIZE
from morphogen.snapshot.hashes import chunk_pages_range
from morphogen.snapshot.manifest import Manifest, SnapshotError
from morphogen.storage.durable import write_atomic
from morphogen.storage.settings import current as current_settings
from morphogen.storage.store_errors import short_reason

log = logging.getLogger(__name__)

PART_BYTES = 8 << 20  # one ranged GET; a chunk's parts are fetched in parallel


def node_name() -> str:
    return socket.gethostname()


def chunk_file(root_dir: Path, index: int) -> Path:
    return root_dir / f"chunk-{index:06d}"


@dataclass
class FetchProgress:
    """One fetch into a node's cache, as it goes: what an operator is shown."""

    uri: str
    node: str
    path: str  # the snapshot's cache directory on the node
    chunks: int
    total: int  # bytes this fetch brings in
    done: int = 0
    started: float = field(default_factory=time.monotonic)
    last: int = 0  # bytes of the chunk that just landed
    chunk: int = -1  # its index
    fetched: bool = False  # whether this process downloaded it (else another one on the node)

    @property
    def rate(self) -> float:
        """Bytes per second so far."""
        return self.done / max(time.monotonic() - self.started, 1e-6)

    @property
    def seconds_left(self) -> float | None:
        rate = self.rate
        return (self.total - self.done) / rate if rate > 0 and self.done else None

    def line(self) -> str:
        left = self.seconds_left
        return (f"{self.done / 2**20:.1f} of {self.total / 2**20:.1f} MiB of {self.uri} "
                f"({self.chunks} chunk(s)), {self.rate / 2**20:.1f} MiB/s"
                + (f", {left:.0f} s left" if left is not None else ""))


_observers: list[Callable[[FetchProgress], None]] = []


def observe_fetches(fn: Callable[[FetchProgress], None]) -> None:
    """Call `fn(progress)` after every chunk this process fetches (the replica's metrics and
    the start board an operator reads)."""
    _observers.append(fn)


class ChunkFetchError(SnapshotError):
    """A chunk could not be fetched or did not hash as the manifest says."""


class CacheFullError(SnapshotError):
    """The node's cache has no room for the chunks a fetch needs."""


class ChunkCache:
    """Chunks of snapshots under one node-local directory."""

    def __init__(self, directory: str | os.PathLike[str],
                 on_progress: Callable[[int, int], None] | None = None) -> None:
        self.dir = Path(directory).expanduser()
        self.on_progress = on_progress  # (bytes fetched so far, bytes to fetch)
        self.fetched_bytes = 0  # by this object: what a test or a benchmark counts
        self.fetched_chunks: list[int] = []  # likewise

    def root_dir(self, manifest: Manifest) -> Path:
        return self.dir / manifest.root

    # -- which snapshot a URI named when it was last read (a start while the store is down)

    def _uri_file(self, uri: str) -> Path:
        return self.dir / ".uris" / hashlib.sha256(uri.encode()).hexdigest()[:32]

    def remember(self, uri: str, manifest: Manifest) -> None:
        """Note that `uri` named `manifest` (its fingerprint: the root, and its tables when it
        names any), unless already noted."""
        path = self._uri_file(uri)
        name = manifest.fingerprint.encode()
        try:
            if path.read_bytes() == name:
                return
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, name)

    def manifest_for(self, uri: str) -> Manifest | None:
        """The manifest `uri` named when last read here, if its chunks' directory holds it
        (written once a fetch from it completed) and it still hashes to its name."""
        try:
            name = self._uri_file(uri).read_text().strip()
            root = name.split("+", 1)[0]
            raw = (self.dir / root / "manifest.json").read_bytes()
            manifest = Manifest.from_dict(json.loads(raw), where=f"{self.dir / root}")
        except (OSError, ValueError):
            return None
        # the chunks are named by the data root alone, so another snapshot of the same bytes
        # (other tables) may have left its manifest there: only the one the URI named will do
        if manifest.chunk_hashes is None or manifest.fingerprint != name:
            return None
        return manifest

    def ensure(self, manifest: Manifest, uri: str, read_range: Callable[[int, int], bytes],
               chunks: Sequence[int],
               sink: Callable[[int, bytearray], None] | None = None) -> Path:
        """Every chunk in `chunks` present and verified in this node's cache; returns the
        snapshot's cache directory. `read_range(start, end)` reads bytes of the data object.
        `sink(index, data)` receives each chunk this call fetched, once verified (the caller
        then need not read it back and hash it again).

        Each chunk has a lock of its own: replicas of one node that need different ranges
        fetch at once, and one that needs a chunk another is fetching waits for it, then
        reads it from the cache, so every chunk is still downloaded once per node."""
        root_dir = self.root_dir(manifest)
        root_dir.mkdir(parents=True, exist_ok=True)
        missing = [c for c in chunks if not chunk_file(root_dir, c).is_file()]
        if not missing:
            return root_dir
        with _shared_lock(Path(str(root_dir) + ".lock")):  # eviction waits for fetches
            needed = sum(self._chunk_bytes(manifest, c) for c in missing)
            self._check_space(uri, root_dir, len(missing), needed)
            progress = FetchProgress(uri, node_name(), str(root_dir), len(missing), needed)
            log.info("%s: fetching %d chunk(s), %.1f MiB of %s into %s", node_name(),
                     len(missing), progress.total / 2**20, uri, root_dir)
            busy = self._fetch(manifest, uri, root_dir, read_range, missing, sink, progress,
                               wait=False)
            if busy:  # another process on this node fetches these: wait for it, in turn
                self._fetch(manifest, uri, root_dir, read_range, busy, sink, progress,
                            wait=True)
            manifest_path = root_dir / "manifest.json"
            if not manifest_path.is_file():
                write_atomic(manifest_path, manifest.to_json().encode())
        return root_dir

    def _fetch(self, manifest: Manifest, uri: str, root_dir: Path,
               read_range: Callable[[int, int], bytes], chunks: list[int],
               sink: Callable[[int, bytearray], None] | None, progress: FetchProgress, *,
               wait: bool) -> list[int]:
        """Fetch those of `chunks` still missing whose lock this process gets (all of them,
        waiting, with `wait`); returns those another process was fetching."""
        busy: list[int] = []
        threads = current_settings().concurrency
        # every part of a window of chunks is in flight at once (the raw GET rate needs
        # `concurrency` requests outstanding, whatever the chunk size), and a chunk is
        # hashed and written while the parts of the next ones download
        per_chunk = max(1, manifest.chunk_pages * PAGE_SIZE // PART_BYTES)
        # waiting, one chunk at a time: a process blocked on a lock then holds no other, so
        # two of them can never wait on each other (the first pass never blocks)
        window = 1 if wait else max(2, -(-threads // per_chunk) + 1)
        with ExitStack() as held, ThreadPoolExecutor(
                threads, thread_name_prefix="chunk-fetch") as pool:
            pending: list[tuple[int, list[Future], FileLock]] = []
            todo = list(chunks)
            try:
                while todo or pending:
                    while todo and len(pending) < window:
                        c = todo.pop(0)
                        lock = FileLock(str(root_dir / f".chunk-{c:06d}.lock"),
                                        timeout=-1 if wait else 0)
                        try:
                            lock.acquire()
                        except Timeout:
                            busy.append(c)
                            continue
                        if chunk_file(root_dir, c).is_file():  # fetched while we waited
                            lock.release()
                            self._landed(manifest, c, progress, fetched=False)
                            continue
                        for stale in root_dir.glob(f".chunk-{c:06d}.tmp-*"):  # one killed
                            stale.unlink(missing_ok=True)
                        pending.append((c, self._start(manifest, read_range, c, pool), lock))
                    if not pending:
                        continue
                    c, parts, lock = pending.pop(0)
                    try:
                        data = self._finish(manifest, uri, root_dir, c, parts)
                    finally:
                        lock.release()
                    if sink is not None:
                        sink(c, data)
                    self._landed(manifest, c, progress, fetched=True)
            except BaseException:
                for _, parts, lock in pending:
                    for f in parts:
                        f.cancel()
                    held.callback(lock.release)
                raise
        return busy

    def _landed(self, manifest: Manifest, index: int, progress: FetchProgress, *,
                fetched: bool) -> None:
        size = self._chunk_bytes(manifest, index)
        before = progress.done
        progress.done += size
        progress.last = size
        progress.chunk, progress.fetched = index, fetched
        if self.on_progress is not None:
            self.on_progress(progress.done, progress.total)
        for fn in _observers:
            fn(progress)
        total = max(progress.total, 1)
        if 10 * progress.done // total != 10 * before // total:
            log.info("%s: %s", progress.node, progress.line())

    @staticmethod
    def _check_space(uri: str, root_dir: Path, chunks: int, needed: int) -> None:
        """Refuse a fetch the disk cannot hold, before any byte of it is written."""
        free = shutil.disk_usage(root_dir).free
        if free < needed:
            raise CacheFullError(
                f"node {node_name()}: {uri}: {chunks} chunk(s) need {_size(needed)} in "
                f"{root_dir}, which has {_size(free)} free: free space there or set "
                "snapshot_cache_dir to a larger disk")

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
            raise ChunkFetchError(f"{where}: fetch failed: {short_reason(exc)}") from None
        if at != end - start:
            raise ChunkFetchError(f"{where}: got {at} bytes, expected {end - start} "
                                  "(the object is shorter than its manifest says)")
        assert manifest.chunk_hashes is not None
        if blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest() != \
                manifest.chunk_hashes[index]:
            raise ChunkFetchError(f"{where}: the fetched bytes do not hash as the manifest "
                                  "says (object corrupted or replaced under its manifest); "
                                  "nothing of it is used")
        try:
            write_atomic(chunk_file(root_dir, index), data)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            free = shutil.disk_usage(root_dir).free
            raise CacheFullError(  # the temporary is gone (write_atomic removes it)
                f"{where}: no space left writing {chunk_file(root_dir, index)}: "
                f"{_size(free)} free, {_size(len(data))} needed: free space there or set "
                "snapshot_cache_dir to a larger disk") from None
        self.fetched_bytes += at
        self.fetched_chunks.append(index)
        return data

    # -- which snapshots this node still needs

    @contextlib.contextmanager
    def holding(self, manifest: Manifest):
        """Mark the snapshot in use by this process for the duration (a shared lock)."""
        root_dir = self.root_dir(manifest)
        marker = root_dir / ".in-use"
        while True:
            root_dir.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(marker, os.O_CREAT | os.O_RDWR, 0o644)
            except FileNotFoundError:
                continue  # an eviction removed the directory between mkdir and open: again
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
            lock_fd = _try_exclusive(Path(str(entry) + ".lock"))
            if lock_fd is None:
                continue  # never while someone fetches into it
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
                os.close(lock_fd)
        if removed:
            log.info("%s: evicted cached snapshot(s) %s", node_name(), ", ".join(removed))
        return removed


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


@contextlib.contextmanager
def _shared_lock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def _try_exclusive(path: Path) -> int | None:
    """An exclusive lock on `path` if nobody holds it (the fd to close), else None."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
