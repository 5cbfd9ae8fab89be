"""The identity a shard reports names the bytes it scans, not a file name or a manifest field.

Each case differs from the party's data in one page in the middle of the file, the kind of
difference a check of a few sampled pages misses.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from morphogen import engine
from morphogen.constants import PAGE_SIZE
from morphogen.party.epoch import ShardState
from morphogen.party.shard import ShardCore
from morphogen.protocol import dpf
from morphogen.protocol.identity import EpochIdentity
from morphogen.snapshot.layout import domain_bits_for
from morphogen.snapshot.manifest import SnapshotError
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages

NUM_PAGES = 300
ODD_PAGE = 7


def _one_page_changed(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.seek(ODD_PAGE * PAGE_SIZE + 123)
        byte = fh.read(1)
        fh.seek(ODD_PAGE * PAGE_SIZE + 123)
        fh.write(bytes([byte[0] ^ 0x5A]))


def _answer(core: ShardCore, page: int) -> tuple[EpochIdentity, bytes]:
    """The page as one party's shard and the other's key share XOR back together."""
    k0, k1 = dpf.generate_keys(domain_bits_for(NUM_PAGES), page)
    e0, a0 = core.scan(dpf.KeyBatch.from_keys([k0]))
    e1, a1 = core.scan(dpf.KeyBatch.from_keys([k1]))
    assert e0 == e1
    return e0, (a0 ^ a1).tobytes()


def test_two_raw_files_one_page_apart_have_two_identities(tmp_path: Path) -> None:
    # party A serves a bare pages.bin, party B a copy one page apart
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(synthetic_pages(3, 0, NUM_PAGES).tobytes())
    shutil.copyfile(a, b)
    _one_page_changed(b)
    with Snapshot.open(a) as snap_a, Snapshot.open(b) as snap_b:
        assert snap_a.fingerprint() != snap_b.fingerprint()
        ca = ShardCore.open(snap_a, 0, 1, "cpu")
        cb = ShardCore.open(snap_b, 0, 1, "cpu")
        try:
            # same epoch id (0), other bytes: the router and the client see two names
            assert ca.epoch_id == cb.epoch_id
            assert ca.identity.digest != cb.identity.digest
        finally:
            ca.close()
            cb.close()


def test_data_file_renamed_under_its_manifest_then_a_replica_restarts(tmp_path: Path) -> None:
    snap_dir = tmp_path / "snap"
    build_synthetic(snap_dir, NUM_PAGES, seed=3, epoch_id=1, progress=False)
    running = ShardCore.open(Snapshot.open(snap_dir), 0, 1, "cpu")
    newer = tmp_path / "newer.bin"
    shutil.copyfile(snap_dir / "pages.bin", newer)
    _one_page_changed(newer)
    os.replace(newer, snap_dir / "pages.bin")
    # the replica that starts now would map other bytes under the party's identity: it refuses
    restarted = Snapshot.open(snap_dir)
    with pytest.raises(SnapshotError, match=r"pages\.bin: checksum mismatch in chunk 0"):
        ShardCore.open(restarted, 0, 1, "cpu")
    restarted.close()
    # the running replica keeps its file and its bytes
    identity, page = _answer(running, ODD_PAGE)
    assert page == synthetic_pages(3, ODD_PAGE, ODD_PAGE + 1).tobytes()
    running.close()


def test_data_file_overwritten_in_place_changes_no_answer(tmp_path: Path) -> None:
    snap_dir = tmp_path / "snap"
    build_synthetic(snap_dir, NUM_PAGES, seed=3, epoch_id=1, progress=False)
    core = ShardCore.open(Snapshot.open(snap_dir), 0, 1, "cpu")
    before = _answer(core, ODD_PAGE)
    _one_page_changed(snap_dir / "pages.bin")  # same inode: a mapping would see it
    after = _answer(core, ODD_PAGE)
    assert after == before
    assert after[1] == synthetic_pages(3, ODD_PAGE, ODD_PAGE + 1).tobytes()
    core.close()


def test_ranges_check_every_chunk_they_overlap_and_only_those(tmp_path: Path) -> None:
    # chunks of 64 pages; a range starting and ending mid-chunk hashes the whole chunks it
    # overlaps, so a change outside the range but inside such a chunk is seen...
    snap_dir = tmp_path / "snap"
    build_synthetic(snap_dir, NUM_PAGES, seed=3, epoch_id=1, progress=False, chunk_pages=64)
    _one_page_changed(snap_dir / "pages.bin")  # page 7: chunk 0
    with Snapshot.open(snap_dir) as snap:
        with pytest.raises(SnapshotError, match=r"chunk 0 \(pages 0\.\.63\)"):
            snap.read_verified(10, 100)
        # ...and a range clear of it is served, the bytes those of the verified chunks
        got = snap.read_verified(64, 200)
        assert np.array_equal(got, synthetic_pages(3, 64, 200))
        assert not got.flags.writeable
        with pytest.raises(SnapshotError, match="checksum mismatch in chunk 0"):
            snap.verify()


def test_the_engine_is_handed_the_checked_private_copy(tmp_path: Path) -> None:
    loaded: list[np.ndarray] = []
    reference = engine.create("reference")

    class Recording:
        name = "recording"

        def load(self, pages: np.ndarray, first_page: int = 0):
            loaded.append(pages)
            return reference.load(pages, first_page)

    build_synthetic(tmp_path, NUM_PAGES, seed=3, epoch_id=1, progress=False, chunk_pages=64)
    with Snapshot.open(tmp_path) as snap:
        state = ShardState(Recording(), snap, 10, 100)
        (pages,) = loaded
        assert not isinstance(pages, np.memmap) and not pages.flags.writeable
        assert not np.shares_memory(pages, snap.pages())
        assert np.array_equal(pages, synthetic_pages(3, 10, 100))
        assert state.identity.snapshot_checksum == snap.manifest.checksum
        state.close()
