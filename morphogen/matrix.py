"""The page matrix and its snapshot files.

A snapshot is one epoch of the matrix on disk: a raw page file (``pages.bin``, the reference's
format: the pages back to back, 4096 bytes each, nothing else) and a JSON manifest
(``manifest.json``) naming the epoch, the page count, the DPF domain and a checksum of the data.
Shards open it memory-mapped and read only their own page range, so the matrix never travels
through a constructor or an object store, and a shard of a 64 GiB matrix touches only its slice.

A bare raw page file is accepted too (epoch 0, manifest derived from its size). Its last page
may be ragged; it is zero-padded virtually: the mapping covers the whole pages and only the tail
page is read into a padded copy, so opening never copies the file.

The checksum (``blake2b-256``) covers the page data as served, i.e. zero-padded to
``num_pages * page_size`` bytes; it is computed while writing and checked only on request
(``verify=True``), since reading a multi-GiB file at every shard start would defeat the mapping.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from morphogen.constants import MAX_DOMAIN_BITS, MAX_PAGES, PAGE_SIZE

FORMAT_VERSION = 1
DATA_FILE = "pages.bin"
MANIFEST_FILE = "manifest.json"
CHECKSUM_PREFIX = "blake2b-256:"
# Writes and checksums stream in chunks of this many pages (16 MiB) so that host memory stays
# bounded whatever the matrix size. Chunks under glibc's largest mmap threshold (32 MiB) are
# recycled by malloc instead of being faulted in afresh, which measured ~25% faster here.
CHUNK_PAGES = 4096

_WORDS_PER_PAGE = PAGE_SIZE // 8

ProgressCallback = Callable[[int, int | None], None]
"""Called as ``progress(done_bytes, total_bytes)``; total is None when not known in advance."""
Progress = bool | ProgressCallback | None

__all__ = [
    "CHUNK_PAGES",
    "DATA_FILE",
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "MAX_DOMAIN_BITS",
    "PAGE_SIZE",
    "Manifest",
    "Snapshot",
    "SnapshotError",
    "build_synthetic",
    "domain_bits_for",
    "import_raw",
    "shard_ranges",
    "synthetic_pages",
    "write_snapshot",
]


class SnapshotError(ValueError):
    """A snapshot (manifest or page file) is missing, malformed or does not match itself."""


def domain_bits_for(num_pages: int) -> int:
    """The smallest DPF domain that covers ``num_pages`` pages (at least 1 bit)."""
    if num_pages < 1:
        raise ValueError(f"num_pages must be >= 1, got {num_pages}")
    # Integer form of max(1, ceil(log2(P))): exact where floating log2 could round.
    return max(1, (num_pages - 1).bit_length())


def shard_ranges(num_pages: int, num_shards: int) -> list[tuple[int, int]]:
    """Split ``[0, num_pages)`` into ``num_shards`` contiguous ranges whose sizes differ by <= 1.

    The first ``num_pages % num_shards`` ranges get the extra page. An empty shard would scan
    nothing yet still be waited on, so more shards than pages is refused.
    """
    if num_pages < 1:
        raise ValueError(f"num_pages must be >= 1, got {num_pages}")
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    if num_shards > num_pages:
        raise ValueError(f"cannot split {num_pages} pages into {num_shards} non-empty shards")
    base, extra = divmod(num_pages, num_shards)
    ranges = []
    start = 0
    for i in range(num_shards):
        stop = start + base + (1 if i < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


# --------------------------------------------------------------------------- manifest


def _checksum_str(digest: bytes) -> str:
    return CHECKSUM_PREFIX + digest.hex()


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Manifest:
    """What a snapshot's ``manifest.json`` says.

    ``data_bytes`` is the size of the data file; a written snapshot always holds whole pages
    (``num_pages * page_size``), a bare raw file may end inside its last page.
    ``checksum`` is ``"blake2b-256:<hex>"`` of the zero-padded page data, or None for a manifest
    derived from a bare raw file (nothing to compare against).
    """

    format: int
    epoch_id: int
    num_pages: int
    page_size: int
    domain_bits: int
    data_file: str
    data_bytes: int
    checksum: str | None
    created: str
    source: str
    # blake2b-128 of a few pages spread over the file (`sample_digest`), checked at every open:
    # catches a data file replaced under an unchanged manifest without reading the whole file.
    # None in manifests written before it existed.
    sample: str | None = None

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        if self.format != FORMAT_VERSION:
            raise SnapshotError(
                f"unknown snapshot format {self.format!r} (this version reads {FORMAT_VERSION})"
            )
        if self.page_size != PAGE_SIZE:
            raise SnapshotError(f"page_size is {self.page_size}, only {PAGE_SIZE} is supported")
        if not 0 <= self.epoch_id < 1 << 64:
            raise SnapshotError(f"epoch_id {self.epoch_id} is not a u64")
        if not 1 <= self.num_pages <= MAX_PAGES:
            raise SnapshotError(f"num_pages is {self.num_pages}, must be in 1..{MAX_PAGES}")
        needed = domain_bits_for(self.num_pages)
        if self.domain_bits < needed:
            # With 2^d < P pages the DPF aliases pages and a client gets the XOR of several.
            raise SnapshotError(
                f"domain_bits {self.domain_bits} is too small for {self.num_pages} pages "
                f"(needs >= {needed})"
            )
        if self.domain_bits > MAX_DOMAIN_BITS:
            raise SnapshotError(
                f"domain_bits {self.domain_bits} exceeds the maximum {MAX_DOMAIN_BITS}"
            )
        full = self.num_pages * self.page_size
        if not full - self.page_size < self.data_bytes <= full:
            raise SnapshotError(
                f"data_bytes {self.data_bytes} does not match {self.num_pages} pages of "
                f"{self.page_size} bytes (expected {full})"
            )
        name = self.data_file
        if not name or name in (".", "..") or "/" in name or "\\" in name:
            # The data file lives next to its manifest; a path could point anywhere.
            raise SnapshotError(f"data_file {name!r} must be a plain file name")
        if self.checksum is not None:
            hexpart = self.checksum.removeprefix(CHECKSUM_PREFIX)
            if (
                not self.checksum.startswith(CHECKSUM_PREFIX)
                or len(hexpart) != 64
                or any(c not in "0123456789abcdef" for c in hexpart)
            ):
                raise SnapshotError(
                    f"checksum {self.checksum!r} is not '{CHECKSUM_PREFIX}' + 64 lowercase hex"
                )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "manifest") -> Manifest:
        """Build a manifest from parsed JSON, refusing missing fields and wrong types."""
        if not isinstance(data, dict):
            raise SnapshotError(f"{where}: expected a JSON object, got {type(data).__name__}")
        if "format" not in data:
            raise SnapshotError(f"{where}: missing field 'format' (not a snapshot manifest?)")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                if f.name == "sample":
                    continue  # optional: older manifests
                raise SnapshotError(f"{where}: missing field {f.name!r}")
            value = data[f.name]
            if f.name in ("checksum", "sample"):
                ok = value is None or isinstance(value, str)
                want = "a string or null"
            elif f.type in ("int", int):
                # bool is an int subclass; true/false are not page counts.
                ok = isinstance(value, int) and not isinstance(value, bool)
                want = "an integer"
            else:
                ok = isinstance(value, str)
                want = "a string"
            if not ok:
                raise SnapshotError(f"{where}: field {f.name!r} must be {want}, got {value!r}")
            values[f.name] = value
        try:
            return cls(**values)
        except SnapshotError as exc:
            raise SnapshotError(f"{where}: {exc}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Manifest:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise SnapshotError(f"{path}: manifest not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SnapshotError(f"{path}: cannot read manifest: {exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SnapshotError(f"{path}: manifest is not valid JSON: {exc}") from None
        return cls.from_dict(data, where=str(path))


# --------------------------------------------------------------------------- snapshot


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
        Snapshots written by this module never have a ragged page.
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
        meter = _Meter(progress, self.manifest.num_pages * PAGE_SIZE, f"verify {self.data_path}")
        for chunk in self.iter_chunks():
            h.update(_as_bytes(chunk))
            meter.advance(chunk.nbytes)
        meter.finish()
        return _checksum_str(h.digest())

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


# --------------------------------------------------------------------------- progress


class _Meter:
    """Reports bytes done / total and throughput, to a callback or as a stderr line."""

    def __init__(self, progress: Progress, total: int | None, label: str) -> None:
        self._callback: ProgressCallback | None = None
        self._stderr = False
        if callable(progress):
            self._callback = progress
        elif progress:
            self._stderr = True
        self._total = total
        self._label = label
        self._done = 0
        self._t0 = time.monotonic()
        self._last = 0.0
        self._tty = self._stderr and sys.stderr.isatty()
        # A terminal gets one line rewritten in place; a log gets a line every few seconds.
        self._interval = 0.2 if self._tty else 5.0

    def advance(self, nbytes: int) -> None:
        self._done += nbytes
        if self._callback is not None:
            self._callback(self._done, self._total)
        elif self._stderr:
            now = time.monotonic()
            if now - self._last >= self._interval:
                self._last = now
                self._emit(final=False)

    def finish(self) -> None:
        if self._stderr:
            self._emit(final=True)

    def _emit(self, *, final: bool) -> None:
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        rate = self._done / elapsed / 1e6
        done = self._done / 2**30
        if self._total:
            pct = 100.0 * self._done / self._total
            what = f"{done:.2f} / {self._total / 2**30:.2f} GiB ({pct:5.1f}%)"
        else:
            what = f"{done:.2f} GiB"
        line = f"{self._label}: {what} {rate:8.1f} MB/s"
        if final:
            line += f" in {elapsed:.1f} s"
        if self._tty:
            sys.stderr.write("\r" + line + ("\n" if final else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


# --------------------------------------------------------------------------- writing

PageSource = np.ndarray | Snapshot | Iterable[bytes | bytearray | memoryview | np.ndarray]
"""What ``write_snapshot`` accepts: a ``(P, 4096)`` uint8 array (a memmap is fine), an open
``Snapshot``, or an iterable of byte chunks (bytes-like or uint8 arrays) forming one byte stream
whose end is zero-padded to a whole page."""


def _as_bytes(chunk: Any) -> memoryview:
    if isinstance(chunk, np.ndarray):
        if chunk.dtype != np.uint8:
            raise TypeError(f"page chunks must be uint8, got {chunk.dtype}")
        # Flattened first: memoryview cannot cast an empty multi-dimensional view.
        return memoryview(np.ascontiguousarray(chunk).reshape(-1))
    return memoryview(chunk).cast("B")


def _source_chunks(source: PageSource) -> tuple[Iterator[Any], int | None]:
    """Normalise a page source to (chunk iterator, page count if known)."""
    if isinstance(source, Snapshot):
        return source.iter_chunks(), source.num_pages
    if isinstance(source, np.ndarray):
        if source.ndim != 2 or source.shape[1] != PAGE_SIZE or source.dtype != np.uint8:
            raise ValueError(
                f"page array must be (P, {PAGE_SIZE}) uint8, got {source.shape} {source.dtype}"
            )
        n = int(source.shape[0])
        return (source[s : s + CHUNK_PAGES] for s in range(0, n, CHUNK_PAGES)), n
    return iter(source), None


SAMPLE_PAGES = 64


def sampled_pages(num_pages: int) -> list[int]:
    """The pages `sample_digest` reads: SAMPLE_PAGES spread evenly, first and last included."""
    n = num_pages
    return sorted({(n - 1) * i // (SAMPLE_PAGES - 1) for i in range(SAMPLE_PAGES)})


def sample_digest(snap: Snapshot) -> str:
    """blake2b-128 of the page count and SAMPLE_PAGES pages spread evenly over the snapshot
    (first and last included): a cheap check, at every open, that the data file is the one its
    manifest was written for. Not a substitute for the checksum (`verify=True`)."""
    return _sample_digest(snap.num_pages, lambda p: snap.pages(p, p + 1))


def _sample_digest(num_pages: int, page: Callable[[int], np.ndarray]) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(num_pages.to_bytes(8, "little"))
    for p in sampled_pages(num_pages):
        h.update(_as_bytes(page(p)))
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # not every platform lets a directory be opened; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_snapshot(
    out_dir: str | os.PathLike[str],
    pages_source: PageSource,
    *,
    epoch_id: int,
    source: str,
    progress: Progress = None,
    num_pages: int | None = None,
    domain_bits: int | None = None,
    overwrite: bool = False,
) -> Manifest:
    """Write ``pages.bin`` and ``manifest.json`` into ``out_dir`` and return the manifest.

    A directory that already holds a snapshot is refused unless ``overwrite``: servers may have
    it mapped, and a restarted replica would map the new data under the same epoch id.

    The data streams in 16 MiB chunks (bounded host memory at any size) and is hashed as it is
    written, the hash running in a worker thread beside the write and the next chunk's
    production. Both files go to temporary names first and are renamed into place, manifest
    last, after the old manifest is removed: a reader sees either no snapshot or a complete,
    consistent one, and readers that have the old file mapped keep their old epoch.

    ``num_pages``, when given, is checked against what the source produced (and sizes progress
    for a chunk stream). ``domain_bits`` defaults to the smallest domain covering the pages.
    """
    chunks, known_pages = _source_chunks(pages_source)
    if num_pages is not None and known_pages is not None and num_pages != known_pages:
        raise ValueError(f"num_pages={num_pages} but the source holds {known_pages} pages")
    expected_pages = known_pages if known_pages is not None else num_pages
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data_path = out / DATA_FILE
    manifest_path = out / MANIFEST_FILE
    if not overwrite and (manifest_path.exists() or data_path.exists()):
        raise SnapshotError(
            f"{out} already holds a snapshot: write each epoch to a new directory (servers "
            "may have this one mapped), or overwrite it explicitly"
        )
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    tmp_data = out / f".{DATA_FILE}.tmp-{token}"
    tmp_manifest = out / f".{MANIFEST_FILE}.tmp-{token}"
    total = None if expected_pages is None else expected_pages * PAGE_SIZE
    meter = _Meter(progress, total, f"writing {data_path}")
    h = hashlib.blake2b(digest_size=32)
    written = 0
    try:
        with open(tmp_data, "wb") as fh, ThreadPoolExecutor(2) as pool:
            pending = pool.submit(next, chunks, None)
            while True:
                chunk = pending.result()
                if chunk is None:
                    break
                # Produce the next chunk while this one is hashed and written.
                pending = pool.submit(next, chunks, None)
                buf = _as_bytes(chunk)
                hashed = pool.submit(h.update, buf)
                fh.write(buf)
                hashed.result()
                written += len(buf)
                meter.advance(len(buf))
            ragged = written % PAGE_SIZE
            if ragged:
                pad = bytes(PAGE_SIZE - ragged)
                h.update(pad)
                fh.write(pad)
                written += len(pad)
            fh.flush()
            os.fsync(fh.fileno())
        meter.finish()
        pages_written = written // PAGE_SIZE
        if pages_written == 0:
            raise SnapshotError("page source is empty: a snapshot needs at least one page")
        if expected_pages is not None and pages_written != expected_pages:
            raise SnapshotError(
                f"page source produced {pages_written} pages, expected {expected_pages}"
            )
        with open(tmp_data, "rb") as fh:
            written_pages = np.memmap(fh, dtype=np.uint8, mode="r",
                                      shape=(pages_written, PAGE_SIZE))
            sample = _sample_digest(pages_written, lambda p: written_pages[p : p + 1])
        manifest = Manifest(
            sample=sample,
            format=FORMAT_VERSION,
            epoch_id=epoch_id,
            num_pages=pages_written,
            page_size=PAGE_SIZE,
            domain_bits=domain_bits if domain_bits is not None else domain_bits_for(pages_written),
            data_file=DATA_FILE,
            data_bytes=pages_written * PAGE_SIZE,
            checksum=_checksum_str(h.digest()),
            created=_now_iso(),
            source=source,
        )
        tmp_manifest.write_text(manifest.to_json(), encoding="utf-8")
        with open(tmp_manifest, "rb") as fh:
            os.fsync(fh.fileno())
        # An old manifest must never be paired with the new data (or the reverse).
        manifest_path.unlink(missing_ok=True)
        os.replace(tmp_data, data_path)
        os.replace(tmp_manifest, manifest_path)
        _fsync_dir(out)
    except BaseException:
        tmp_data.unlink(missing_ok=True)
        tmp_manifest.unlink(missing_ok=True)
        raise
    return manifest


# --------------------------------------------------------------------------- sources


def synthetic_pages(seed: int, start: int, stop: int) -> np.ndarray:
    """Deterministic pseudo-random pages ``[start, stop)`` as a ``(stop - start, 4096)`` array.

    Page ``i`` is the 512 little-endian 64-bit words ``[512 i, 512 i + 512)`` of one PCG64
    stream seeded by ``SeedSequence(seed)``; PCG64 jumps ahead in O(log n), so any range is
    generated directly and page ``i`` is the same however the range is cut. NumPy keeps the
    PCG64 and SeedSequence streams stable across releases. Not for secrets: demos, tests and
    benchmarks only.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    start, stop = int(start), int(stop)
    if not 0 <= start <= stop:
        raise ValueError(f"bad page range [{start}, {stop})")
    if start == stop:
        return np.empty((0, PAGE_SIZE), dtype=np.uint8)
    bitgen = np.random.PCG64(np.random.SeedSequence(int(seed)))
    bitgen.advance(start * _WORDS_PER_PAGE)
    words = bitgen.random_raw((stop - start) * _WORDS_PER_PAGE)
    return words.astype("<u8", copy=False).view(np.uint8).reshape(stop - start, PAGE_SIZE)


