"""A `morphogen` command in a process (and process session) of its own, as an operator runs it:
its output read as it comes, signals sent to it or to its whole group, and what it leaves
behind (processes of its session, its HTTP port) checked after it exits."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cluster.fake_cluster import session_pids
from cluster.local import HAPROXY_PORT_VARS, port_in_use

REPO = Path(__file__).resolve().parents[2]
SERVE_TEST_CONFIG = str(Path(__file__).parent / "serve_test.yaml")


def cli_env(tmp: Path, auth: str | None = "disabled", **extra: str) -> dict[str, str]:
    """The environment of a `morphogen` process in a test: its own cache and Ray temp dir, the
    authentication setting it relies on (None: unset, Ray's default for a new cluster), and
    free HAProxy ports of its own (not the test session's)."""
    env = dict(os.environ)
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
                 *HAPROXY_PORT_VARS):
        env.pop(name, None)
    env.update({
        "MORPHOGEN_CACHE_DIR": str(tmp / "cache"),
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    })
    if auth is not None:
        env["RAY_AUTH_MODE"] = auth
    env.update(extra)
    return env


def short_tmp() -> str:
    """A short directory for Ray's temp files: its unix socket paths are limited to 107
    bytes, more than pytest's tmp_path leaves."""
    return tempfile.mkdtemp(prefix="mgcli", dir="/tmp")


def run_cli(args: list[str], env: dict[str, str], timeout: float = 120) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "cluster.cli", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


class CliProcess:
    """One running `morphogen` command, leader of its own process session."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args = args
        self.log = log
        self._fh = open(log, "w")  # noqa: SIM115 - closed in finish()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cluster.cli", *args], env=env, cwd=REPO,
            stdout=self._fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self.pid = self.proc.pid
        self.started = time.monotonic()
        self.exit_s: float | None = None

    @property
    def output(self) -> str:
        return self.log.read_text()

    def wait_for(self, pattern: str, timeout: float = 240) -> re.Match[str]:
        """The first output line matching `pattern`; fails when the process exits first."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern, re.M)
        while time.monotonic() < deadline:
            m = rx.search(self.output)
            if m:
                return m
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.args} exited ({self.proc.returncode}) before "
                                     f"{pattern!r}:\n{self.output[-4000:]}")
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.output[-4000:]}")

    def signal(self, sig: int, group: bool = False) -> float:
        """Send `sig` (to the whole process group with `group`); returns the send time."""
        sent = time.monotonic()
        if group:
            os.killpg(self.pid, sig)
        else:
            self.proc.send_signal(sig)
        return sent

    def wait_exit(self, sent: float, timeout: float) -> int:
        """Exit status, and `exit_s`: seconds from `sent` to the exit."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running {timeout} s after the signal:\n"
                                 f"{self.output[-4000:]}") from None
        self.exit_s = time.monotonic() - sent
        return rc

    def leftovers(self, settle_s: float = 3.0) -> list[int]:
        """Live processes still in its session after it exited (an orphan proxy, say)."""
        deadline = time.monotonic() + settle_s
        while session_pids(self.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        return session_pids(self.pid)

    def kill(self) -> None:
        running = [self.pid] if self.proc.poll() is None else []
        for pid in [*running, *session_pids(self.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait(timeout=30)

    def finish(self) -> None:
        """Whatever happened: nothing of it left running."""
        if self.proc.poll() is None or session_pids(self.pid):
            self.kill()
        self._fh.close()


def port_freed(host: str, port: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while port_in_use(host, port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
