"""`morphogen serve` as an operator runs it, each in a process of its own with a cluster of its
own: two parties on one machine, joining that cluster, a party that cannot fit, and stopping on
signals (to the process or to its whole group) within the stated bound with nothing left
behind."""

from __future__ import annotations

import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cluster.local import listener_port, port_in_use
from cluster.shutdown import STOP_BOUND_S
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages

from .cli_process import (
    SERVE_TEST_CONFIG,
    CliProcess,
    cli_env,
    port_freed,
    remove,
    run_cli,
    short_tmp,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SEED = 5
PAGES = 64
# a replica of a party started (the deploy watch's line), as opposed to serve's own "ready"
SHARD_READY = r": (shard_\d+|router) on node \w+: ready in "


def _snapshot(tmp_path: Path) -> str:
    build_synthetic(tmp_path / "snap", PAGES, seed=SEED, progress=False)
    return str(tmp_path / "snap")


def _line(text: str, pattern: str) -> re.Match[str]:
    m = re.search(pattern, text, re.M)
    assert m, f"no {pattern!r} in:\n{text[-3000:]}"
    return m


def _status(url: str) -> int:
    return httpx.get(url, timeout=10).status_code


def _one_error_line(err: str) -> str:
    """The single `error:` line of a refused command; no traceback."""
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


# The stop's watchdog forces at STOP_BOUND_S after the stop began; killing the tree and the
# interpreter's exit come after it, and the signal is seen up to WAKE_S late. A stop that
# ran to the watchdog (a loaded machine: "[serve] stopped in 15.1 s") exited 16.1 s after
# the signal and failed a bound that left the force no time at all.
EXIT_AFTER_BOUND_S = 3.0


def _stopped_cleanly(proc: CliProcess, port: int) -> None:
    assert proc.exit_s is not None and proc.exit_s <= STOP_BOUND_S + EXIT_AFTER_BOUND_S, (
        proc.exit_s, proc.output)
    assert not port_in_use("127.0.0.1", port), "the HTTP port is still held"
    assert proc.leftovers() == [], f"processes left behind:\n{proc.output[-3000:]}"


def test_two_parties_on_one_machine_and_a_third_joining(tmp_path: Path) -> None:
    """Cases 1, 5 and 6: `serve --parties a,b` runs both parties of a deployment on one
    cluster and prints their URLs, the Ray address and the metrics endpoint; another process
    joins (token authentication, no RAY_AUTH_MODE set) and is refused the names and port it
    cannot have; its Ctrl-C removes only its own party."""
    snap = _snapshot(tmp_path)
    token = tmp_path / "ray-token"
    token.write_text(secrets.token_hex(32))
    ray_tmp = short_tmp()
    env = cli_env(tmp_path, auth=None, RAY_AUTH_TOKEN_PATH=str(token), RAY_TMPDIR=ray_tmp)
    port = listener_port()
    base = f"http://127.0.0.1:{port}"
    srv = CliProcess(["serve", "--parties", "a,b", "--matrix", snap, "--port", str(port),
                      "--num-cpus", "2", "--config", SERVE_TEST_CONFIG], env, tmp_path / "ab.log")
    joined = None
    try:
        srv.wait_for(r"^ready")
        out = srv.output
        url_a = _line(out, r"^party a: (\S+)$")[1]
        url_b = _line(out, r"^party b: (\S+)$")[1]
        assert (url_a, url_b) == (f"{base}/a", f"{base}/b")
        ray_port = _line(out, r"^ray address: \S+:(\d+) \(token authentication")[1]
        address = f"127.0.0.1:{ray_port}"
        metrics_port = _line(out, r"^metrics: http://\S+:(\d+)/metrics$")[1]

        rc, got, err = run_cli(["get", "--server-a", url_a, "--server-b", url_b, "3", "63"], env)
        assert rc == 0, err
        want = synthetic_pages(SEED, 0, PAGES)
        assert [line.split("\t")[1] for line in got.splitlines()] == [
            "0x" + want[3].tobytes().hex(), "0x" + want[63].tobytes().hex()]

        resp = httpx.get(f"{base}/nowhere", timeout=10)
        assert resp.status_code == 404
        assert resp.json()["error"]["code"] == "not_found"
        assert "/a (a)" in resp.json()["error"]["message"]

        rc, _, err = run_cli(["serve", "--address", address, "--name", "a", "--matrix", snap,
                              "--config", SERVE_TEST_CONFIG], env)
        assert rc == 2 and "application 'a' already runs" in _one_error_line(err)
        rc, _, err = run_cli(["serve", "--address", address, "--name", "c", "--matrix", snap,
                              "--port", str(listener_port()), "--config", SERVE_TEST_CONFIG], env)
        assert rc == 2 and f"already listens on 127.0.0.1:{port}" in _one_error_line(err)
        assert _status(f"{url_a}/health") == 200

        joined = CliProcess(["serve", "--address", address, "--name", "c", "--matrix", snap,
                             "--config", SERVE_TEST_CONFIG], env, tmp_path / "c.log")
        joined.wait_for(r"^ready", 120)
        assert f"party c: {base}/c\n" in joined.output
        assert _status(f"{base}/c/health") == 200
        sent = joined.signal(signal.SIGINT)
        assert joined.wait_exit(sent, STOP_BOUND_S + 30) == 0, joined.output
        assert joined.exit_s is not None and joined.exit_s <= STOP_BOUND_S + EXIT_AFTER_BOUND_S, \
            joined.output
        assert _status(f"{base}/c/health") == 404
        assert _status(f"{url_a}/health") == 200 and _status(f"{url_b}/health") == 200

        # a pod's way: no --address, $RAY_ADDRESS set; it joins (never starts or stops Ray)
        # and its Ctrl-C removes its own party only
        joined = CliProcess(["serve", "--name", "d", "--matrix", snap,
                             "--config", SERVE_TEST_CONFIG], {**env, "RAY_ADDRESS": address},
                            tmp_path / "d.log")
        joined.wait_for(r"^ready", 120)
        assert f"party d: {base}/d\n" in joined.output
        sent = joined.signal(signal.SIGINT)
        assert joined.wait_exit(sent, STOP_BOUND_S + 30) == 0, joined.output
        assert _status(f"{base}/d/health") == 404
        assert _status(f"{url_a}/health") == 200 and _status(f"{url_b}/health") == 200

        # a driver of one's own joins with the setting serve printed
        code = (f"import ray; ray.init(address={address!r}, logging_level='ERROR'); "
                "print(int(ray.cluster_resources()['CPU']))")
        driver = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                env={**env, "RAY_AUTH_MODE": "token"}, timeout=120)
        assert driver.stdout.strip().endswith("2"), driver.stderr[-2000:]

        rc, got, err = run_cli(["metrics-url", "--address", address], env)
        assert rc == 0 and f":{metrics_port}/metrics" in got, err
        body = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        assert "ray_" in body

        sent = srv.signal(signal.SIGTERM, group=True)
        assert srv.wait_exit(sent, STOP_BOUND_S + 30) == 0, srv.output
        _stopped_cleanly(srv, port)
    finally:
        if joined is not None:
            joined.finish()
        srv.finish()
        remove(ray_tmp)


