"""What `morphogen serve` shows while a party deploys: each shard replica's snapshot fetch
(bytes, rate, time left) and, when a deployment fails, why, in one line.

Serve's own failure names only the deployment ("Failed to update the deployments
['shard_0']"); the replicas post their progress and the reason they failed to the start board
(`deployments.start_board`), and Serve's deployment status ends with the constructor's
exception, a fallback for replicas that died before they could post.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from cluster.report import eprint
from deployments import start_board

PROGRESS_EVERY_S = 5.0  # a replica's fetch line at most this often


class DeployWatch:
    """The start board of one application, from one deployment on."""

    def __init__(self, app: str, print_line: Callable[[str], None] = eprint) -> None:
        self.app = app
        self.since = time.time()
        self._print = print_line
        self._shown: dict[str, tuple[str, float]] = {}  # replica -> (state, when shown)
        self._failures: set[str] = set()

    def poll(self) -> None:
        """Print what changed on the board since the last poll."""
        now = time.monotonic()
        for doc in start_board.read(self.app, self.since):
            replica = str(doc.get("replica"))
            state = str(doc.get("state"))
            shown = self._shown.get(replica)
            if shown is not None and shown[0] == state and (
                    state != "fetching" or now - shown[1] < PROGRESS_EVERY_S):
                continue
            self._shown[replica] = (state, now)
            line = start_board.describe(doc)
            if state == "failed":
                if line in self._failures:
                    continue  # Serve's next try of the replica, failing the same way
                self._failures.add(line)
            self._print(f"[serve] party {self.app}: {line}")

    def failures(self) -> list[str]:
        """One line per deployment that failed: its replicas' own reasons, else the last line
        of Serve's status message for it."""
        reasons: dict[str, str] = {}
        for doc in start_board.read(self.app, self.since):
            if doc.get("state") == "failed":
                reasons[str(doc.get("deployment"))] = start_board.describe(doc)
        for name, message in _failed_deployments(self.app).items():
            reasons.setdefault(name, f"{name}: {_last_line(message)}")
        return [reasons[k] for k in sorted(reasons)]


def _failed_deployments(app: str) -> dict[str, str]:
    try:
        from ray import serve

        status = serve.status().applications.get(app)
    except Exception:  # noqa: BLE001 - no status: the board's reasons stand alone
        return {}
    if status is None:
        return {}
    return {name: d.message for name, d in status.deployments.items()
            if "FAIL" in str(d.status).upper() or "UNHEALTHY" in str(d.status).upper()}


def _last_line(message: str) -> str:
    """The exception line that ends a traceback in Serve's message (ANSI colours off)."""
    lines = [ln.strip() for ln in message.replace("\x1b[36m", "").replace(
        "\x1b[39m", "").splitlines() if ln.strip()]
    return lines[-1] if lines else "failed (no reason given)"


def run_watched(deploy: Callable[[], Any], watch: DeployWatch, every_s: float = 1.0) -> Any:
    """`deploy()` (Serve's blocking `serve.run`) in a thread, the board printed meanwhile;
    its result, or its exception."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = deploy()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            result["error"] = exc

    thread = threading.Thread(target=target, name="serve-deploy", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(every_s)
        watch.poll()
    if "error" in result:
        raise result["error"]
    return result.get("value")
