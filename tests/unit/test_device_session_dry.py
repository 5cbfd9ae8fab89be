"""The device session's GPU-table and key-format phases, run as a device run would run them
but on the CuPy fakes (`tables-dry`, `formats-dry`): a device is lent for minutes, so its
script must not be the thing that fails there. Every answer the phases take is checked
against the pages, and either phase exits non-zero on a wrong one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_the_device_phases_run_and_every_answer_is_right(tmp_path: Path) -> None:
    env = dict(os.environ, OUT=str(tmp_path),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    proc = subprocess.run(["bash", "bench/gpu/session.sh", "tables-dry", "formats-dry"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "session done, status 0" in out
    tables = json.loads((tmp_path / "chain_tables_fake-gpu.json").read_text())
    assert tables["checked_pages"] > 0 and tables["wrong_pages"] == 0
    assert {t["name"] for t in tables["tables"]} >= {"accounts.data", "storage.data", "code.data"}
    assert tables["blocks"], "no block was written into device memory"
    for fmt in ("v1", "packed"):
        path = tmp_path / f"key_formats_fake-gpu_dry_sliced_{fmt}.csv"
        rows = [line.split(",") for line in path.read_text().splitlines()]
        done = {int(r[4]): r[-1] for r in rows[1:]}
        assert set(done) == {1, 8, 32}, rows
        for q, correct in done.items():
            assert correct == f"{3 * q}/{3 * q}", (fmt, q, correct)
