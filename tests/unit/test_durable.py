"""Crash-safe writes: the target holds the old bytes or the new, never a mix, and no temporary
is left behind by a write that failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from morphogen.storage.durable import fsync_dir, write_atomic


def test_write_atomic_replaces_whole(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_atomic(target, b"old")
    write_atomic(target, [b"new ", b"in ", b"parts"])
    assert target.read_bytes() == b"new in parts"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_atomic(target, b"old")

    def parts():
        yield b"half of the new "
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        write_atomic(target, parts())
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_the_caller_names_its_temporary(tmp_path: Path) -> None:
    seen = []

    def parts():
        seen.extend(p.name for p in tmp_path.iterdir())
        yield b"x"

    write_atomic(tmp_path / "blob", parts(), tmp=tmp_path / ".tmp-abc-blob")
    assert seen == [".tmp-abc-blob"] and (tmp_path / "blob").read_bytes() == b"x"


def test_fsync_dir_fails_loudly(tmp_path: Path) -> None:
    fsync_dir(tmp_path)
    with pytest.raises(FileNotFoundError):
        fsync_dir(tmp_path / "gone")
