"""Reaching the Ray cluster a `morphogen serve` runs on: its address, its authentication and its
Prometheus endpoints.

A cluster started by `ray.init` uses token authentication unless RAY_AUTH_MODE says otherwise,
with the token in ~/.ray/auth_token (or $RAY_AUTH_TOKEN_PATH, or $RAY_AUTH_TOKEN). A process
joining with an explicit address does not switch token mode on by itself: without
RAY_AUTH_MODE=token it is refused ("Unauthenticated") for 20 s and then fails. `join_auth`
switches it on wherever a token is available (a token sent to a cluster without
authentication is ignored), and `serve` prints the setting a driver of its own needs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

AUTH_ENV = "RAY_AUTH_MODE"


def token_path() -> Path:
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")


def token_available() -> bool:
    return bool(os.environ.get("RAY_AUTH_TOKEN")) or token_path().is_file()


def join_auth() -> None:
    """Use token authentication to join a cluster when RAY_AUTH_MODE is unset and a token is
    available, as `ray.init()` does for a cluster it finds by itself."""
    if AUTH_ENV not in os.environ and token_available():
        os.environ[AUTH_ENV] = "token"
        if "ray" in sys.modules:  # Ray reads its configuration once, at import
            from ray._raylet import Config

            Config.initialize("")


def auth_mode() -> str:
    """The mode this process connected with (`ray.init` sets the variable when it switches
    token mode on by default, so unset after connecting means none)."""
    return os.environ.get(AUTH_ENV, "disabled").lower()


def auth_line() -> str:
    """How a driver joins: the setting and where the token is."""
    if auth_mode() != "token":
        return f"authentication {auth_mode()}"
    where = "$RAY_AUTH_TOKEN" if os.environ.get("RAY_AUTH_TOKEN") else str(token_path())
    return f"token authentication: drivers set {AUTH_ENV}=token, token in {where}"


def address() -> str:
    """The connected cluster's GCS address (what `--address` and `ray.init(address=)` take)."""
    import ray

    return str(ray.get_runtime_context().gcs_address)


def metrics_urls() -> list[str]:
    """Every live node's Prometheus endpoint (Ray's metrics agent: morphogen's metrics and
    Ray's)."""
    import ray

    urls = []
    for node in ray.nodes():
        port = node.get("MetricsExportPort")
        if node.get("Alive") and port:
            urls.append(f"http://{node['NodeManagerAddress']}:{port}/metrics")
    return urls


def join_failure(addr: str, exc: BaseException) -> str:
    """Why joining failed, with what to check."""
    from cluster.errors import one_line

    hint = ("the address is the one `morphogen serve` printed (`ray address:`); a cluster with "
            f"token authentication needs {AUTH_ENV}=token and its token ($RAY_AUTH_TOKEN_PATH "
            "or ~/.ray/auth_token)")
    return f"--address {addr}: cannot join the Ray cluster ({one_line(exc)[:200]}): {hint}"


def joined_metrics_urls(addr: str) -> list[str]:
    """`metrics_urls` of the cluster at `addr`, joined for the question and left at once."""
    from cluster.errors import UsageError

    join_auth()
    import ray

    try:
        ray.init(address=addr, logging_level="ERROR", log_to_driver=False)
    except (ConnectionError, ValueError) as exc:
        raise UsageError(join_failure(addr, exc)) from None
    try:
        return metrics_urls()
    finally:
        ray.shutdown()
