"""Writing a snapshot: any page source to ``pages.bin`` and ``manifest.json``, atomically."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from morphogen.constants import MAX_DOMAIN_BITS, MAX_PAGES, PAGE_SIZE
from morphogen.snapshot.chunks import CHUNK_PAGES, as_bytes
from morphogen.snapshot.hashes import (
    DEFAULT_CHUNK_PAGES,
    HASH_THREADS,
    ChunkHasher,
    checksum_str,
    root_hex,
)
from morphogen.snapshot.layout import domain_bits_for
from morphogen.snapshot.manifest import (
    DATA_FILE,
    FORMAT_VERSION,
    MANIFEST_FILE,
    Manifest,
    SnapshotError,
)
from morphogen.snapshot.progress import Meter, Progress
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.tables import Table, TableError, parse_tables
from morphogen.storage.durable import fsync_dir

PageSource = np.ndarray | Snapshot | Iterable[bytes | bytearray | memoryview | np.ndarray]
"""What ``write_snapshot`` accepts: a ``(P, 4096)`` uint8 array (a memmap is fine), an open
``Snapshot``, or an iterable of byte chunks (bytes-like or uint8 arrays) forming one byte stream
whose end is zero-padded to a whole page."""


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


def _adoptable(source: PageSource, out: Path) -> Path | None:
    """The file that `source` maps whole, where it can become a snapshot's pages in `out`."""
    if not isinstance(source, np.memmap) or source.offset or not source.flags.c_contiguous:
        return None
    if source.ndim != 2 or source.shape[1] != PAGE_SIZE or source.dtype != np.uint8:
        return None
    path = Path(source.filename)
    out.mkdir(parents=True, exist_ok=True)
    try:
        stat = path.stat()
    except OSError:
        return None
    # a rename cannot cross file systems: a file elsewhere is copied
    same_disk = stat.st_dev == out.stat().st_dev
    return path if same_disk and stat.st_size == source.nbytes else None


def _copy(chunks: Iterator[Any], tmp_data: Path, hasher: ChunkHasher, meter: Meter) -> int:
    """The chunks written to `tmp_data` (synced, zero-padded to a page) and hashed; the bytes
    written."""
    written = 0
    with open(tmp_data, "wb") as fh, ThreadPoolExecutor(2) as pool:
        pending = pool.submit(next, chunks, None)
        while True:
            chunk = pending.result()
            if chunk is None:
                break
            # Produce the next chunk while this one is hashed and written.
            pending = pool.submit(next, chunks, None)
            buf = as_bytes(chunk)
            hashed = pool.submit(hasher.update, buf)
            fh.write(buf)
            hashed.result()
            written += len(buf)
            meter.advance(len(buf))
        ragged = written % PAGE_SIZE
        if ragged:
            pad = bytes(PAGE_SIZE - ragged)
            hasher.update(memoryview(pad))
            fh.write(pad)
            written += len(pad)
        fh.flush()
        os.fsync(fh.fileno())
    return written