def _synthetic_chunks(seed: int, num_pages: int) -> Iterator[np.ndarray]:
    for s in range(0, num_pages, CHUNK_PAGES):
        yield synthetic_pages(seed, s, min(num_pages, s + CHUNK_PAGES))


def build_synthetic(
    out_dir: str | os.PathLike[str],
    num_pages: int,
    *,
    seed: int = 0,
    epoch_id: int = 1,
    progress: Progress = True,
    overwrite: bool = False,
) -> Manifest:
    """Write a synthetic snapshot of ``num_pages`` pages (``synthetic_pages(seed, 0, P)``)."""
    if not 1 <= num_pages <= MAX_PAGES:
        raise ValueError(f"num_pages must be in 1..{MAX_PAGES}, got {num_pages}")
    return write_snapshot(
        out_dir,
        _synthetic_chunks(seed, num_pages),
        epoch_id=epoch_id,
        source=f"synthetic:{seed}",
        progress=progress,
        num_pages=num_pages,
        overwrite=overwrite,
    )


def _file_chunks(path: Path, chunk_bytes: int) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_bytes):
            yield chunk


def import_raw(
    raw_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    epoch_id: int = 1,
    progress: Progress = True,
    overwrite: bool = False,
) -> Manifest:
    """Turn a raw page file (the reference's format) into a snapshot, zero-padding a ragged
    last page and checksumming as it copies."""
    raw = Path(raw_path)
    try:
        size = raw.stat().st_size
    except FileNotFoundError:
        raise SnapshotError(f"{raw}: raw page file not found") from None
    if not raw.is_file():
        raise SnapshotError(f"{raw}: not a regular file")
    if size == 0:
        raise SnapshotError(f"{raw}: raw page file is empty")
    num_pages = -(-size // PAGE_SIZE)
    if num_pages > MAX_PAGES:
        raise SnapshotError(f"{raw}: {num_pages} pages exceed the 2^{MAX_DOMAIN_BITS} domain")
    return write_snapshot(
        out_dir,
        _file_chunks(raw, CHUNK_PAGES * PAGE_SIZE),
        epoch_id=epoch_id,
        source=f"raw:{raw.name}",
        progress=progress,
        num_pages=num_pages,
        overwrite=overwrite,
    )
