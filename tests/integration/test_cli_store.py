"""`morphogen serve` on a snapshot in object storage when something is wrong there, as the
operator sees it: the reason a shard replica failed (chunk, URI, node) on serve's one error
line, not "Failed to update the deployments ['shard_0']"; a store that cannot be reached, one
line with the hint that fits it; and each replica's fetch reported as it starts."""

from __future__ import annotations

import re
from pathlib import Path

import obstore
import pytest

from cluster.local import listener_port
from morphogen.snapshot.synthetic import build_synthetic
from morphogen.storage import open_location

from .cli_process import SERVE_TEST_CONFIG, CliProcess, cli_env, remove, run_cli, short_tmp

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PAGES, CHUNK = 64, 16  # shard 0: chunks 0-1, shard 1: chunks 2-3


def _upload(local: Path, uri: str, flip_page: int | None = None) -> None:
    loc = open_location(uri)
    data = bytearray((local / "pages.bin").read_bytes())
    if flip_page is not None:
        data[flip_page * 4096 + 7] ^= 0x01  # one bit, as a bad disk or a bad copy leaves
    obstore.put(loc.store, loc.key("pages.bin"), bytes(data))
    obstore.put(loc.store, loc.key("manifest.json"), (local / "manifest.json").read_bytes())


def _error_line(output: str) -> str:
    assert "Traceback" not in output, output[-3000:]
    lines = [ln for ln in output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, output[-3000:]
    return lines[0]


def test_a_corrupted_object_fails_serve_naming_shard_chunk_uri_and_node(
        tmp_path: Path, s3_env) -> None:
    bucket = s3_env.new_bucket("corrupt")
    build_synthetic(tmp_path / "snap", PAGES, seed=9, progress=False, chunk_pages=CHUNK)
    uri = f"s3://{bucket}/snapshots/epoch-1"
    _upload(tmp_path / "snap", uri, flip_page=20)  # chunk 1: shard 0's
    ray_tmp = short_tmp()
    env = cli_env(tmp_path, RAY_TMPDIR=ray_tmp, **s3_env.env())
    port = listener_port()
    proc = CliProcess(["serve", "--matrix", uri, "--shards", "2", "--num-cpus", "2",
                       "--port", str(port), "--config", SERVE_TEST_CONFIG], env,
                      tmp_path / "serve.log")
    try:
        rc = proc.wait_exit(proc.started, 240)
        out = proc.output
        line = _error_line(out)
        assert rc == 1, out[-3000:]
        assert "Failed to update the deployments" not in line
        assert re.search(r"shard_0 on node \w+: failed to start: node \S+: "
                         + re.escape(uri) + r" chunk 1 \(pages \[16, 32\)\): the fetched "
                         r"bytes do not hash as the manifest says", line), line
        assert "shard_1" not in line  # its chunks are sound: it started
        # the sound shard's start was reported while serve waited
        assert re.search(r"\[serve\] party \w+: shard_1 on node \w+: ready in", out), out
    finally:
        proc.finish()
        remove(ray_tmp)


def test_an_unreachable_store_is_one_line_with_the_hint_that_fits(tmp_path: Path,
                                                                 s3_env) -> None:
    env = cli_env(tmp_path, **{**s3_env.env(), "AWS_ENDPOINT_URL": f"http://127.0.0.1:"
                                                                     f"{listener_port()}",
                               "MORPHOGEN_STORE_RETRY_S": "1",
                               "MORPHOGEN_STORE_OUTAGE_S": "2"})
    rc, _, err = run_cli(["serve", "--matrix", "s3://nowhere/snapshots/epoch-1",
                          "--port", str(listener_port())], env, timeout=120)
    line = _error_line(err)
    assert rc == 2
    assert "s3://nowhere/snapshots/epoch-1/manifest.json" in line
    assert "could not be reached" in line and "AWS_ENDPOINT_URL" in line
    assert "Debug source" not in err and "morphogen build" not in line


def test_a_first_deploy_rides_out_a_store_outage(tmp_path: Path, s3_env) -> None:
    import signal
    import threading

    from tests.s3.gate import DOWN, OPEN, gate_to

    bucket = s3_env.new_bucket("outage")
    build_synthetic(tmp_path / "snap", PAGES, seed=9, progress=False, chunk_pages=CHUNK)
    uri = f"s3://{bucket}/snapshots/epoch-1"
    _upload(tmp_path / "snap", uri)
    ray_tmp = short_tmp()
    with gate_to(s3_env.endpoint, DOWN) as gate:
        env = cli_env(tmp_path, RAY_TMPDIR=ray_tmp,
                      **{**s3_env.env(), "AWS_ENDPOINT_URL": gate.endpoint,
                         "MORPHOGEN_STORE_RETRY_S": "2"})
        port = listener_port()
        proc = CliProcess(["serve", "--matrix", uri, "--shards", "2", "--num-cpus", "2",
                           "--port", str(port), "--config", SERVE_TEST_CONFIG], env,
                          tmp_path / "serve.log")
        back = threading.Timer(10.0, gate.set, args=(OPEN,))
        back.start()
        try:
            proc.wait_for(r"^ready;", timeout=240)
            assert proc.proc.poll() is None
            assert time_since(proc) >= 10  # it waited for the store, and did not give up
            import httpx

            assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
            rc = proc.wait_exit(proc.signal(signal.SIGTERM), 60)
            assert rc == 0, proc.output[-3000:]
        finally:
            back.cancel()
            proc.finish()
            remove(ray_tmp)


def time_since(proc: CliProcess) -> float:
    import time

    return time.monotonic() - proc.started
