"""`morphogen serve --matrix FILE` in its own process, queried by a client written from
PROTOCOL.md alone; SIGTERM stops it cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.local import listener_port

from . import spec_client
from .cli_process import SERVE_TEST_CONFIG, cli_env, remove, short_tmp
from .conftest import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_spec_client_known_answers() -> None:
    left, right, tl, tr = spec_client.prg(bytes(16))
    assert left.hex() == "3e00ef2f895f40d67f5bb8e81f09a5a1"
    assert right.hex() == "2c840ec3ce9a7f3b181be188ef711a1e"
    assert (tl, tr) == (0, 0)
    assert spec_client.prg(bytes(range(16)))[2:] == (0, 1)


def test_serve_raw_matrix_for_a_spec_only_client(tmp_path: Path) -> None:
    rng = os.urandom
    raw = tmp_path / "matrix.bin"
    data = rng(4096 * 70 + 123)  # ragged last page: served zero-padded
    raw.write_bytes(data)
    padded = data + bytes(4096 - 123)
    page = [padded[i * 4096 : (i + 1) * 4096] for i in range(71)]

    port = listener_port()
    ray_tmp = short_tmp()
    env = cli_env(tmp_path, RAY_TMPDIR=ray_tmp)
    # a raw file ending inside a page is served only when asked (--pad-last-page)
    cmd = [sys.executable, "-m", "cluster.cli", "serve", "--matrix", str(raw), "--shards", "2",
           "--port", str(port), "--host", "127.0.0.1", "--num-cpus", "2", "--engine", "cpu",
           "--config", SERVE_TEST_CONFIG, "--pad-last-page"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        # when it does not come up, the output read below once it is stopped says why
        up = wait_until(lambda: spec_client.get_json(base + "/health")["status"] == "ok", 240, 1.0)
        if up:
            doc = spec_client.get_json(base + "/epoch")
            assert doc["page_pir"]["num_pages"] == 71 and doc["page_pir"]["domain_bits"] == 7
            targets = [0, 70, 35, 1, 2, 69]
            # The same server plays both parties: the XOR only needs two answers to one matrix.
            assert spec_client.fetch(base, base, targets) == [page[t] for t in targets]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail("serve did not stop within 90 s of SIGTERM:\n" + out[-3000:])
        finally:
            remove(ray_tmp)
    assert up, "server did not come up within 240 s:\n" + out[-3000:]
    assert proc.returncode == 0, out[-3000:]
    assert "stopped" in out
    time.sleep(0.5)
