"""A snapshot in object storage (S3, GCS, HTTPS), read through the node's verified chunk cache.

The same layout as on disk: ``manifest.json`` and the data object beside it, under a prefix
(``s3://bucket/snapshots/epoch-7``) or named by the manifest's own URI. Opening reads only the
manifest; a shard's `read_verified` fetches only the chunks its page range overlaps (once per
node, `ChunkCache`) and reads them into private memory, hashing each again as it lands, so a
cache file changed on disk is refused as a corrupted object would be. Only snapshots with
chunk hashes (manifest format 2, what `morphogen build` writes) can be remote: a manifest
without them names no bytes.
"""

from __future__ import annotations

import json
import logging
from contextlib import ExitStack
from typing import Any

import blake3
import numpy as np
import obstore

from morphogen.constants import PAGE_SIZE
from morphogen.snapshot.chunk_cache import ChunkCache, chunk_file, node_name
from morphogen.snapshot.hashes import chunk_count, chunk_pages_range
from morphogen.snapshot.manifest import MANIFEST_FILE, Manifest, SnapshotError
from morphogen.snapshot.opened import OpenedSnapshot
from morphogen.storage.failures import OTHER, TIMEOUT, UNREACHABLE, failure, ride_out
from morphogen.storage.location import StorageError, open_location

log = logging.getLogger(__name__)


def _split(uri: str) -> tuple[str, str]:
    """(the snapshot's prefix URI, the manifest's name)."""
    uri = uri.rstrip("/")
    if uri.lower().endswith(".json"):
        base, _, name = uri.rpartition("/")
        return base, name
    return uri, MANIFEST_FILE


def remote_manifest(raw: bytes, where: str) -> Manifest:
    """`raw` read as a manifest a remote snapshot can have (one with chunk hashes and a
    checksum), or a ValueError saying why not."""
    manifest = Manifest.from_dict(json.loads(raw), where=where)
    if manifest.chunk_hashes is None or manifest.checksum is None:
        raise SnapshotError("a remote snapshot needs a manifest with chunk hashes and a "
                            "checksum (write it with `morphogen build`)")
    return manifest


class RemoteSnapshot(OpenedSnapshot):
    """A snapshot whose bytes come from object storage through the node's chunk cache."""

    def __init__(self, uri: str, manifest: Manifest, location: Any, cache: ChunkCache) -> None:
        self.path = uri
        self.manifest = manifest
        self._location = location
        self._cache = cache
        self._stack = ExitStack()
        self._stack.enter_context(cache.holding(manifest))
        self._closed = False

    @classmethod
    def open(cls, uri: str, cache_dir: str, *, verify: bool = False) -> RemoteSnapshot:
        """The snapshot at `uri`. Its manifest is read from the store, waiting out an
        unreachable one (`store_outage_s`); where this node's cache already holds the manifest
        fetched from `uri` before, a store that does not answer is not waited for: the cached
        copy is used, and its chunks are checked against it as they are read."""
        base, name = _split(uri)
        where = f"{base}/{name}"
        location = open_location(base)
        cache = ChunkCache(cache_dir)
        cached = cache.manifest_for(uri)

        def get() -> bytes:
            return bytes(obstore.get(location.store, location.key(name)).bytes())

        try:
            raw = get() if cached is not None else ride_out(get, where)
        except FileNotFoundError:
            raise SnapshotError(f"{uri}: no snapshot manifest at {where} (push one there "
                                "with `morphogen snapshot push DIR URI`)") from None
        except Exception as exc:  # noqa: BLE001 - every store error is one line naming the URI
            err = failure(where, exc)
            if cached is None or err.kind not in (TIMEOUT, UNREACHABLE, OTHER):
                raise SnapshotError(f"{uri}: cannot read the manifest: {err}") from None
            log.warning("%s; starting from this node's cached copy of its manifest (%s)",
                        err, cached.root)
            raw = None
        if raw is None:
            assert cached is not None
            manifest = cached
        else:
            try:
                manifest = remote_manifest(raw, where)
            except ValueError as exc:
                raise SnapshotError(f"{uri}: {exc}") from None
        snap = cls(uri, manifest, location, cache)
        if raw is not None:
            cache.remember(uri, manifest)
        # held from here on; what no process on this node holds any more (the snapshots of
        # rotations since replaced everywhere here) goes, so a node keeps what it serves
        snap._cache.evict_unused(keep=[manifest.root])
        if verify:
            snap.verify()
        return snap

    def __repr__(self) -> str:
        return f"RemoteSnapshot({self.path!r}, epoch_id={self.epoch_id}, pages={self.num_pages})"

    def _read_range(self, start: int, end: int) -> bytes:
        key = self._location.key(self.manifest.data_file)
        return ride_out(lambda: obstore.get_range(self._location.store, key,
                                                  start=start, end=end),
                        f"{self._location.uri}/{self.manifest.data_file}")

    def chunks_of(self, start: int, stop: int) -> list[int]:
        cp = self.manifest.chunk_pages
        return list(range(start // cp, -(-stop // cp))) if stop > start else []

    def fetch(self, start: int = 0, stop: int | None = None,
              sink: Any = None) -> None:
        """Bring the chunks of pages [start, stop) into this node's cache (verified)."""
        stop = self.num_pages if stop is None else stop
        try:
            self._cache.ensure(self.manifest, self.path, self._read_range,
                               self.chunks_of(start, stop), sink)
        except StorageError as exc:
            raise SnapshotError(f"node {node_name()}: {self.path}: {exc}") from None

    def read_verified(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Pages [start, stop) as a private, read-only copy, every chunk hashed as it lands."""
        self._check_open()
        stop = self.num_pages if stop is None else stop
        if not 0 <= start <= stop <= self.num_pages:
            raise ValueError(f"page range [{start}, {stop}) is outside [0, {self.num_pages})")
        out = np.empty((stop - start, PAGE_SIZE), np.uint8)
        m = self.manifest
        assert m.chunk_hashes is not None
        landed: set[int] = set()

        def place(c: int, data: bytes | bytearray) -> None:
            a, b = chunk_pages_range(c, m.num_pages, m.chunk_pages)
            rows = np.frombuffer(data, np.uint8).reshape(b - a, PAGE_SIZE)
            lo, hi = max(a, start), min(b, stop)
            out[lo - start:hi - start] = rows[lo - a:hi - a]
            landed.add(c)

        self.fetch(start, stop, sink=place)  # fetched now: verified on the way in
        root_dir = self._cache.root_dir(self.manifest)
        for c in self.chunks_of(start, stop):
            if c in landed:
                continue
            a, b = chunk_pages_range(c, m.num_pages, m.chunk_pages)
            path = chunk_file(root_dir, c)
            data = path.read_bytes()  # from the cache: checked again, a disk can rot
            if len(data) != (b - a) * PAGE_SIZE or blake3.blake3(
                    data, max_threads=blake3.blake3.AUTO).hexdigest() != m.chunk_hashes[c]:
                path.unlink(missing_ok=True)  # the next open fetches it again
                raise SnapshotError(f"node {node_name()}: {self.path} chunk {c}: the cached "
                                    f"copy {path} does not hash as the manifest says; removed")
            place(c, data)
        out.flags.writeable = False
        return out

    def pages(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self.read_verified(start, stop)

    def verify(self, progress: Any = None) -> str:
        """Fetch and check every chunk (the whole snapshot lands in this node's cache)."""
        self.read_verified(0, self.num_pages)
        return self.manifest.root

    def chunk_count(self) -> int:
        return chunk_count(self.num_pages, self.manifest.chunk_pages)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._stack.close()
