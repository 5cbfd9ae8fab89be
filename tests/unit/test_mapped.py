"""`new_mapped`: a file written through its mapping, its room taken before any byte is."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from morphogen.storage.mapped import new_mapped

ROOT = Path(__file__).resolve().parents[2]


def test_a_new_file_reads_as_zeros_and_keeps_what_is_written(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"old bytes, longer than nothing")
    rows = new_mapped(path, np.uint32, (3, 5))
    assert rows.shape == (3, 5) and not rows.any()
    rows[1, 2] = 0xDEADBEEF
    rows.flush()
    del rows
    want = np.zeros((3, 5), np.uint32)
    want[1, 2] = 0xDEADBEEF
    assert path.read_bytes() == want.tobytes()
    empty = new_mapped(tmp_path / "e.bin", np.uint8, (0,))
    assert empty.shape == (0,) and (tmp_path / "e.bin").stat().st_size == 0


# a 1-MiB file system of its own, in a mount namespace of the test's own (no privilege needed
# where user namespaces are allowed), where the script runs
SMALL_FS = "set -e; mkdir -p {mnt}; mount -t tmpfs -o size=1m none {mnt}; "


def _on_a_small_disk(tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    mnt = tmp_path / "small"
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to make a small file system with")
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", SMALL_FS.format(mnt=mnt)],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode:
        pytest.skip(f"no file system of the test's own here: {probe.stderr.strip()}")
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c",
         SMALL_FS.format(mnt=mnt) + f'exec {sys.executable} -c "$0" {mnt}', script],
        capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_a_disk_without_room_refuses_the_file_before_a_byte_is_written(tmp_path: Path):
    """Writing 2 MiB through a mapping on a 1-MiB disk: a file only sized (`truncate`) kills
    the writer with SIGBUS, with no word of why; `new_mapped` refuses it up front, an error
    that names the file, and leaves no file behind."""
    unreserved = ("import sys, numpy as np; p = sys.argv[1] + '/x'; "
                  "open(p, 'wb').truncate(2 << 20); "
                  "m = np.memmap(p, np.uint8, 'r+', shape=(2 << 20,)); m[:] = 1")
    run = _on_a_small_disk(tmp_path, unreserved)
    assert run.returncode == -signal.SIGBUS, run.stderr

    reserved = ("import os, sys, numpy as np\n"
                "from morphogen.storage.mapped import new_mapped\n"
                "p = sys.argv[1] + '/x'\n"
                "try:\n"
                "    new_mapped(p, np.uint8, (2 << 20,))\n"
                "except OSError as exc:\n"
                "    print('refused:', exc, os.path.exists(p))\n"
                "m = new_mapped(p, np.uint8, (512 << 10,))\n"
                "m[:] = 7\n"
                "m.flush()\n"
                "print('half a MiB:', open(p, 'rb').read() == bytes([7]) * len(m))\n")
    run = _on_a_small_disk(tmp_path, reserved)
    assert run.returncode == 0, run.stderr
    refused, fits = run.stdout.splitlines()
    assert refused.startswith("refused: [Errno 28]") and "/small/x: no room for 2,097,152" \
        in refused and refused.endswith("False")
    assert fits == "half a MiB: True"