def test_sigterm_to_the_group_frees_the_port_for_the_next_serve(tmp_path: Path) -> None:
    """Case 4: what systemd, docker and `timeout` send. The port is refused in one line while
    held, free within the bound after, and the next `serve` on it starts."""
    snap = _snapshot(tmp_path)
    ray_tmp = short_tmp()
    env = cli_env(tmp_path, RAY_TMPDIR=ray_tmp)
    port = listener_port()
    args = ["serve", "--matrix", snap, "--shards", "1", "--port", str(port), "--num-cpus", "2",
            "--config", SERVE_TEST_CONFIG]
    first = CliProcess(args, env, tmp_path / "first.log")
    second = None
    try:
        first.wait_for(r"^ready")
        started = time.monotonic()
        rc, _, err = run_cli(args, env)
        assert rc == 2 and f"--port {port}: 127.0.0.1:{port} is in use" in _one_error_line(err)
        assert time.monotonic() - started < 30

        sent = first.signal(signal.SIGTERM, group=True)
        assert first.wait_exit(sent, STOP_BOUND_S + 30) == 0, first.output
        _stopped_cleanly(first, port)

        second = CliProcess(args, env, tmp_path / "second.log")
        second.wait_for(r"^ready")
        assert _status(f"http://127.0.0.1:{port}/health") == 200
        sent = second.signal(signal.SIGTERM)
        assert second.wait_exit(sent, STOP_BOUND_S + 30) == 0, second.output
        _stopped_cleanly(second, port)
        assert "stopped in" in second.output
    finally:
        first.finish()
        if second is not None:
            second.finish()
        remove(ray_tmp)


