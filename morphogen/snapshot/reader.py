"""An opened snapshot: its page file, mapped (cheap range views) and held open (checked private
copies of the range a shard serves)."""

from __future__ import annotations

import dataclasses
import logging
import os
import weakref
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from morphogen.constants import MAX_DOMAIN_BITS, MAX_PAGES, PAGE_SIZE
from morphogen.snapshot.chunks import CHUNK_PAGES
from morphogen.snapshot.layout import domain_bits_for
from morphogen.snapshot.manifest import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    Manifest,
    SnapshotError,
)
from morphogen.snapshot.opened import OpenedSnapshot
from morphogen.snapshot.progress import Meter, Progress
from morphogen.snapshot.verified import read_chunks

log = logging.getLogger(__name__)


def _empty_pages() -> np.ndarray:
    out = np.empty((0, PAGE_SIZE), dtype=np.uint8)
    out.flags.writeable = False
    return out


class Snapshot(OpenedSnapshot):
    """One opened snapshot: its page file, read-only mapped and held open.

    Use :meth:`open`. :meth:`pages` returns views into the mapping, so reading a range faults
    in only that range; :meth:`read_verified` is what a shard serves: a private copy of its
    range, checked against the chunk hashes. Mapping and descriptor pin the file's inode: a
    later ``write_snapshot`` into the same directory replaces the file by rename and this
    snapshot keeps reading its own epoch's file (a file overwritten in place is another story:
    `read_verified` refuses it).

    The manifest always has its chunk hashes once open: read from ``manifest.json``, or, for a
    bare raw file or a format 1 manifest, computed from every byte at open.
    """

    def __init__(
        self,
        manifest: Manifest,
        path: Path,
        data_path: Path,
        fd: int,
        whole: np.ndarray | None,
        tail: np.ndarray | None,
    ) -> None:
        self.manifest = manifest
        self.path = path
        self.data_path = data_path
        self._fd = fd
        self._close_fd = weakref.finalize(self, os.close, fd)
        self._whole = whole  # memmap (full_pages, PAGE_SIZE), None when there is no whole page
        self._tail = tail  # (1, PAGE_SIZE) zero-padded copy of a ragged last page, else None
        self._full_pages = 0 if whole is None else int(whole.shape[0])
        self._closed = False

    # -- opening

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, verify: bool = False, progress: Progress = None
    ) -> Snapshot:
        """Open a snapshot from a manifest ``.json``, a directory holding ``manifest.json``, or a
        bare raw page file (manifest derived: epoch 0, smallest domain, chunk hashes computed
        from every byte now).

        ``verify=True`` rehashes every chunk (reads the whole file) and refuses a mismatch.
        """
        path = Path(path)
        if path.is_dir():
            manifest_path = path / MANIFEST_FILE
            if not manifest_path.is_file():
                raise SnapshotError(f"{path}: directory has no {MANIFEST_FILE}")
            snap = cls._open_manifest(manifest_path)
        elif path.suffix.lower() == ".json":
            snap = cls._open_manifest(path)
        elif path.is_file():
            snap = cls._open_raw(path)
        elif not path.exists():
            raise SnapshotError(f"{path}: no such snapshot (file or directory)")
        else:
            raise SnapshotError(f"{path}: not a regular file or directory")
        try:
            if snap.manifest.chunk_hashes is None:
                snap._derive_hashes(progress)  # every byte just hashed: nothing left to verify
            elif verify:
                snap.verify(progress=progress)
        except BaseException:
            snap.close()
            raise
        return snap

    @classmethod
    def _open_manifest(cls, manifest_path: Path) -> Snapshot:
        manifest = Manifest.load(manifest_path)
        data_path = manifest_path.parent / manifest.data_file
        return cls._map(manifest, manifest_path, data_path)

    @classmethod
    def _open_raw(cls, raw_path: Path) -> Snapshot:
        size = raw_path.stat().st_size
        if size == 0:
            raise SnapshotError(f"{raw_path}: raw page file is empty")
        num_pages = -(-size // PAGE_SIZE)
        if num_pages > MAX_PAGES:
            raise SnapshotError(
                f"{raw_path}: {num_pages} pages exceed the 2^{MAX_DOMAIN_BITS} page domain"
            )
        mtime = datetime.fromtimestamp(raw_path.stat().st_mtime, UTC)
        manifest = Manifest(
            format=FORMAT_VERSION,
            epoch_id=0,
            num_pages=num_pages,
            page_size=PAGE_SIZE,
            domain_bits=domain_bits_for(num_pages),
            data_file=raw_path.name,
            data_bytes=size,
            checksum=None,
            created=mtime.isoformat(timespec="seconds"),
            source=f"raw:{raw_path.name}",
        )
        return cls._map(manifest, raw_path, raw_path)

    def _derive_hashes(self, progress: Progress) -> None:
        """Complete a derived manifest with the chunk hashes of the bytes as they are now."""
        if self.path != self.data_path:  # a manifest without them: format 1
            log.warning("%s: a format 1 manifest has no chunk hashes: hashing all %d pages at "
                        "every open (rebuild it with `morphogen build --raw %s`)",
                        self.path, self.num_pages, self.data_path)
        meter = Meter(progress, self.num_pages * PAGE_SIZE, f"hashing {self.data_path}")
        digests = self._read_chunks(0, self.num_pages, meter=meter)
        self.manifest = dataclasses.replace(self.manifest, chunk_hashes=tuple(digests))

    @classmethod
    def _map(cls, manifest: Manifest, path: Path, data_path: Path) -> Snapshot:
        try:
            fd = os.open(data_path, os.O_RDONLY)
        except FileNotFoundError:
            raise SnapshotError(f"{path}: data file {data_path} is missing") from None
        except OSError as exc:
            raise SnapshotError(f"{path}: cannot open data file {data_path}: {exc}") from None
        keep_fd = False
        try:
            size = os.fstat(fd).st_size
            if size < manifest.data_bytes:
                raise SnapshotError(
                    f"{data_path}: data file is truncated: {size} bytes, manifest says "
                    f"{manifest.data_bytes} ({manifest.num_pages} pages)"
                )
            if size > manifest.data_bytes:
                raise SnapshotError(
                    f"{data_path}: data file has {size} bytes, manifest says "
                    f"{manifest.data_bytes} ({manifest.num_pages} pages): wrong file or epoch?"
                )
            full_pages, ragged = divmod(size, PAGE_SIZE)
            whole = None
            if full_pages:
                with open(fd, "rb", closefd=False) as fh:
                    whole = np.memmap(fh, dtype=np.uint8, mode="r", shape=(full_pages, PAGE_SIZE))
            tail = None
            if ragged:
                tail = np.zeros((1, PAGE_SIZE), dtype=np.uint8)
                chunk = os.pread(fd, ragged, full_pages * PAGE_SIZE)
                if len(chunk) != ragged:
                    raise SnapshotError(f"{data_path}: short read of the last page")
                tail[0, :ragged] = np.frombuffer(chunk, dtype=np.uint8)
                tail.flags.writeable = False
            keep_fd = True
        finally:
            if not keep_fd:
                os.close(fd)
        return cls(manifest, path, data_path, fd, whole, tail)

    def __repr__(self) -> str:
        m = self.manifest
        return (
            f"Snapshot(path={str(self.path)!r}, epoch_id={m.epoch_id}, num_pages={m.num_pages}, "
            f"domain_bits={m.domain_bits})"
        )

    # -- reading

    def pages(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Pages ``[start, stop)`` as a read-only ``(stop - start, 4096)`` uint8 array.

        The result is a view into the memory map and touches nothing outside the range, except
        when the range includes a ragged (virtually zero-padded) last page of a bare raw file:
        then it is a copy (the mapped pages plus the padded tail), as large as the range.
        Snapshots written by `write_snapshot` never have a ragged page.
        """
        self._check_open()
        n = self.manifest.num_pages
        if stop is None:
            stop = n
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= n:
            raise ValueError(f"page range [{start}, {stop}) is outside [0, {n})")
        full = self._full_pages
        if stop <= full:
            assert self._whole is not None or start == stop
            if self._whole is None:
                return self._tail[0:0] if self._tail is not None else _empty_pages()
            return self._whole[start:stop]
        assert self._tail is not None  # stop > full pages happens only with a ragged tail
        if start >= full:
            return self._tail[start - full : stop - full]
        assert self._whole is not None
        out = np.concatenate((self._whole[start:full], self._tail))
        out.flags.writeable = False
        return out

    def iter_chunks(
        self, start: int = 0, stop: int | None = None, chunk_pages: int = CHUNK_PAGES
    ) -> Iterator[np.ndarray]:
        """Pages ``[start, stop)`` in consecutive chunks of at most ``chunk_pages`` pages."""
        if stop is None:
            stop = self.manifest.num_pages
        if chunk_pages < 1:
            raise ValueError("chunk_pages must be >= 1")
        for s in range(start, stop, chunk_pages):
            yield self.pages(s, min(stop, s + chunk_pages))

    def read_verified(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Pages ``[start, stop)`` as a read-only private copy whose every overlapping chunk
        hashed as the manifest says (morphogen.snapshot.verified): what a shard serves. A
        mismatch is a SnapshotError naming the file and the chunk."""
        self._check_open()
        if stop is None:
            stop = self.manifest.num_pages
        out = np.empty((stop - start, PAGE_SIZE), np.uint8)
        if stop > start:
            self._read_chunks(start, stop, out=out, expected=self.manifest.chunk_hashes)
        out.flags.writeable = False
        return out

    def verify(self, progress: Progress = None) -> str:
        """Rehash every chunk of the data file and compare with the manifest's chunk hashes
        (for a derived manifest: those computed at open); return the checksum (the root)."""
        self._check_open()
        meter = Meter(progress, self.num_pages * PAGE_SIZE, f"verify {self.data_path}")
        self._read_chunks(0, self.num_pages, expected=self.manifest.chunk_hashes, meter=meter)
        return self.manifest.root

    def _read_chunks(
        self,
        start: int,
        stop: int,
        *,
        out: np.ndarray | None = None,
        expected: tuple[str, ...] | None = None,
        meter: Meter | None = None,
    ) -> list[str]:
        m = self.manifest
        return read_chunks(self._fd, self.data_path, m.num_pages, m.data_bytes, m.chunk_pages,
                           start, stop, out=out, expected=expected, meter=meter)

    # -- lifetime

    def close(self) -> None:
        """Drop this snapshot's mapping and descriptor. Views already handed out stay valid
        (they hold the mapping)."""
        self._closed = True
        self._whole = None
        self._tail = None
        self._close_fd()
