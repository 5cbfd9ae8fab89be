"""One real local Ray Serve instance for the whole test session.

Ray and Serve are configured explicitly rather than from whatever the machine has: token
authentication off (a fresh `ray.init` would otherwise write a token under the home folder and
switch it on), a private temp dir, no dashboard, logical GPUs for the placement tests, Serve's
access log off, and small CPU slots per replica so that everything fits on two cores.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cluster.local import (  # noqa: E402 - no Ray import behind it
    HAPROXY_PORT_VARS,
    PROXY_READY_S,
    fast_ingress_env,
    init_local,
    listener_port,
)
from morphogen.snapshot.synthetic import build_synthetic

from .churn import wait_until  # noqa: F401 - the tests' one polling helper

os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# metrics reach the node's Prometheus endpoint within a second (test_metrics.py)
os.environ.setdefault("RAY_metrics_report_interval_ms", "1000")
# The same Serve settings as the clusters `morphogen` starts (MORPHOGEN_FAST_INGRESS=0 tests
# Serve's default Python proxy instead, the path of a plain `serve run`).
FAST_INGRESS = os.environ.get("MORPHOGEN_FAST_INGRESS", "1") != "0"
# HAProxy's listener ports are drawn per session instance (`serve_instance`), not here: xdist's
# workers inherit this process's environment, and two workers' instances given the same
# ports would have one HAProxy refused at its start ("Address already in use").
if FAST_INGRESS:
    for _k, _v in fast_ingress_env(draining_s=0.5).items():
        if _k not in HAPROXY_PORT_VARS:
            os.environ.setdefault(_k, _v)
os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", str(PROXY_READY_S))

NUM_PAGES = 640  # d = 10 with 384 unused domain points: aliasing would show
LOGICAL_GPUS = 2


def party_args(cache_dir: str, **overrides: Any) -> dict[str, Any]:
    """A test party: CPU engine, tiny CPU slots, fast health checks and shutdown."""
    args: dict[str, Any] = {
        "synthetic_pages": NUM_PAGES,
        "synthetic_seed": 11,
        "cache_dir": cache_dir,
        "engine": "cpu",
        "engine_options": {"threads": 1},
        "shard_num_cpus": 0.1,
        "router_num_cpus": 0.1,
        "health_check_period_s": 1.0,
        "health_check_timeout_s": 10.0,
        "graceful_shutdown_timeout_s": 0.5,
        "shard_timeout_s": 10.0,
        "num_shards": 2,
    }
    args.update(overrides)
    return args


@dataclass
class ServeInstance:
    url: str
    cache_dir: str
    tmp: str

    def app_url(self, name: str) -> str:
        return f"{self.url}/{name}"


@pytest.fixture(scope="session")
def serve_instance(s3_server) -> Iterator[ServeInstance]:
    # every Ray worker inherits this environment: replicas reach the loopback S3 server
    # (snapshots and epoch logs by URI) exactly as pods reach theirs, from AWS_* variables
    os.environ.update(s3_server.env())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ray = pytest.importorskip("ray")
        from ray import serve
    if FAST_INGRESS:
        for name in HAPROXY_PORT_VARS:
            os.environ[name] = str(listener_port())
    # Short path: Ray's unix sockets live under it (108-byte limit).
    tmp = tempfile.mkdtemp(prefix="mgray", dir="/tmp")
    # started again if its node times out during start-up, as `morphogen serve`'s is: on a
    # loaded two-core machine that wait can pass while nothing is wrong
    init_local(
        ray,
        num_cpus=4,
        num_gpus=LOGICAL_GPUS,
        include_dashboard=False,
        _temp_dir=os.path.join(tmp, "ray"),
        logging_level="ERROR",
        log_to_driver=False,
        configure_logging=True,
    )
    port = listener_port()  # bound later by the proxy: not from the ephemeral range
    serve.start(
        http_options={"host": "127.0.0.1", "port": port},
        logging_config={"enable_access_log": False, "log_level": "WARNING"},
    )
    try:
        yield ServeInstance(f"http://127.0.0.1:{port}", os.path.join(tmp, "cache"), tmp)
    finally:
        # Apps first (replicas drain), then the whole cluster; `serve.shutdown` would leave
        # this driver's long-poll calls failing loudly against the killed controller.
        try:
            for name in list(serve.status().applications):
                serve.delete(name)
        finally:
            ray.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)


def deploy(instance: ServeInstance, name: str, **overrides: Any) -> Any:
    from ray import serve

    from cluster.local import wait_routed
    from deployments.app import build_app

    handle = serve.run(
        build_app(party_args(instance.cache_dir, **overrides)),
        name=name,
        route_prefix=f"/{name}",
    )
    wait_routed([f"{instance.url}/{name}"])
    return handle


def delete_apps(*names: str) -> None:
    """A module's parties gone at its end: replicas left running (health checks, pollers)
    would load the machine for every later test, the multi-node scenario's above all."""
    from ray import serve

    for name in names:
        if name in serve.status().applications:
            serve.delete(name)


