"""`write_snapshot(adopt=True)`: pages placed in a mapped file become the snapshot's pages,
hashed where they lie and renamed in, with the same bytes and manifest a copy would have."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from morphogen.constants import PAGE_SIZE
from morphogen.snapshot.manifest import DATA_FILE, SnapshotError
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.writer import write_snapshot
from morphogen.storage.mapped import new_mapped

PAGES = 41  # three chunks of 16 pages, the last one short
CHUNK = 16


def _staged(path: Path, seed: int = 3) -> np.ndarray:
    pages = new_mapped(path, np.uint8, (PAGES, PAGE_SIZE))
    pages[:] = np.random.default_rng(seed).integers(0, 256, pages.shape, dtype=np.uint8)
    return pages


def _write(out: Path, pages: np.ndarray, **kw):
    return write_snapshot(out, pages, epoch_id=7, source="test", chunk_pages=CHUNK,
                          tables=[{"name": "t", "first_page": 1, "num_pages": 30}], **kw)


def test_an_adopted_file_becomes_the_snapshots_pages_with_the_manifest_a_copy_has(
        tmp_path: Path) -> None:
    staged = tmp_path / "work" / "pages.staged"
    staged.parent.mkdir()
    pages = _staged(staged)
    inode = staged.stat().st_ino
    copied = _write(tmp_path / "copied", np.array(pages))
    adopted = _write(tmp_path / "adopted", pages, adopt=True)
    assert adopted.chunk_hashes == copied.chunk_hashes and len(adopted.chunk_hashes) == 3
    assert adopted.checksum == copied.checksum and adopted.tables == copied.tables
    data = tmp_path / "adopted" / DATA_FILE
    assert data.read_bytes() == (tmp_path / "copied" / DATA_FILE).read_bytes()
    # the file itself was moved in, not copied: it is gone from where it was placed
    assert data.stat().st_ino == inode and not staged.exists()
    assert sorted(p.name for p in data.parent.iterdir()) == sorted([DATA_FILE, "manifest.json"])
    with Snapshot.open(tmp_path / "adopted") as snap:
        assert np.array_equal(np.asarray(snap.read_verified()), np.array(pages))
    # the maker's mapping still reads the snapshot's pages
    assert np.asarray(pages).tobytes() == data.read_bytes()

def test_what_cannot_be_renamed_in_is_copied_and_left_to_its_maker(tmp_path: Path) -> None:
    # a slice of a mapping (not its whole file), and memory: both copied
    staged = tmp_path / "pages.staged"
    pages = _staged(staged)
    for i, source in enumerate((pages[1:], np.array(pages))):
        manifest = _write(tmp_path / f"s{i}", source, adopt=True) if i else write_snapshot(
            tmp_path / f"s{i}", source, epoch_id=7, source="test", chunk_pages=CHUNK,
            adopt=True)
        assert (tmp_path / f"s{i}" / DATA_FILE).read_bytes() == np.asarray(source).tobytes()
        assert manifest.num_pages == len(source)
        assert staged.stat().st_size == PAGES * PAGE_SIZE  # still the maker's, unchanged
    assert staged.read_bytes() == np.asarray(pages).tobytes()


def test_a_file_on_another_file_system_is_copied_and_left_in_place(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or \
            shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second file system to place the pages on")
    staged = shm / f"morphogen-test-{os.getpid()}.staged"
    try:
        pages = _staged(staged)
        manifest = _write(tmp_path / "snap", pages, adopt=True)
        assert staged.exists() and staged.read_bytes() == np.asarray(pages).tobytes()
        assert (tmp_path / "snap" / DATA_FILE).read_bytes() == staged.read_bytes()
        assert manifest.num_pages == PAGES
    finally:
        staged.unlink(missing_ok=True)


def test_a_directory_holding_a_snapshot_refuses_the_file_and_leaves_it(tmp_path: Path) -> None:
    staged = tmp_path / "pages.staged"
    pages = _staged(staged)
    first = _write(tmp_path / "snap", np.array(pages))
    with pytest.raises(SnapshotError, match="already holds a snapshot"):
        _write(tmp_path / "snap", pages, adopt=True)
    assert staged.read_bytes() == np.asarray(pages).tobytes()
    with Snapshot.open(tmp_path / "snap") as snap:
        assert snap.manifest.checksum == first.checksum
