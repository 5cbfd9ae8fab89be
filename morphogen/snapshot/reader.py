"""An opened snapshot: a read-only memory map of its page file, read by page range."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from morphogen.constants import MAX_DOMAIN_BITS, MAX_PAGES, PAGE_SIZE
from morphogen.snapshot.chunks import CHUNK_PAGES, as_bytes
from morphogen.snapshot.layout import domain_bits_for
from morphogen.snapshot.manifest import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    Manifest,
    SnapshotError,
    checksum_str,
)
from morphogen.snapshot.progress import Meter, Progress
from morphogen.snapshot.sample import sample_digest


def _empty_pages() -> np.ndarray:
    out = np.empty((0, PAGE_SIZE), dtype=np.uint8)
    out.flags.writeable = False
    return out


class Snapshot:
    """One opened snapshot: a read-only memory map of its page file.

    Use :meth:`open`. :meth:`pages` returns views into the mapping, so reading a shard's range
    faults in only that range. The mapping pins the file's inode: a later ``write_snapshot`` into
    the same directory replaces the file by rename and this snapshot keeps serving its own epoch.
    """

    def __init__(
        self,
        manifest: Manifest,
        path: Path,
        data_path: Path,
        whole: np.ndarray | None,
        tail: np.ndarray | None,
    ) -> None:
        self.manifest = manifest
        self.path = path
        self.data_path = data_path
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
        bare raw page file (manifest derived: epoch 0, smallest domain).

        ``verify=True`` recomputes the checksum (reads the whole file) and refuses a mismatch.
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
        if verify:
            try:
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

    @classmethod
    def _map(cls, manifest: Manifest, path: Path, data_path: Path) -> Snapshot:
        try:
            fd = os.open(data_path, os.O_RDONLY)
        except FileNotFoundError:
            raise SnapshotError(f"{path}: data file {data_path} is missing") from None
        except OSError as exc:
            raise SnapshotError(f"{path}: cannot open data file {data_path}: {exc}") from None
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
        finally:
            os.close(fd)  # the mapping holds its own reference to the file
        snap = cls(manifest, path, data_path, whole, tail)
        if manifest.sample is not None and sample_digest(snap) != manifest.sample:
            snap.close()
            raise SnapshotError(
                f"{data_path}: the data file does not match its manifest (sampled pages "
                "differ): it was replaced or modified after the manifest was written"
            )
        return snap

    # -- attributes

    @property
    def num_pages(self) -> int:
        return self.manifest.num_pages

    @property
    def domain_bits(self) -> int:
        return self.manifest.domain_bits

    @property
    def epoch_id(self) -> int:
        return self.manifest.epoch_id

    def __len__(self) -> int:
        return self.manifest.num_pages

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
        if self._closed:
            raise SnapshotError(f"{self.path}: snapshot is closed")
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

    def compute_checksum(self, progress: Progress = None) -> str:
        """``blake2b-256`` of the page data as served (zero-padded), read through the mapping so
        it checks the very bytes this snapshot serves."""
        h = hashlib.blake2b(digest_size=32)
        meter = Meter(progress, self.manifest.num_pages * PAGE_SIZE, f"verify {self.data_path}")
        for chunk in self.iter_chunks():
            h.update(as_bytes(chunk))
            meter.advance(chunk.nbytes)
        meter.finish()
        return checksum_str(h.digest())

    def verify(self, progress: Progress = None) -> str:
        """Recompute the checksum and compare it with the manifest's; return it.

        A derived manifest (bare raw file) has no checksum to compare: the computed one is
        returned and nothing is refused.
        """
        actual = self.compute_checksum(progress)
        expected = self.manifest.checksum
        if expected is not None and actual != expected:
            raise SnapshotError(
                f"{self.data_path}: checksum mismatch: manifest says {expected}, "
                f"data has {actual} (corrupt file or a manifest from another epoch)"
            )
        return actual

    # -- lifetime

    def fingerprint(self) -> str:
        """What names this snapshot's data in an epoch identity: the manifest checksum, else
        (a bare raw file) a digest of its size and sampled pages."""
        if self.manifest.checksum is not None:
            return self.manifest.checksum
        return f"sampled:{self.manifest.data_bytes}:{sample_digest(self)}"

    def close(self) -> None:
        """Drop this snapshot's mapping. Views already handed out stay valid (they hold it)."""
        self._closed = True
        self._whole = None
        self._tail = None

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
