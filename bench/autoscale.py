"""Autoscaling under stepped load, on a fake multi-node cluster (or a real one, `--address`).

Party A runs autoscaled: its router on the offered load it holds (morphogen.party.autoscaling), its
two shards on Serve's ongoing-requests policy, one logical GPU per shard replica (`placement:
gpu`, CPU engine), so added replicas need worker nodes that the Ray autoscaler adds (type
`{"CPU": 1, "GPU": 4}`, 0..2 of them; the head has no GPU). Party B, on fixed replicas, is the
second server. Client threads read random pages through both parties (real HTTP, real DPF keys)
and check every page against the matrix of the epoch the answer names; the number of threads
follows `--steps`; the high step is held (up to `--hold-s` longer) until an added shard replica
has served and the publications have returned, however slow the machine. With `--publish`,
both parties take update batches and a rotation while the load is high: they must reach every
replica, including those started meanwhile.

Every second: replicas of each deployment of A, alive worker nodes, queries/s, p50/p99 latency.

    python bench/autoscale.py                 # 2 -> 12 -> 2 threads, 45 s each, CSV + PNG
    python bench/autoscale.py --quick --json summary.json   # the multi-node test's run

Results: bench/results/autoscale.csv / .png / autoscale_summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import RESULTS, machine_label, percentile, plot, write_csv  # noqa: E402
from bench._node_caches import node_chunks  # noqa: E402
from cluster import fake_cluster, local  # noqa: E402
from morphogen.client import PirClient, PirError, PirUnavailable  # noqa: E402
from morphogen.client.admin import AdminClient  # noqa: E402
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages  # noqa: E402

TOKEN = "autoscale-bench-admin-token-0123456789"
MIN_SHARD_REPLICAS = 2
# the high step goes on this long after the first added shard replica serves (its q/s)
SEEN_SCALED_S = 8.0
# Serve reports replica and handle load every second instead of every ten (set on every node).
FAST_METRICS = {
    "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1",
    "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1",
}


def party_configs(snaps: str, logs: str, caches: Path, pages: int) -> tuple[dict, dict]:
    """Snapshots and logs by URI (an S3 prefix): no node sees them on a disk. Each node
    caches the chunks it fetches in a directory of its own (`{node}`), as on separate
    machines; the admin token comes from the environment every node gets."""
    common: dict[str, Any] = {
        "snapshot": f"{snaps}/base",
        "num_shards": 2,
        "engine": "cpu",
        "engine_options": {"threads": 1},
        "shard_num_cpus": 0.1,
        "router_num_cpus": 0.1,
        "admin_token_file": None,
        "admin_token_env": "MORPHOGEN_ADMIN_TOKEN",
        "admin_snapshot_dir": snaps,
        "snapshot_cache_dir": str(caches / "{node}"),
        "health_check_period_s": 2.0,
        "graceful_shutdown_timeout_s": 1.0,
        "retry_backoff_ms": 50.0,
        "scan_attempts": 5,
        "fold_interval_s": 0.5,
    }
    scaled = {"upscale_delay_s": 2.0, "downscale_delay_s": 20.0, "look_back_period_s": 11.0}
    party_a = {
        **common,
        "placement": "gpu",  # one (logical) GPU per shard replica: only worker nodes have them
        "epoch_log_dir": f"{logs}/a",
        # two replicas of each shard fill the first worker node's 4 GPUs: any replica more
        # needs a node the autoscaler adds
        # target below one scan a replica: the routers coalesce what they hold into fewer
        # scans, and with 1.0 a CI run on 2 cores kept both shards at 2 replicas through the
        # whole 3-minute hold of the high step
        "shard_autoscaling": {"min_replicas": MIN_SHARD_REPLICAS, "max_replicas": 4,
                              "target": 0.6, **scaled},
        "router_autoscaling": {"min_replicas": 1, "max_replicas": 3, "target": 1.0, **scaled},
    }
    party_b = {**common, "placement": "cpu", "epoch_log_dir": f"{logs}/b"}
    return party_a, party_b


class Load:
    """Client threads in closed loops; every accepted page checked against its epoch."""

    def __init__(self, url_a: str, url_b: str, models: dict[int, np.ndarray]) -> None:
        self.urls = (url_a, url_b)
        self.models = models
        self.lock = threading.Lock()
        self.done: list[tuple[float, float]] = []  # (finish time, latency)
        self.checked = 0
        self.wrong = 0
        self.refused = 0
        # answers of an epoch whose publication had not returned yet when they came back:
        # checked once every publication has (`check_late`)
        self.late: list[tuple[int, int, bytes]] = []
        self._threads: list[tuple[threading.Thread, threading.Event]] = []

    def resize(self, n: int) -> None:
        while len(self._threads) < n:
            stop = threading.Event()
            t = threading.Thread(target=self._run, args=(len(self._threads), stop), daemon=True)
            t.start()
            self._threads.append((t, stop))
        while len(self._threads) > n:
            t, stop = self._threads.pop()
            stop.set()

    def _run(self, seed: int, stop: threading.Event) -> None:
        rng = random.Random(seed)
        with PirClient(*self.urls, timeout_s=60) as client:
            while not stop.is_set():
                start = time.monotonic()
                try:
                    page = rng.randrange(256)
                    epoch, got = client.get_with_epoch([page])
                except PirError:
                    with self.lock:
                        self.refused += 1
                    time.sleep(0.1)
                    continue
                end = time.monotonic()
                model = self.models.get(epoch)
                with self.lock:
                    self.done.append((end, end - start))
                    if model is None:
                        self.late.append((epoch, page, got[0]))
                        continue
                    self.checked += 1
                    self.wrong += 0 if got[0] == model[page].tobytes() else 1

    def check_late(self) -> None:
        with self.lock:
            for epoch, page, got in self.late:
                model = self.models.get(epoch)
                self.checked += 1
                self.wrong += 0 if model is not None and got == model[page].tobytes() else 1
            self.late.clear()

    def window(self, since: float, until: float) -> tuple[float, float, float]:
        with self.lock:
            lat = [d for t, d in self.done if since <= t < until]
        if not lat:
            return 0.0, 0.0, 0.0
        return len(lat) / (until - since), percentile(lat, 50), percentile(lat, 99)


def replica_counts(app: str) -> dict[str, int]:
    from ray import serve

    deployments = serve.status().applications[app].deployments
    return {name: int(d.replica_states.get("RUNNING", 0)) for name, d in deployments.items()}


def worker_nodes() -> int:
    import ray

    return sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) > 0)


def _retried(call: Any, attempts: int = 8) -> Any:
    """An admin call re-sent on a refusal that changed nothing (503 while replicas start, 409
    while another step holds the stage) and on a router replica dying under it (Serve answers
    a 500: routers scale down while the publications run, and a replica past its graceful
    shutdown is killed mid-request). Every publication here carries its own id, so a re-sent
    one the party had already taken is answered as done, never applied twice."""
    for attempt in range(attempts):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001
            again = isinstance(exc, PirUnavailable | httpx.TransportError) or getattr(
                exc, "status", None) in (409, 503)
            if not again or attempt == attempts - 1:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


def publish(url_a: str, url_b: str, models: dict[int, np.ndarray], model: np.ndarray,
            rng: random.Random, batches: int) -> dict[str, Any]:
    """Update batches and a rotation, the same on both parties, while the load runs."""
    out: dict[str, Any] = {}
    with AdminClient(url_a, TOKEN) as adm_a, AdminClient(url_b, TOKEN) as adm_b:
        for i in range(batches):
            page = rng.randrange(256)
            data = rng.randbytes(4096)
            model = model.copy()
            model[page] = np.frombuffer(data, np.uint8)
            change = [(page, "data", data)]
            pub = f"autoscale-{i}"
            res = [_retried(lambda adm=adm, change=change, pub=pub: adm.updates(change, pub))
                   for adm in (adm_a, adm_b)]
            if res[0]["identity"] != res[1]["identity"]:
                raise RuntimeError("parties diverged")
            models[res[0]["epoch_id"]] = model
            if i == batches // 2:
                rot = [_retried(lambda adm=adm: adm.snapshot("next", "autoscale-rotation"))
                       for adm in (adm_a, adm_b)]
                model = synthetic_pages(32, 0, 300)
                models[rot[0]["epoch_id"]] = model
                out["rotation_epoch"] = rot[0]["epoch_id"]
            time.sleep(0.5)
        out["head"] = _retried(adm_a.status)["epoch_log_head"]["identity"]
    return out


def every_replica_at(url: str, identity: str) -> tuple[bool, list[str]]:
    with AdminClient(url, TOKEN) as adm:
        shards = _retried(adm.status)["shards"]
    replicas = [r for s in shards for r in s["replicas"]]
    return all(r["identity"] == identity for r in replicas), [r["node_id"] for r in replicas]


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    from deployments.app import build_app

    steps = [(int(c), float(s)) for c, s in (x.split(":") for x in args.steps.split(","))]
    work = Path(tempfile.mkdtemp(prefix="mg-autoscale-"))
    bucket, env, s3 = object_store(args)
    env = {**env, **FAST_METRICS, "MORPHOGEN_ADMIN_TOKEN": TOKEN}
    os.environ.update(env)  # this process (uploads, the driver) and, below, every node
    snaps = f"s3://{bucket}/snaps"
    for name, seed in (("base", 31), ("next", 32)):
        build_synthetic(work / name, 300, seed=seed, epoch_id=1, progress=False,
                        chunk_pages=32)
        upload(work / name, f"{snaps}/{name}")
        shutil.rmtree(work / name)  # the bucket is the only copy: no node can read a path
    fake = None
    if args.address is None:
        fake = fake_cluster.start(env=env)
    rows: list[dict[str, Any]] = []
    try:
        cluster = local.start(address=args.address or fake.address, disable_auth=True)
        cfg_a, cfg_b = party_configs(snaps, f"s3://{bucket}/logs", work / "node-cache", 300)
        serve.run(build_app(cfg_b), name="b", route_prefix="/b")
        serve.run(build_app(cfg_a), name="a", route_prefix="/a")
        url_a, url_b = cluster.app_url("/a"), cluster.app_url("/b")
        local.wait_routed([url_a, url_b])
        models = {1: synthetic_pages(31, 0, 300)}
        load = Load(url_a, url_b, models)
        t0 = time.monotonic()
        nodes_at_start = worker_nodes()
        published: dict[str, Any] = {}
        publisher: threading.Thread | None = None
        high = max(c for c, _ in steps)
        marks: dict[str, float] = {}
        for i, (threads, seconds) in enumerate(steps):
            load.resize(threads)
            step_start = time.monotonic()
            if threads == high and "rise" not in marks:
                marks["rise"] = step_start - t0
                base = replica_counts("a")
                if args.publish:
                    def publishing() -> None:
                        try:
                            published.update(publish(url_a, url_b, models, models[1],
                                                     random.Random(3), args.batches))
                        except Exception as exc:  # noqa: BLE001 - reported in the summary
                            published["error"] = f"{type(exc).__name__}: {exc}"

                    publisher = threading.Thread(target=publishing)
                    publisher.start()
            if i > 0 and threads < steps[i - 1][0]:
                marks.setdefault("fall", step_start - t0)
            while not step_done(threads == high, time.monotonic() - step_start, seconds,
                                args.hold_s, marks, publisher, time.monotonic() - t0):
                time.sleep(1.0)
                now = time.monotonic()
                qps, p50, p99 = load.window(now - 1.0, now)
                counts = replica_counts("a")
                rows.append({
                    "t_s": round(now - t0, 1), "threads": threads,
                    "router_replicas": counts.get("router", 0),
                    "shard_0_replicas": counts.get("shard_0", 0),
                    "shard_1_replicas": counts.get("shard_1", 0),
                    "worker_nodes": worker_nodes(), "queries_per_s": round(qps, 1),
                    "p50_ms": round(p50 * 1000, 1), "p99_ms": round(p99 * 1000, 1),
                })
                if args.verbose:
                    print(rows[-1], flush=True)
                if "rise" in marks and "serving" not in marks and (
                    counts.get("shard_0", 0) > base.get("shard_0", 0)
                    or counts.get("shard_1", 0) > base.get("shard_1", 0)
                ):
                    marks["serving"] = now - t0
        if publisher is not None:
            publisher.join(120)
        # checked where the replicas are (before the scale-down): each one, including those
        # started during the publications, must serve the log's head
        scaled_up = replica_counts("a")
        at_head, nodes = (every_replica_at(url_a, published["head"]) if published.get("head")
                          else (None, []))
        load.resize(0)
        time.sleep(1.0)
        load.check_late()
        # after the load: wait for the scale-down (replicas back to their minimum, fewer nodes)
        deadline = time.monotonic() + args.settle_s
        while time.monotonic() < deadline:
            counts = replica_counts("a")
            at_min = counts.get("router") == 1 and all(
                v == MIN_SHARD_REPLICAS for k, v in counts.items() if k.startswith("shard_"))
            if at_min and worker_nodes() <= nodes_at_start:
                marks["scaled_down"] = time.monotonic() - t0
                break
            time.sleep(1.0)
        load.check_late()  # answers that were still in flight at the load's end
        head_node = ray.get_runtime_context().get_node_id()
        high_rows = [r for r in rows if r["threads"] == high]
        summary = {
            "machine": machine_label(),
            "steps": args.steps,
            "checked_pages": load.checked,
            "wrong_pages": load.wrong,
            "refused": load.refused,
            "worker_nodes_start": nodes_at_start,
            "worker_nodes_max": max(r["worker_nodes"] for r in rows),
            "router_replicas_max": max(r["router_replicas"] for r in rows),
            "shard_replicas_max": max(max(r["shard_0_replicas"], r["shard_1_replicas"])
                                      for r in rows),
            "seconds_to_new_shard_replica": (round(marks["serving"] - marks["rise"], 1)
                                             if "serving" in marks else None),
            "high_step_s": (round(marks["fall"] - marks["rise"], 1)
                            if "fall" in marks and "rise" in marks else None),
            "qps_high_first_5s": _mean([r["queries_per_s"] for r in high_rows[:5]]),
            "qps_high_last_5s": _mean([r["queries_per_s"] for r in high_rows[-5:]]),
            "seconds_to_scale_down": (round(marks["scaled_down"] - marks["fall"], 1)
                                      if "scaled_down" in marks and "fall" in marks else None),
            "published": published,
            "replicas_when_published": scaled_up,
            "every_replica_at_head": at_head,
            "replicas_on_head_node": sum(1 for n in nodes if n == head_node),
            "replica_nodes": sorted(set(nodes)),
            # every node fetched its shards' chunks into a cache of its own
            "node_caches": sorted(p.name for p in (work / "node-cache").iterdir()
                                  if any(p.glob("*/chunk-*"))),
            "node_chunks": node_chunks(work / "node-cache", {"a": 2, "b": 2}),
        }
        serve.delete("a")
        serve.delete("b")
        ray.shutdown()
    finally:
        if fake is not None:
            fake.stop()
        if s3 is not None:
            s3.__exit__(None, None, None)
        shutil.rmtree(work, ignore_errors=True)
    return {"rows": rows, "summary": summary}


def object_store(args: argparse.Namespace) -> tuple[str, dict[str, str], Any]:
    """(a bucket, the environment that reaches it, the server to stop or None): an S3
    protocol server on loopback for the fake cluster, or `--s3-endpoint` (credentials from
    the environment) for a real one."""
    if args.s3_endpoint:
        return args.s3_bucket, {"AWS_ENDPOINT_URL": args.s3_endpoint}, None
    from tests.s3.server import running_s3_server

    server = running_s3_server()
    s3 = server.__enter__()
    s3.boto().create_bucket(Bucket=args.s3_bucket)
    return args.s3_bucket, s3.env(), server


def upload(local_dir: Path, uri: str) -> None:
    import obstore

    from morphogen.storage import open_location

    loc = open_location(uri)
    for f in ("manifest.json", "pages.bin"):
        obstore.put(loc.store, loc.key(f), (local_dir / f).read_bytes())


def step_done(is_high: bool, elapsed: float, seconds: float, hold_s: float,
              marks: dict[str, float], publisher: threading.Thread | None, now: float) -> bool:
    """A step ends after its seconds; the high step is held longer (up to `hold_s` more) until
    a new shard replica has served for a while and the publications have returned, so that how
    long the scale-up takes on a given machine decides when the load falls, not a guess."""
    if elapsed < seconds:
        return False
    if not is_high or elapsed >= seconds + hold_s:
        return True
    scaled = "serving" in marks and now - marks["serving"] >= SEEN_SCALED_S
    return scaled and (publisher is None or not publisher.is_alive())


def _mean(xs: list[float]) -> float:
    return round(sum(xs) / len(xs), 1) if xs else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--address", default=None, help="an existing cluster (else a fake one)")
    p.add_argument("--steps", default="2:45,12:45,2:45", help="threads:seconds,...")
    p.add_argument("--quick", action="store_true", help="shorter steps (the multi-node test)")
    p.add_argument("--no-publish", dest="publish", action="store_false",
                   help="no updates or rotation during the load")
    p.add_argument("--batches", type=int, default=8, help="update batches during the load")
    p.add_argument("--hold-s", type=float, default=60.0,
                   help="hold the high step up to this much longer, until shards scaled up")
    p.add_argument("--settle-s", type=float, default=120.0, help="wait for the scale-down")
    p.add_argument("--json", default=None, help="also write the summary here")
    p.add_argument("--verbose", action="store_true", help="print every sample")
    p.add_argument("--out", default=str(RESULTS / "autoscale"), help="CSV/PNG path stem")
    p.add_argument("--s3-endpoint", default=None,
                   help="snapshots and logs on this S3 endpoint (default: a loopback server)")
    p.add_argument("--s3-bucket", default="morphogen-autoscale")
    args = p.parse_args()
    if args.quick:
        args.steps, args.hold_s = "2:8,14:30,0:1", 180.0
    result = run(args)
    summary = result["summary"]
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if not args.quick:
        out = Path(args.out)
        write_csv(out.with_suffix(".csv"), result["rows"])
        out.with_name(out.name + "_summary.json").write_text(json.dumps(summary, indent=2))
        plot(out.with_suffix(".png"), lambda ax: _draw(ax, result["rows"]))
    return 0 if summary["wrong_pages"] == 0 else 1


def _draw(ax: Any, rows: list[dict[str, Any]]) -> None:
    t = [r["t_s"] for r in rows]
    ax.plot(t, [r["queries_per_s"] for r in rows], label="queries/s", color="tab:blue")
    ax.set_xlabel("seconds")
    ax.set_ylabel("queries/s")
    twin = ax.twinx()
    twin.step(t, [r["shard_0_replicas"] for r in rows], label="shard_0 replicas", color="tab:red")
    twin.step(t, [r["router_replicas"] for r in rows], label="router replicas",
              color="tab:orange")
    twin.step(t, [r["worker_nodes"] for r in rows], label="worker nodes", color="tab:green")
    twin.step(t, [r["threads"] / 4 for r in rows], label="client threads / 4", color="gray",
              linestyle=":")
    twin.set_ylabel("replicas / nodes")
    ax.set_title("Autoscaling under stepped load (fake multi-node cluster)")
    lines = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(lines, [line.get_label() for line in lines], loc="upper left", fontsize=8)


if __name__ == "__main__":
    sys.exit(main())
