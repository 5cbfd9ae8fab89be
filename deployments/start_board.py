"""How each shard replica's start is going, where the operator can read it: Ray's cluster
key-value store (the GCS), one entry per replica.

A replica posts its snapshot fetch as it goes (bytes, rate, time left, node, URI) and, when its
constructor fails, the reason in one line, before Serve retries it. `morphogen serve` prints
both while it deploys and names the reason when a deployment fails; `/admin/status` carries
them, so an operator on a cluster someone else started sees them too. Without this, Serve only
says "Failed to update the deployments ['shard_0']" and the reason sits in a controller log.

Entries hold no key, page or answer: only what a log line of the replica would.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

NAMESPACE = "morphogen"
POST_EVERY_S = 1.0  # a fetch's progress is posted at most this often
KEEP_S = 3600.0  # entries older than this are someone else's past: not shown


def _kv() -> Any:
    from ray.experimental import internal_kv

    return internal_kv


def _prefix(app: str) -> str:
    return f"start/{app}/"


def post(app: str, deployment: str, replica: str, doc: dict[str, Any]) -> None:
    """Record `doc` (with the time) as this replica's start; never raises (a start must not
    fail for want of a progress line)."""
    try:
        body = json.dumps({**doc, "deployment": deployment, "replica": replica,
                           "at": time.time()}).encode()
        _kv()._internal_kv_put(f"{_prefix(app)}{deployment}/{replica}".encode(), body,
                               overwrite=True, namespace=NAMESPACE)
    except Exception as exc:  # noqa: BLE001 - see above
        log.debug("start board: cannot post (%s)", exc)


def read(app: str, since: float = 0.0) -> list[dict[str, Any]]:
    """Every replica's entry for `app` posted after `since` (and within KEEP_S), oldest
    first."""
    kv = _kv()
    out = []
    try:
        keys = kv._internal_kv_list(_prefix(app).encode(), namespace=NAMESPACE)
        for key in keys:
            raw = kv._internal_kv_get(key, namespace=NAMESPACE)
            if raw is None:
                continue
            doc = json.loads(raw)
            if doc.get("at", 0) >= max(since, time.time() - KEEP_S):
                out.append(doc)
    except Exception as exc:  # noqa: BLE001 - a status without the board is still a status
        log.debug("start board: cannot read (%s)", exc)
    return sorted(out, key=lambda d: d.get("at", 0))


def unsettled(app: str) -> list[dict[str, Any]]:
    """The entries of replicas still fetching or that failed, after the last replica of their
    deployment that started (a failure Serve has since recovered from is history)."""
    docs = read(app)
    ready_at: dict[str, float] = {}
    for d in docs:
        if d.get("state") == "ready":
            ready_at[str(d.get("deployment"))] = max(
                ready_at.get(str(d.get("deployment")), 0.0), float(d.get("at", 0)))
    return [d for d in docs if d.get("state") in ("fetching", "failed")
            and float(d.get("at", 0)) > ready_at.get(str(d.get("deployment")), 0.0)]


def clear(app: str) -> None:
    """Forget `app`'s entries (a new deployment of it starts afresh)."""
    try:
        kv = _kv()
        for key in kv._internal_kv_list(_prefix(app).encode(), namespace=NAMESPACE):
            kv._internal_kv_del(key, namespace=NAMESPACE)
    except Exception as exc:  # noqa: BLE001
        log.debug("start board: cannot clear (%s)", exc)


def describe(doc: dict[str, Any]) -> str:
    """One line for one replica's entry."""
    who = f"{doc.get('deployment', '?')} on node {str(doc.get('node') or '?')[:16]}"
    state = doc.get("state")
    if state == "failed":
        return f"{who}: failed to start: {doc.get('reason', '?')}"
    if state == "fetching":
        return f"{who}: fetching {doc.get('line', '')}"
    if state == "ready":
        return f"{who}: ready in {doc.get('seconds', 0):.1f} s"
    return f"{who}: {state}"


class ReplicaStart:
    """What one replica posts while it starts."""

    def __init__(self, deployment: str) -> None:
        self.app = self.replica = ""
        self.node = ""
        self.deployment = deployment
        self.started = time.monotonic()
        self._last_post = 0.0
        self._done = False
        self._chunks: dict[str, list[int]] = {}  # snapshot root -> chunks fetched
        try:
            from ray import serve

            ctx = serve.get_replica_context()
            self.app, self.replica = ctx.app_name, ctx.replica_tag
            import ray

            self.node = ray.get_runtime_context().get_node_id()
        except Exception as exc:  # noqa: BLE001 - outside Serve (a test): nothing to post to
            log.debug("start board: no replica context (%s)", exc)

    def _post(self, doc: dict[str, Any]) -> None:
        if self.app:
            post(self.app, self.deployment, self.replica, {"node": self.node, **doc})

    def fetching(self, progress: Any) -> None:
        """A `morphogen.snapshot.chunk_cache.FetchProgress` after a chunk landed."""
        if not self._done and progress.fetched:  # which chunks this replica's start fetched
            self._chunks.setdefault(Path(progress.path).name, []).append(progress.chunk)
        now = time.monotonic()
        if self._done or (now - self._last_post < POST_EVERY_S
                          and progress.done < progress.total):
            return  # a rotation's fetch, after the start, shows in the metrics only
        self._last_post = now
        self._post({"state": "fetching", "line": progress.line(), "uri": progress.uri,
                    "done": progress.done, "total": progress.total,
                    "rate": progress.rate, "seconds_left": progress.seconds_left})

    def failed(self, exc: BaseException) -> None:
        self._done = True
        self._post({"state": "failed", "reason": reason_line(exc)})

    def ready(self) -> None:
        self._done = True
        self._post({"state": "ready", "seconds": time.monotonic() - self.started,
                    "fetched_chunks": self._chunks})


def reason_line(exc: BaseException, limit: int = 600) -> str:
    """An exception as one line: its message when it has one (the project's errors name what
    and where), else its type; no traceback."""
    text = " ".join(str(exc).split())
    line = text if text else type(exc).__name__
    if not isinstance(exc, (ValueError, RuntimeError, OSError)) or not text:
        line = f"{type(exc).__name__}: {line}" if text else line
    return line if len(line) <= limit else line[:limit - 3] + "..."
