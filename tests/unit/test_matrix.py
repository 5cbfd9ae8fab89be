"""Page matrix and snapshot files: round trips, sharding, refusals, synthetic pages."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import blake3
import numpy as np
import pytest

from morphogen.constants import PAGE_SIZE
from morphogen.snapshot import verified
from morphogen.snapshot.chunks import CHUNK_PAGES
from morphogen.snapshot.hashes import DEFAULT_CHUNK_PAGES, checksum_str, root_hex
from morphogen.snapshot.layout import domain_bits_for, shard_ranges
from morphogen.snapshot.manifest import FORMAT_VERSION, Manifest, SnapshotError
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages
from morphogen.snapshot.writer import import_raw, write_snapshot


def _pattern(num_pages: int) -> np.ndarray:
    i = np.arange(num_pages, dtype=np.int64)[:, None]
    j = np.arange(PAGE_SIZE, dtype=np.int64)[None, :]
    return ((31 * i + j) & 0xFF).astype(np.uint8)


def _checksum(data: bytes, chunk_pages: int = DEFAULT_CHUNK_PAGES) -> str:
    """The chunk-hash root written out from its definition: BLAKE3 of each chunk of pages, then
    of a tag, the page count, the chunk size and the digests."""
    step = chunk_pages * PAGE_SIZE
    root = blake3.blake3(b"morphogen-chunk-root-v1")
    root.update((len(data) // PAGE_SIZE).to_bytes(8, "little"))
    root.update(chunk_pages.to_bytes(8, "little"))
    for i in range(0, len(data), step):
        root.update(blake3.blake3(data[i : i + step]).digest())
    return "blake3-chunks:" + root.hexdigest()


def _mapping_base(arr: np.ndarray) -> np.ndarray:
    """The outermost ndarray of a view chain (the one that owns the mapping)."""
    base = arr
    while isinstance(base.base, np.ndarray):
        base = base.base
    return base


def _rewrite_manifest(snap_dir: Path, **changes: object) -> None:
    path = snap_dir / "manifest.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


# --------------------------------------------------------------------------- domain, shards


def test_domain_bits_for() -> None:
    assert domain_bits_for(1) == 1
    assert domain_bits_for(2) == 1
    assert domain_bits_for(3) == 2
    assert domain_bits_for(4) == 2
    assert domain_bits_for(5) == 3
    assert domain_bits_for(1 << 25) == 25
    assert domain_bits_for((1 << 25) + 1) == 26
    assert domain_bits_for(1 << 32) == 32
    for p in range(1, 3000):
        assert domain_bits_for(p) == max(1, math.ceil(math.log2(p)))
    with pytest.raises(ValueError):
        domain_bits_for(0)


@pytest.mark.parametrize("num_pages", [1, 2, 3, 7, 16, 100, 1023, 4097, 1 << 20])
def test_shard_ranges_balanced_and_covering(num_pages: int) -> None:
    for n in sorted({1, 2, 3, 4, 5, 7, 8, 16, 31, 64, num_pages}):
        if n > num_pages:
            continue
        ranges = shard_ranges(num_pages, n)
        assert len(ranges) == n
        assert ranges[0][0] == 0 and ranges[-1][1] == num_pages
        for (_, b), (c, _) in zip(ranges, ranges[1:], strict=False):
            assert b == c
        sizes = [b - a for a, b in ranges]
        assert min(sizes) >= 1
        assert max(sizes) - min(sizes) <= 1
        assert sum(sizes) == num_pages


def test_shard_ranges_refusals() -> None:
    assert shard_ranges(1, 1) == [(0, 1)]
    assert shard_ranges(10, 3) == [(0, 4), (4, 7), (7, 10)]
    with pytest.raises(ValueError, match="non-empty"):
        shard_ranges(3, 4)
    with pytest.raises(ValueError):
        shard_ranges(0, 1)
    with pytest.raises(ValueError):
        shard_ranges(5, 0)


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("num_pages", [1, 2, 5, 33])
@pytest.mark.parametrize("chunk_pages", [1, 4, DEFAULT_CHUNK_PAGES])
def test_round_trip_array(tmp_path: Path, num_pages: int, chunk_pages: int) -> None:
    data = _pattern(num_pages)
    m = write_snapshot(tmp_path / "snap", data, epoch_id=7, source="test",
                       chunk_pages=chunk_pages)
    assert m.num_pages == num_pages
    assert m.epoch_id == 7
    assert m.page_size == PAGE_SIZE
    assert m.domain_bits == domain_bits_for(num_pages)
    assert m.data_file == "pages.bin"
    assert m.data_bytes == num_pages * PAGE_SIZE
    assert m.checksum == _checksum(data.tobytes(), chunk_pages)
    assert m.chunk_pages == chunk_pages and len(m.chunk_hashes) == -(-num_pages // chunk_pages)
    assert m.source == "test"
    # The data file is the reference's raw format: the pages and nothing else.
    assert (tmp_path / "snap" / "pages.bin").read_bytes() == data.tobytes()
    assert sorted(p.name for p in (tmp_path / "snap").iterdir()) == ["manifest.json", "pages.bin"]

    for path in (tmp_path / "snap", tmp_path / "snap" / "manifest.json"):
        with Snapshot.open(path, verify=True) as snap:
            assert snap.manifest == m
            assert snap.num_pages == num_pages
            assert snap.epoch_id == 7
            assert snap.domain_bits == m.domain_bits
            assert len(snap) == num_pages
            whole = snap.pages()
            assert whole.shape == (num_pages, PAGE_SIZE) and whole.dtype == np.uint8
            assert np.array_equal(whole, data)
            assert not whole.flags.writeable
            for a, b in shard_ranges(num_pages, min(num_pages, 3)):
                assert np.array_equal(snap.pages(a, b), data[a:b])
            assert snap.pages(1, 1).shape == (0, PAGE_SIZE)
            assert snap.verify() == m.checksum == snap.fingerprint()
            for a, b in [(0, num_pages), (num_pages - 1, num_pages), (num_pages // 2, num_pages)]:
                got = snap.read_verified(a, b)
                assert np.array_equal(got, data[a:b]) and not got.flags.writeable
                assert got.base is None or not isinstance(got.base, np.memmap)  # private


@pytest.mark.parametrize("chunk_pages", [1, 7, 64])
def test_read_verified_any_range(tmp_path: Path, monkeypatch, chunk_pages: int) -> None:
    # several read steps per chunk, cut mid-chunk on either side or both
    monkeypatch.setattr(verified, "READ_STEP", 3 * PAGE_SIZE)
    data = _pattern(150)
    write_snapshot(tmp_path, data, epoch_id=1, source="t", chunk_pages=chunk_pages)
    rng = np.random.default_rng(chunk_pages)
    ranges = [(0, 150), (3, 5), (63, 65), (149, 150)]
    ranges += [tuple(sorted(rng.choice(151, 2, replace=False))) for _ in range(20)]
    with Snapshot.open(tmp_path) as snap:
        for a, b in ranges:
            assert np.array_equal(snap.read_verified(a, b), data[a:b]), (a, b)
        assert snap.read_verified(4, 4).shape == (0, PAGE_SIZE)
        assert snap.verify() == snap.manifest.checksum


def test_manifest_json_round_trip(tmp_path: Path) -> None:
    m = write_snapshot(tmp_path, _pattern(3), epoch_id=2, source="x")
    raw = json.loads((tmp_path / "manifest.json").read_text())
    assert raw["format"] == FORMAT_VERSION
    assert raw["checksum"].startswith("blake3-chunks:")
    assert raw["chunk_pages"] == DEFAULT_CHUNK_PAGES and len(raw["chunk_hashes"]) == 1
    assert Manifest.from_dict(raw) == m
    assert Manifest.load(tmp_path / "manifest.json") == m


def test_pages_range_checks(tmp_path: Path) -> None:
    write_snapshot(tmp_path, _pattern(4), epoch_id=1, source="t")
    snap = Snapshot.open(tmp_path)
    for start, stop in [(-1, 2), (0, 5), (3, 2)]:
        with pytest.raises(ValueError):
            snap.pages(start, stop)
    snap.close()
    with pytest.raises(SnapshotError, match="closed"):
        snap.pages()


def test_write_from_chunks_and_snapshot(tmp_path: Path) -> None:
    data = _pattern(9)
    flat = data.tobytes()
    chunks = [flat[:100], data[0:0], flat[100:5000], bytearray(flat[5000:])]
    # pieces of any size, cut across page and chunk boundaries, hash as the whole
    m1 = write_snapshot(tmp_path / "a", iter(chunks), epoch_id=1, source="chunks", num_pages=9,
                        chunk_pages=2)
    assert m1.checksum == _checksum(flat, 2)
    with Snapshot.open(tmp_path / "a") as snap:
        assert np.array_equal(snap.pages(), data)
        m2 = write_snapshot(tmp_path / "b", snap, epoch_id=2, source="copy", chunk_pages=2)
    assert m2.checksum == m1.checksum and m2.epoch_id == 2


def test_write_refusals(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="empty"):
        write_snapshot(tmp_path / "e", iter([]), epoch_id=1, source="t")
    with pytest.raises(SnapshotError, match="expected 3"):
        write_snapshot(
            tmp_path / "n", iter([bytes(PAGE_SIZE)]), epoch_id=1, source="t", num_pages=3
        )
    with pytest.raises(ValueError):
        write_snapshot(tmp_path / "s", np.zeros((2, 100), np.uint8), epoch_id=1, source="t")
    with pytest.raises(SnapshotError, match="domain_bits"):
        write_snapshot(tmp_path / "d", _pattern(5), epoch_id=1, source="t", domain_bits=2)
    # Nothing half-written is left behind, and no manifest appeared.
    for d in ("e", "n", "d"):
        assert list((tmp_path / d).iterdir()) == []


def test_rewrite_replaces_atomically_and_keeps_old_mapping(tmp_path: Path) -> None:
    old = _pattern(4)
    write_snapshot(tmp_path, old, epoch_id=1, source="t")
    snap_old = Snapshot.open(tmp_path)
    view_old = snap_old.pages()
    new = 255 - _pattern(6)
    with pytest.raises(SnapshotError, match="already holds a snapshot"):
        write_snapshot(tmp_path, new, epoch_id=2, source="t")  # only when asked
    assert np.array_equal(Snapshot.open(tmp_path).pages(), old)
    m = write_snapshot(tmp_path, new, epoch_id=2, source="t", overwrite=True)
    # The old mapping pins the old file: epoch 1 keeps serving epoch 1's bytes.
    assert np.array_equal(view_old, old)
    with Snapshot.open(tmp_path, verify=True) as snap_new:
        assert snap_new.epoch_id == 2 and snap_new.manifest == m
        assert np.array_equal(snap_new.pages(), new)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "pages.bin"]


def test_data_replaced_under_its_manifest_is_refused_when_read(tmp_path: Path) -> None:
    write_snapshot(tmp_path / "a", _pattern(300), epoch_id=1, source="t", chunk_pages=100)
    write_snapshot(tmp_path / "b", 255 - _pattern(300), epoch_id=1, source="t", chunk_pages=100)
    os.replace(tmp_path / "b" / "pages.bin", tmp_path / "a" / "pages.bin")
    # opening reads no data; serving a range does, and names the file and the first bad chunk
    with Snapshot.open(tmp_path / "a") as snap:
        with pytest.raises(SnapshotError, match=r"a/pages\.bin: checksum mismatch in chunk 1 "):
            snap.read_verified(150, 160)


def test_format_1_manifest_is_read_as_derived(tmp_path: Path, caplog) -> None:
    data = _pattern(300)
    write_snapshot(tmp_path, data, epoch_id=6, source="t")
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    for field in ("chunk_pages", "chunk_hashes"):
        del manifest[field]
    manifest.update(format=1, checksum="blake2b-256:" + "0" * 64, sample="0" * 32)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with Snapshot.open(tmp_path) as snap:
        # its epoch and shape stay, its checksum (which named a file, not bytes) goes, and the
        # chunk hashes come from the bytes: an admin rotation refuses it until it is rebuilt
        assert (snap.epoch_id, snap.num_pages, snap.manifest.format) == (6, 300, FORMAT_VERSION)
        assert snap.manifest.checksum is None
        assert snap.fingerprint() == _checksum(data.tobytes())
        assert np.array_equal(snap.read_verified(), data)
    assert "format 1 manifest has no chunk hashes" in caplog.text


def test_raw_file_fingerprint_names_its_data(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(_pattern(5).tobytes())
    (tmp_path / "y.bin").write_bytes((255 - _pattern(5)).tobytes())
    with Snapshot.open(tmp_path / "x.bin") as x, Snapshot.open(tmp_path / "y.bin") as y:
        assert x.fingerprint() == _checksum(_pattern(5).tobytes())
        assert x.fingerprint() != y.fingerprint()


def test_progress_callback_and_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[int, int | None]] = []
    build_synthetic(
        tmp_path / "a", 40, seed=1, progress=lambda done, total: calls.append((done, total))
    )
    assert calls and calls[-1] == (40 * PAGE_SIZE, 40 * PAGE_SIZE)
    assert all(b >= a for (a, _), (b, _) in zip(calls, calls[1:], strict=False))
    build_synthetic(tmp_path / "b", 40, seed=1, progress=True)
    err = capsys.readouterr().err
    assert "MB/s" in err and "pages.bin" in err


# --------------------------------------------------------------------------- refusals


def _good_snapshot(tmp_path: Path, num_pages: int = 5) -> Path:
    snap_dir = tmp_path / "snap"
    write_snapshot(snap_dir, _pattern(num_pages), epoch_id=3, source="t")
    return snap_dir


def test_truncated_data_file_refused(tmp_path: Path) -> None:
    snap_dir = _good_snapshot(tmp_path)
    with open(snap_dir / "pages.bin", "r+b") as fh:
        fh.truncate(4 * PAGE_SIZE + 10)
    with pytest.raises(SnapshotError, match="truncated"):
        Snapshot.open(snap_dir)


def test_oversized_data_file_refused(tmp_path: Path) -> None:
    snap_dir = _good_snapshot(tmp_path)
    with open(snap_dir / "pages.bin", "ab") as fh:
        fh.write(bytes(PAGE_SIZE))
    with pytest.raises(SnapshotError, match="manifest says"):
        Snapshot.open(snap_dir)


def test_missing_data_file_refused(tmp_path: Path) -> None:
    snap_dir = _good_snapshot(tmp_path)
    (snap_dir / "pages.bin").unlink()
    with pytest.raises(SnapshotError, match="missing"):
        Snapshot.open(snap_dir)


def test_missing_manifest_and_path_refused(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="no manifest.json"):
        Snapshot.open(tmp_path)
    with pytest.raises(SnapshotError, match="no such snapshot"):
        Snapshot.open(tmp_path / "nothing")
    with pytest.raises(SnapshotError, match="not found"):
        Snapshot.open(tmp_path / "nothing.json")


def test_bad_json_refused(tmp_path: Path) -> None:
    snap_dir = _good_snapshot(tmp_path)
    (snap_dir / "manifest.json").write_text("{not json")
    with pytest.raises(SnapshotError, match="not valid JSON"):
        Snapshot.open(snap_dir)
    (snap_dir / "manifest.json").write_text("[1, 2]")
    with pytest.raises(SnapshotError, match="JSON object"):
        Snapshot.open(snap_dir)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"page_size": 8192}, "page_size is 8192"),
        ({"format": 99}, "unknown snapshot format"),
        ({"domain_bits": 2}, "too small"),
        ({"domain_bits": 33}, "exceeds"),
        ({"num_pages": 4}, "data_bytes"),
        ({"num_pages": True}, "must be an integer"),
        ({"epoch_id": "3"}, "must be an integer"),
        ({"epoch_id": -1}, "u64"),
        ({"checksum": "md5:00"}, "checksum"),
        ({"checksum": "blake3-chunks:" + "0" * 64}, "not the root of chunk_hashes"),
        ({"chunk_hashes": ["0" * 64]}, "not the root of chunk_hashes"),
        ({"chunk_hashes": []}, "need 1"),
        ({"chunk_hashes": ["zz"]}, "64 lowercase hex"),
        ({"chunk_hashes": None}, "must be a list"),
        ({"chunk_pages": 0}, "chunk_pages"),
        ({"chunk_pages": 1}, "need 5"),
        ({"data_file": "../pages.bin"}, "plain file name"),
        ({"data_file": "/etc/passwd"}, "plain file name"),
    ],
)
def test_mismatched_manifest_refused(tmp_path: Path, changes: dict, message: str) -> None:
    snap_dir = _good_snapshot(tmp_path)
    _rewrite_manifest(snap_dir, **changes)
    with pytest.raises(SnapshotError, match=message):
        Snapshot.open(snap_dir)


def test_missing_field_refused(tmp_path: Path) -> None:
    snap_dir = _good_snapshot(tmp_path)
    data = json.loads((snap_dir / "manifest.json").read_text())
    del data["epoch_id"]
    (snap_dir / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(SnapshotError, match="missing field 'epoch_id'"):
        Snapshot.open(snap_dir)


def test_larger_domain_accepted(tmp_path: Path) -> None:
    snap_dir = _good_snapshot(tmp_path)  # 5 pages need 3 bits
    _rewrite_manifest(snap_dir, domain_bits=25)
    with Snapshot.open(snap_dir, verify=True) as snap:
        assert snap.domain_bits == 25
    m = write_snapshot(tmp_path / "w", _pattern(5), epoch_id=1, source="t", domain_bits=32)
    assert m.domain_bits == 32


def test_checksum_mismatch_refused_on_verify(tmp_path: Path) -> None:
    snap_dir = _good_snapshot(tmp_path, 200)
    with open(snap_dir / "pages.bin", "r+b") as fh:
        fh.seek(7 * PAGE_SIZE + 17)
        fh.write(b"\x99")
    # Opening without verify does not read the data; verify does and says what is wrong.
    Snapshot.open(snap_dir).close()
    with pytest.raises(SnapshotError, match="checksum mismatch"):
        Snapshot.open(snap_dir, verify=True)
    with Snapshot.open(snap_dir) as snap, pytest.raises(SnapshotError, match="checksum mismatch"):
        snap.verify()


# --------------------------------------------------------------------------- bare raw files


def test_bare_raw_whole_pages(tmp_path: Path) -> None:
    data = _pattern(6)
    raw = tmp_path / "matrix.bin"
    raw.write_bytes(data.tobytes())
    with Snapshot.open(raw) as snap:
        m = snap.manifest
        assert (m.epoch_id, m.num_pages, m.domain_bits, m.data_bytes) == (0, 6, 3, 6 * PAGE_SIZE)
        assert m.checksum is None and m.source == "raw:matrix.bin"
        assert isinstance(snap.pages(0, 6), np.memmap)
        assert np.array_equal(snap.pages(), data)
        assert snap.verify() == _checksum(data.tobytes()) == snap.fingerprint()


@pytest.mark.parametrize("ragged", [1, 100, PAGE_SIZE - 1])
@pytest.mark.parametrize("full_pages", [0, 1, 4])
def test_bare_raw_ragged_tail_zero_padded(tmp_path: Path, full_pages: int, ragged: int) -> None:
    rng = np.random.default_rng(full_pages * 10_000 + ragged)
    body = rng.integers(0, 256, full_pages * PAGE_SIZE + ragged, dtype=np.uint8).tobytes()
    raw = tmp_path / "ragged.bin"
    raw.write_bytes(body)
    padded = np.frombuffer(body + bytes(PAGE_SIZE - ragged), np.uint8).reshape(-1, PAGE_SIZE)
    num_pages = full_pages + 1
    with Snapshot.open(raw, verify=True) as snap:
        assert snap.num_pages == num_pages
        assert snap.manifest.data_bytes == len(body)
        assert snap.domain_bits == domain_bits_for(num_pages)
        for a in range(num_pages + 1):
            for b in range(a, num_pages + 1):
                got = snap.pages(a, b)
                assert got.shape == (b - a, PAGE_SIZE)
                assert np.array_equal(got, padded[a:b])
                assert not got.flags.writeable
        if full_pages:
            # A range before the tail is still a view of the mapping, not a copy.
            assert isinstance(snap.pages(0, full_pages), np.memmap)
        assert snap.verify() == _checksum(padded.tobytes())
        assert np.array_equal(snap.read_verified(), padded)


def test_bare_raw_refusals(tmp_path: Path) -> None:
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(SnapshotError, match="empty"):
        Snapshot.open(empty)


def test_import_raw(tmp_path: Path) -> None:
    body = _pattern(3).tobytes() + b"\x07" * 123
    raw = tmp_path / "ref.bin"
    raw.write_bytes(body)
    m = import_raw(raw, tmp_path / "snap", epoch_id=4, progress=False)
    padded = body + bytes(PAGE_SIZE - 123)
    assert (m.num_pages, m.epoch_id, m.source) == (4, 4, "raw:ref.bin")
    assert m.checksum == _checksum(padded)
    assert (tmp_path / "snap" / "pages.bin").read_bytes() == padded
    with Snapshot.open(tmp_path / "snap", verify=True) as snap, Snapshot.open(raw) as bare:
        assert np.array_equal(snap.pages(), bare.pages())
        assert bare.verify() == m.checksum
    with pytest.raises(SnapshotError, match="not found"):
        import_raw(tmp_path / "nope.bin", tmp_path / "x", progress=False)


# --------------------------------------------------------------------------- lazy reads


def test_pages_is_a_view_at_the_right_offset(tmp_path: Path) -> None:
    write_snapshot(tmp_path, _pattern(64), epoch_id=1, source="t")
    with Snapshot.open(tmp_path) as snap:
        whole = snap.pages()
        base = _mapping_base(whole)
        part = snap.pages(10, 20)
        assert isinstance(part, np.memmap)
        assert _mapping_base(part) is base
        assert not part.flags.owndata
        offset = part.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        assert offset == 10 * PAGE_SIZE


def test_reading_one_range_of_a_huge_sparse_file(tmp_path: Path) -> None:
    # A 64 GiB sparse file: reading it would take minutes and the disk does not hold it,
    # so a range read that finishes at once touched only that range.
    num_pages = 1 << 24
    snap_dir = tmp_path / "huge"
    snap_dir.mkdir()
    data_path = snap_dir / "pages.bin"
    with open(data_path, "wb") as fh:
        fh.truncate(num_pages * PAGE_SIZE)
        fh.seek(12_345_678 * PAGE_SIZE)
        fh.write(_pattern(3).tobytes())
    chunks = ("0" * 64,) * (num_pages // DEFAULT_CHUNK_PAGES)  # never read here
    m = Manifest(
        format=FORMAT_VERSION,
        epoch_id=9,
        num_pages=num_pages,
        page_size=PAGE_SIZE,
        domain_bits=24,
        data_file="pages.bin",
        data_bytes=num_pages * PAGE_SIZE,
        checksum=checksum_str(root_hex(num_pages, DEFAULT_CHUNK_PAGES, chunks)),
        created="2024-01-01T00:00:00+00:00",
        source="t",
        chunk_hashes=chunks,
    )
    (snap_dir / "manifest.json").write_text(m.to_json())
    t0 = time.perf_counter()
    with Snapshot.open(snap_dir) as snap:
        a, b = shard_ranges(num_pages, 1359)[1000]
        assert a <= 12_345_678 < b - 3
        got = snap.pages(a, b)
        assert np.array_equal(got[12_345_678 - a : 12_345_678 - a + 3], _pattern(3))
        assert not got[: 12_345_678 - a].any()
    assert time.perf_counter() - t0 < 5.0
    assert os.stat(data_path).st_blocks * 512 < 1 << 30  # still sparse: nothing was written


# --------------------------------------------------------------------------- synthetic


def test_synthetic_deterministic_across_cuts() -> None:
    whole = synthetic_pages(5, 0, 700)
    assert whole.shape == (700, PAGE_SIZE) and whole.dtype == np.uint8
    assert np.array_equal(whole, synthetic_pages(5, 0, 700))
    for a, b in [(0, 1), (1, 2), (255, 257), (300, 700), (699, 700), (123, 456)]:
        assert np.array_equal(synthetic_pages(5, a, b), whole[a:b])
    far = synthetic_pages(5, 10**9, 10**9 + 2)
    assert np.array_equal(far, synthetic_pages(5, 10**9, 10**9 + 2))
    assert np.array_equal(synthetic_pages(5, 10**9 + 1, 10**9 + 2), far[1:])
    assert synthetic_pages(5, 3, 3).shape == (0, PAGE_SIZE)
    assert not np.array_equal(synthetic_pages(6, 0, 1), whole[:1])
    # Pages differ from one another and look uniform.
    assert len({bytes(p) for p in whole}) == 700
    assert abs(float(whole.mean()) - 127.5) < 1.0


def test_synthetic_pinned_bytes() -> None:
    # Pin the stream so a change of generator cannot silently change demo and bench matrices.
    words = np.random.PCG64(np.random.SeedSequence(0)).random_raw(4)
    assert synthetic_pages(0, 0, 1)[0, :32].tobytes() == words.astype("<u8").tobytes()


def test_synthetic_refusals() -> None:
    with pytest.raises(ValueError):
        synthetic_pages(-1, 0, 1)
    with pytest.raises(ValueError):
        synthetic_pages(0, 5, 4)


def test_build_synthetic(tmp_path: Path) -> None:
    # Spans several write chunks and ends inside one.
    num_pages = 2 * CHUNK_PAGES + 77
    m = build_synthetic(tmp_path, num_pages, seed=11, epoch_id=5, progress=False)
    assert (m.num_pages, m.epoch_id, m.source) == (num_pages, 5, "synthetic:11")
    assert m.domain_bits == domain_bits_for(num_pages)
    with Snapshot.open(tmp_path, verify=True) as snap:
        for a, b in shard_ranges(num_pages, 3):
            assert np.array_equal(snap.pages(a, b), synthetic_pages(11, a, b))