def test_a_stuck_serve_stops_and_a_second_signal_forces(tmp_path: Path) -> None:
    """Case 3: shards that can never be placed (deployed anyway) keep `serve.run` waiting;
    SIGINT still stops everything within the bound, and a second signal forces at once."""
    snap = _snapshot(tmp_path)
    ray_tmp = short_tmp()
    env = cli_env(tmp_path, RAY_TMPDIR=ray_tmp)
    port = listener_port()
    args = ["serve", "--matrix", snap, "--shards", "4", "--shard-cpus", "1", "--num-cpus", "2",
            "--skip-resource-check", "--port", str(port), "--config", SERVE_TEST_CONFIG]
    procs: list[CliProcess] = []
    try:
        stuck = CliProcess(args, env, tmp_path / "stuck.log")
        procs.append(stuck)
        stuck.wait_for(r"^\[serve\] deploying")
        # the replicas that fit start (a shard and the router fit in 2 CPUs); the party never
        # is: no line of serve's own "ready"
        stuck.wait_for(SHARD_READY)
        assert not re.search(r"^ready", stuck.output, re.M), stuck.output
        sent = stuck.signal(signal.SIGINT)
        assert stuck.wait_exit(sent, STOP_BOUND_S + 30) == 0, stuck.output
        _stopped_cleanly(stuck, port)

        forced = CliProcess(args, env, tmp_path / "forced.log")
        procs.append(forced)
        forced.wait_for(r"^\[serve\] deploying")
        forced.wait_for(SHARD_READY)
        sent = forced.signal(signal.SIGINT)
        forced.wait_for(r"SIGINT: stopping", 10)
        forced.signal(signal.SIGINT)
        assert forced.wait_exit(sent, 30) == 128 + signal.SIGINT, forced.output
        assert "forcing" in forced.output
        assert port_freed("127.0.0.1", port, 5.0)
        assert forced.leftovers() == [], forced.output
        assert forced.exit_s is not None and forced.exit_s < 10
    finally:
        for p in procs:
            p.finish()
        remove(ray_tmp)


def test_shards_that_cannot_fit_fail_fast(tmp_path: Path) -> None:
    """Case 2: docs/serving.md's `--shards 4` on two cores (4 x 0.5 CPU + a 0.25 router) is refused
    within seconds, with the numbers and the flag that fixes it, before Ray starts (the cluster
    it would start has `--num-cpus` and nothing else); nothing is left running."""
    snap = _snapshot(tmp_path)
    ray_tmp = short_tmp()
    env = cli_env(tmp_path, RAY_TMPDIR=ray_tmp)
    port = listener_port()
    proc = CliProcess(["serve", "--matrix", snap, "--shards", "4", "--num-cpus", "2",
                       "--port", str(port)], env, tmp_path / "fit.log")
    try:
        rc = proc.wait_exit(proc.started, 60)
        line = _one_error_line(proc.output)
        assert rc == 2
        assert "asks Ray for 2.25 CPUs (morphogen: 4 shards x 0.5 + router 0.25" in line
        assert "2 free" in line and "--shard-cpus 0.40 fits" in line
        assert proc.exit_s is not None and proc.exit_s < 40
        assert "deploying" not in proc.output
        assert not list(Path(ray_tmp).glob("**/session_*")), "Ray was started for a refusal"
        assert proc.leftovers() == []
    finally:
        proc.finish()
        remove(ray_tmp)
