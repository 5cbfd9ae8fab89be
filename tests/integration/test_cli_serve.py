"""`morphogen serve --matrix FILE` in its own process, queried by a client written from
PROTOCOL.md alone; SIGTERM stops it cleanly."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from cluster.local import listener_port

from . import spec_client
from .cli_process import SERVE_TEST_CONFIG, CliProcess, cli_env, remove, short_tmp

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
    srv = CliProcess(["serve", "--matrix", str(raw), "--shards", "2", "--port", str(port),
                      "--host", "127.0.0.1", "--num-cpus", "2", "--engine", "cpu",
                      "--config", SERVE_TEST_CONFIG, "--pad-last-page"],
                     env, tmp_path / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        # ready when it says so: a party is announced once its route answers steadily (an
        # answer to /health alone could come from the proxy process that is being replaced)
        srv.wait_for(rf"^party \S+: {re.escape(base)}/?$", 240)
        doc = spec_client.get_json(base + "/epoch")
        assert doc["page_pir"]["num_pages"] == 71 and doc["page_pir"]["domain_bits"] == 7
        targets = [0, 70, 35, 1, 2, 69]
        # The same server plays both parties: the XOR only needs two answers to one matrix.
        assert spec_client.fetch(base, base, targets) == [page[t] for t in targets]
        sent = srv.signal(signal.SIGTERM)
        assert srv.wait_exit(sent, 90) == 0, srv.output[-3000:]
        assert "stopped" in srv.output
    finally:
        srv.finish()
        remove(ray_tmp)
