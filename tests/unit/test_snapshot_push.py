"""`morphogen snapshot push` and `morphogen build --out s3://...`, through the command line's
`main` against a real S3 protocol server on loopback: what lands reads back byte-equal as a
remote snapshot; the manifest goes last, so a push that fails midway leaves none and a re-run
completes it; a re-run after success changes nothing; another snapshot at the target, a
corrupted local chunk or a chunk changed during the upload is refused with nothing published."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import obstore
import pytest

from cluster.cli import main
from morphogen.snapshot import upload
from morphogen.snapshot.open import open_any
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages
from morphogen.storage import open_location

# 3000 pages (11.7 MiB) in chunks of 512: 6 chunks, the last one short, uploaded as 3 parts
PAGES, CHUNK = 3000, 512
PART = 5 << 20  # S3's smallest part: the test's object is several of them


@pytest.fixture(autouse=True)
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upload, "MIN_PART_BYTES", PART)
    monkeypatch.setattr(upload, "PIECE_BYTES", 1 << 20)


@pytest.fixture
def local(tmp_path: Path) -> Path:
    out = tmp_path / "snap"
    build_synthetic(out, PAGES, seed=11, epoch_id=7, chunk_pages=CHUNK, progress=False)
    return out


def _keys(uri: str) -> list[str]:
    loc = open_location(uri)
    return sorted(o["path"] for batch in obstore.list(loc.store, prefix=loc.prefix)
                  for o in batch)


def _objects(uri: str) -> dict[str, tuple[bytes, str]]:
    loc = open_location(uri)
    return {k: (bytes(obstore.get(loc.store, k).bytes()), obstore.head(loc.store, k)["e_tag"])
            for k in _keys(uri)}


def _one_error_line(err: str) -> str:
    """The one error line among the progress lines (`LABEL: 0.01 / 0.01 GiB ...`)."""
    lines = err.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and all(" GiB" in ln for ln in lines if ln not in errors), err
    assert "Traceback" not in err and "Debug source" not in err
    return errors[0]


def _reads_back(uri: str, cache: Path, pages: np.ndarray, epoch: int) -> None:
    with open_any(uri, cache_dir=cache) as snap:
        assert (snap.num_pages, snap.epoch_id) == (len(pages), epoch)
        assert np.array_equal(snap.read_verified(0, len(pages)), pages)


def test_a_pushed_snapshot_reads_back_byte_equal(local: Path, s3_bucket: str, tmp_path: Path,
                                                 capsys) -> None:
    uri = f"s3://{s3_bucket}/snapshots/epoch-7"
    assert main(["snapshot", "push", str(local), uri]) == 0
    out, err = capsys.readouterr()
    root = Snapshot.open(local).manifest.root
    assert out.strip() == (f"snapshot {uri}: {PAGES} pages, domain 12 bits, epoch 7, {root}")
    assert f"uploading {uri}/pages.bin" in err and "verify " in err  # progress on stderr
    assert _keys(uri) == ["snapshots/epoch-7/manifest.json", "snapshots/epoch-7/pages.bin"]
    loc = open_location(uri)
    # what was uploaded is the local manifest, byte for byte, and the data went in parts
    assert bytes(obstore.get(loc.store, loc.key("manifest.json")).bytes()) == (
        local / "manifest.json").read_bytes()
    assert obstore.head(loc.store, loc.key("pages.bin"))["e_tag"].endswith('-3"')
    _reads_back(uri, tmp_path / "cache", synthetic_pages(11, 0, PAGES), 7)


def test_build_out_s3_builds_pushes_and_removes_its_copy(s3_bucket: str, tmp_path: Path,
                                                         capsys) -> None:
    uri = f"s3://{s3_bucket}/snapshots/epoch-3"
    work = tmp_path / "work"
    assert main(["build", "--synthetic", str(PAGES), "--seed", "5", "--epoch", "3",
                 "--out", uri, "--work-dir", str(work)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"snapshot {uri}: {PAGES} pages") and "epoch 3" in out
    assert list(work.iterdir()) == []  # the temporary build is gone
    _reads_back(uri, tmp_path / "cache", synthetic_pages(5, 0, PAGES), 3)


def test_build_out_s3_keeps_its_build_when_the_push_fails(s3_bucket: str, tmp_path: Path,
                                                          monkeypatch, capsys) -> None:
    uri = f"s3://{s3_bucket}/epoch-1"
    work = tmp_path / "work"
    real = upload._verified_pieces

    def store_down(*_a, **_k):
        raise ConnectionResetError("connection reset by peer")
        yield b""

    monkeypatch.setattr(upload, "_verified_pieces", store_down)
    assert main(["build", "--synthetic", "64", "--out", uri, "--work-dir", str(work)]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert f"{uri}/pages.bin: upload failed" in line and "connection reset" in line
    kept = next(work.iterdir()) / "snapshot"
    assert f"kept in {kept}" in line
    monkeypatch.setattr(upload, "_verified_pieces", real)
    assert main(["snapshot", "push", str(kept), uri]) == 0
    assert Snapshot.open(kept).manifest.root in capsys.readouterr().out


def test_a_missing_bucket_is_named_before_anything_is_built(tmp_path: Path, s3_env,
                                                             capsys) -> None:
    uri = "s3://no-such-bucket-for-push/epoch-1"
    work = tmp_path / "work"
    assert main(["build", "--synthetic", "64", "--out", uri, "--work-dir", str(work)]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {uri}: cannot push there") and "NoSuchBucket" in line
    assert not work.exists() or list(work.iterdir()) == []


def test_a_rerun_uploads_nothing_and_succeeds(local: Path, s3_bucket: str, monkeypatch,
                                              capsys) -> None:
    uri = f"s3://{s3_bucket}/epoch-7"
    assert main(["snapshot", "push", str(local), uri]) == 0
    before = _objects(uri)
    capsys.readouterr()

    def no_upload(*_a, **_k) -> None:
        raise AssertionError("a re-run uploaded again")

    monkeypatch.setattr(upload, "_upload_data", no_upload)
    monkeypatch.setattr(upload, "_create_manifest", no_upload)
    assert main(["snapshot", "push", str(local) + "/", uri + "/"]) == 0
    out, err = capsys.readouterr()
    assert f"snapshot {uri}:" in out and "already holds this snapshot" in err
    assert _objects(uri) == before


def test_another_snapshot_at_the_target_is_refused_and_left_as_it_is(
        local: Path, s3_bucket: str, tmp_path: Path, capsys) -> None:
    uri = f"s3://{s3_bucket}/epoch-7"
    assert main(["snapshot", "push", str(local), uri]) == 0
    before = _objects(uri)
    other = tmp_path / "other"
    build_synthetic(other, PAGES, seed=12, epoch_id=7, chunk_pages=CHUNK, progress=False)
    capsys.readouterr()
    assert main(["snapshot", "push", str(other), uri]) == 2
    line = _one_error_line(capsys.readouterr().err)
    ours, theirs = (Snapshot.open(p).manifest.root for p in (other, local))
    assert f"{uri} already holds another snapshot" in line
    assert ours in line and theirs in line and "nothing was uploaded" in line
    assert _objects(uri) == before
    # the same bytes under another epoch are another snapshot too
    build_synthetic(tmp_path / "later", PAGES, seed=11, epoch_id=8, chunk_pages=CHUNK,
                    progress=False)
    assert main(["snapshot", "push", str(tmp_path / "later"), uri]) == 2
    assert _objects(uri) == before


def test_a_manifest_another_push_created_meanwhile_is_not_overwritten(
        local: Path, s3_bucket: str, tmp_path: Path, monkeypatch, capsys) -> None:
    uri = f"s3://{s3_bucket}/epoch-7"
    other = tmp_path / "other"
    build_synthetic(other, 8, seed=1, epoch_id=7, progress=False)
    theirs = (other / "manifest.json").read_bytes()
    real = upload._upload_data

    def racing(loc, *args) -> None:
        real(loc, *args)
        # another push finished between this one's check of the target and its manifest
        obstore.put(loc.store, loc.key("manifest.json"), theirs)

    monkeypatch.setattr(upload, "_upload_data", racing)
    assert main(["snapshot", "push", str(local), uri]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "already holds another snapshot" in line and "another push" in line
    loc = open_location(uri)
    assert bytes(obstore.get(loc.store, loc.key("manifest.json")).bytes()) == theirs


def test_a_corrupted_chunk_refuses_the_push_before_any_upload(local: Path, s3_bucket: str,
                                                              monkeypatch, capsys) -> None:
    uri = f"s3://{s3_bucket}/epoch-7"
    started = []
    real = upload._upload_data
    monkeypatch.setattr(upload, "_upload_data", lambda *a: started.append(a) or real(*a))
    with open(local / "pages.bin", "r+b") as fh:
        fh.seek(2 * CHUNK * 4096 + 99)  # chunk 2
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 1]))
    assert main(["snapshot", "push", str(local), uri]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "checksum mismatch in chunk 2" in line
    assert started == [] and _keys(uri) == []


def test_a_chunk_changed_after_its_check_is_not_published(local: Path, s3_bucket: str,
                                                          monkeypatch, capsys) -> None:
    uri = f"s3://{s3_bucket}/epoch-7"
    verified_open = Snapshot.open

    def open_then_change(*args, **kwargs) -> Snapshot:
        snap = verified_open(*args, **kwargs)
        with open(local / "pages.bin", "r+b") as fh:  # after the check, before the upload
            fh.seek(5 * CHUNK * 4096 + 1)
            fh.write(b"\xff\x00\xff")
        return snap

    monkeypatch.setattr(upload.Snapshot, "open", open_then_change)
    assert main(["snapshot", "push", str(local), uri]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "chunk 5" in line and "changed since it was verified" in line
    assert "snapshots/epoch-7/manifest.json" not in _keys(uri) and _keys(uri) == []


def test_an_interrupted_push_leaves_no_manifest_and_a_rerun_completes_it(
        local: Path, s3_bucket: str, tmp_path: Path, monkeypatch, capsys) -> None:
    uri = f"s3://{s3_bucket}/epoch-7"
    real = upload._verified_pieces

    def cut_midway(*args, **kwargs):
        for n, piece in enumerate(real(*args, **kwargs)):
            if n == 7:  # past the first part: a multipart upload under way
                raise ConnectionResetError("connection reset by peer")
            yield piece

    monkeypatch.setattr(upload, "_verified_pieces", cut_midway)
    assert main(["snapshot", "push", str(local), uri]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert f"{uri}/pages.bin: upload failed" in line and "connection reset" in line
    assert "epoch-7/manifest.json" not in _keys(uri)
    monkeypatch.setattr(upload, "_verified_pieces", real)
    assert main(["snapshot", "push", str(local), uri]) == 0
    assert "already holds" not in capsys.readouterr().err
    _reads_back(uri, tmp_path / "cache", synthetic_pages(11, 0, PAGES), 7)


def test_a_manifest_without_chunk_hashes_is_refused_with_the_rebuild(local: Path,
                                                                     s3_bucket: str,
                                                                     capsys) -> None:
    doc = json.loads((local / "manifest.json").read_text())
    doc.update(format=1, checksum=None)
    doc.pop("chunk_hashes")
    doc.pop("chunk_pages")
    (local / "manifest.json").write_text(json.dumps(doc))
    uri = f"s3://{s3_bucket}/old"
    assert main(["snapshot", "push", str(local), uri]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "without chunk hashes" in line and "morphogen build --raw" in line
    assert _keys(uri) == []


@pytest.mark.parametrize(("target", "expected"), [
    ("https://host/snaps/epoch-1", "cannot be written"),
    ("http://host/snaps/epoch-1", "cannot be written"),
    ("/tmp/elsewhere", "not an object store"),
    ("file:///tmp/elsewhere", "not an object store"),
    ("s3://bucket/snaps/epoch-1/manifest.json", "name the snapshot's prefix"),
    ("s3:///epoch-1", "no bucket"),
])
def test_targets_that_cannot_take_a_snapshot_are_refused(local: Path, target: str,
                                                         expected: str, capsys) -> None:
    assert main(["snapshot", "push", str(local), target]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert target.rstrip("/") in line and expected in line