def _hash_in_place(pages: np.ndarray, path: Path, hasher: ChunkHasher, meter: Meter) -> int:
    """The pages of mapped file `path` hashed where they lie, while the disk syncs them (the
    sync waits on the disk, the hash on the cores: side by side, both take the longer's
    time); the bytes hashed."""
    flat = pages.reshape(-1)
    step = CHUNK_PAGES * PAGE_SIZE
    fd = os.open(path, os.O_RDWR)
    try:
        with ThreadPoolExecutor(1) as pool:
            synced = pool.submit(os.fsync, fd)
            for a in range(0, flat.size, step):
                hasher.update(memoryview(flat[a:a + step]))
                meter.advance(min(step, flat.size - a))
            synced.result()
    finally:
        os.close(fd)
    return int(flat.size)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


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
    chunk_pages: int = DEFAULT_CHUNK_PAGES,
    tables: Sequence[Table | Mapping[str, Any]] | None = None,
    adopt: bool = False,
) -> Manifest:
    """Write ``pages.bin`` and ``manifest.json`` into ``out_dir`` and return the manifest.

    A directory that already holds a snapshot is refused unless ``overwrite``: servers may have
    it mapped, and a restarted replica would map the new data under the same epoch id.

    The data streams in 16 MiB pieces (bounded host memory at any size) and is hashed as it is
    written, chunk by chunk of ``chunk_pages`` pages (the manifest's chunk hashes and their
    root, the checksum), the hash running in a worker thread beside the write and the next
    piece's production. Both files go to temporary names first and are renamed into place,
    manifest last, after the old manifest is removed: a reader sees either no snapshot or a
    complete, consistent one, and readers that have the old file open keep their old epoch.

    ``num_pages``, when given, is checked against what the source produced (and sizes progress
    for a chunk stream). ``domain_bits`` defaults to the smallest domain covering the pages.
    ``tables``: the named tables (`Table`s or ``{"name", "first_page", "num_pages"}``), page
    ranges of the matrix written; checked against it before anything is written when the page
    count is known up front.

    ``adopt``: the source is a writable mapping of a whole file (`morphogen.storage.mapped.
    new_mapped`) that its maker hands over: where the file is on ``out_dir``'s file system,
    it becomes ``pages.bin`` itself (hashed where it lies while the disk syncs it, then
    renamed in) instead of being copied, a second pass over every byte of the matrix saved.
    The mapping still reads the snapshot's pages and must not be written again. Any other
    source is copied as without it.
    """
    staged = _adoptable(pages_source, Path(out_dir)) if adopt else None
    chunks, known_pages = _source_chunks(pages_source)
    if num_pages is not None and known_pages is not None and num_pages != known_pages:
        raise ValueError(f"num_pages={num_pages} but the source holds {known_pages} pages")
    expected_pages = known_pages if known_pages is not None else num_pages
    table_list = None if tables is None else list(tables)
    if table_list is not None and expected_pages is not None:
        try:
            parse_tables(table_list, expected_pages)
        except TableError as exc:
            raise SnapshotError(str(exc)) from None
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
    meter = Meter(progress, total, f"writing {data_path}")
    # in place, every core hashes (the one other thread waits on the disk); a copy leaves
    # one to the thread that writes
    hasher = ChunkHasher(chunk_pages, HASH_THREADS if staged is None else os.cpu_count() or 1)
    try:
        if staged is None:
            written = _copy(chunks, tmp_data, hasher, meter)
        else:
            written = _hash_in_place(pages_source, staged, hasher, meter)
            os.replace(staged, tmp_data)
        meter.finish()
        pages_written = written // PAGE_SIZE
        if pages_written == 0:
            raise SnapshotError("page source is empty: a snapshot needs at least one page")
        if expected_pages is not None and pages_written != expected_pages:
            raise SnapshotError(
                f"page source produced {pages_written} pages, expected {expected_pages}"
            )
        digests = tuple(hasher.finish())
        manifest = Manifest(
            format=FORMAT_VERSION,
            epoch_id=epoch_id,
            num_pages=pages_written,
            page_size=PAGE_SIZE,
            domain_bits=domain_bits if domain_bits is not None else domain_bits_for(pages_written),
            data_file=DATA_FILE,
            data_bytes=pages_written * PAGE_SIZE,
            checksum=checksum_str(root_hex(pages_written, chunk_pages, digests)),
            created=_now_iso(),
            source=source,
            chunk_pages=chunk_pages,
            chunk_hashes=digests,
            tables=None if table_list is None else tuple(table_list),  # type: ignore[arg-type]
        )
        tmp_manifest.write_text(manifest.to_json(), encoding="utf-8")
        with open(tmp_manifest, "rb") as fh:
            os.fsync(fh.fileno())
        # An old manifest must never be paired with the new data (or the reverse).
        manifest_path.unlink(missing_ok=True)
        os.replace(tmp_data, data_path)
        os.replace(tmp_manifest, manifest_path)
        fsync_dir(out)
    except BaseException:
        tmp_data.unlink(missing_ok=True)
        tmp_manifest.unlink(missing_ok=True)
        raise
    return manifest


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
    tables: Sequence[Table | Mapping[str, Any]] | None = None,
) -> Manifest:
    """Turn a raw page file (the reference's format) into a snapshot, zero-padding a ragged
    last page and checksumming as it copies; ``tables`` as for `write_snapshot`."""
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
        tables=tables,
    )