@pytest.fixture(scope="session")
def parties(serve_instance: ServeInstance) -> ServeInstance:
    """Party A with 3 shards and party B with 2, on the same synthetic snapshot."""
    deploy(serve_instance, "a", num_shards=3)
    deploy(serve_instance, "b", num_shards=2)
    return serve_instance


@pytest.fixture(scope="session")
def pages(parties: ServeInstance):
    from morphogen.snapshot.synthetic import synthetic_pages

    return synthetic_pages(11, 0, NUM_PAGES)


def apply_changes(model: np.ndarray, changes: list[tuple[int, str, bytes]]) -> np.ndarray:
    """The matrix after `changes` (what the servers must serve)."""
    model = model.copy()
    for page, kind, raw in changes:
        data = np.zeros(4096, np.uint8)
        data[: len(raw)] = np.frombuffer(raw, np.uint8)
        model[page] = model[page] ^ data if kind == "diff" else data
    return model


def rotation_snapshots(root: Path, pages: int, next_pages: int, seed: int,
                       token: str) -> tuple[Path, Path]:
    """An admin setup under `root`: snapshots `base` (`pages`) and `next` (`next_pages`, the
    rotation's target) in one allowed directory, and a token file. Returns both paths."""
    snaps = root / "snaps"
    build_synthetic(snaps / "base", pages, seed=seed, epoch_id=1, progress=False)
    build_synthetic(snaps / "next", next_pages, seed=seed + 1, epoch_id=1, progress=False)
    token_file = root / "token"
    token_file.write_text(token)
    return snaps, token_file


def chain_owner(url: str, root: Path) -> Any:
    """Version 1 of an owner directory (root/owner) of the state of the node at `url`, as the
    chain recipe makes it: `records keygen` (root/o.key, root/o.pub), `chain export`,
    `chain build`. Returns its `OwnerTable`."""
    from cluster.cli import main
    from morphogen.keyword.owner import OwnerTable

    assert main(["records", "keygen", "--out", str(root / "o.key")]) == 0
    assert main(["chain", "export", "--rpc", url, "--out", str(root / "s.jsonl")]) == 0
    assert main(["chain", "build", "--state", str(root / "s.jsonl"), "--signing-key",
                 str(root / "o.key"), "--out", str(root / "owner"),
                 "--min-records", "1024"]) == 0
    return OwnerTable(root / "owner")


def following_parties(instance: ServeInstance, owner: Any, root: Path, token: str,
                      shards: dict[str, int], **overrides: Any) -> list[str]:
    """Parties (name -> shards) serving `owner`'s version 1 that take a follower's
    publications: admin token `token`, an epoch log each, rotations under root/rot. Their
    URLs."""
    (root / "token").write_text(token)
    (root / "rot").mkdir(exist_ok=True)
    urls = []
    for name, n in shards.items():
        deploy(instance, name, snapshot=str(owner.snapshot_dir(1)), num_shards=n,
               admin_token_file=str(root / "token"), epoch_log_dir=str(root / f"log-{name}"),
               admin_snapshot_dir=str(root / "rot"), **overrides)
        urls.append(instance.app_url(name))
    return urls


def chain_follower(rpc: Any, root: Path, urls: list[str], token: str,
                   max_updates: int | None = None, **kw: Any) -> Any:
    """A follower of `rpc` into root/owner, publishing to the parties at `urls`
    (`following_parties`) with the owner's key root/o.key."""
    from cluster.parties import HttpParties
    from morphogen.chain.follow import Follower
    from morphogen.client.admin import AdminClient
    from morphogen.keyword.owner import OwnerTable
    from morphogen.keyword.signing import load_signing_key

    return Follower(rpc, OwnerTable(root / "owner"),
                    HttpParties([AdminClient(u, token) for u in urls], 30.0, max_updates),
                    load_signing_key(root / "o.key"), snapshot_dir=str(root / "rot"), **kw)
