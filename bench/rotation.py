"""Snapshot rotation under query load: how long the switch takes, what throughput it costs.

Two parties (A and B, `--shards` CPU shards each) serve a synthetic snapshot of `--pages` pages
while `--clients` threads fetch random pages privately through `PirClient` without pause. After
a measured stretch of steady load, `POST /admin/snapshot` switches both parties (concurrently)
to a second snapshot of the same size; the load continues for another stretch. Every accepted
answer is checked against the page of the epoch it names (zero wrong pages expected).

Reported: rotation wall time per party (request to response: checksum verification of the
whole new snapshot, two-phase switch of every shard), private queries per second (one
3-key query to each party per fetch) before, during and after the rotation, and a timeline.
Results: `bench/results/rotation.csv` (timeline), `rotation_summary.json`, `rotation.png`.

    python bench/rotation.py             # 256 MiB snapshots, 2 shards, 4 clients
    python bench/rotation.py --quick     # 16 MiB, short stretches (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
TOKEN = "rotation-bench-admin-token-" + os.urandom(8).hex()
BIN_S = 0.5


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class _Load:
    """Client threads fetching pages; every accepted page is checked against its epoch."""

    def __init__(self, url_a: str, url_b: str, clients: int, num_pages: int,
                 seeds: dict[int, int]) -> None:
        self.url_a, self.url_b = url_a, url_b
        self.num_pages = num_pages
        self.seeds = seeds  # epoch id -> synthetic seed of its snapshot
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.done: list[tuple[float, float, int]] = []  # (start, completion time, epoch)
        self.errors: list[tuple[float, str]] = []
        self.wrong = 0
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(clients)]

    def _expected(self, epoch: int, page: int) -> bytes:
        from morphogen.snapshot.synthetic import synthetic_pages

        return synthetic_pages(self.seeds[epoch], page, page + 1)[0].tobytes()

    def _run(self, seed: int) -> None:
        from morphogen.client import PirClient, PirError, RetryPolicy

        rng = random.Random(seed)
        retry = RetryPolicy(attempts=6, backoff_s=0.05, max_backoff_s=1.0)
        with PirClient(self.url_a, self.url_b, retry=retry, timeout_s=120,
                       encoding="msgpack") as c:
            while not self.stop.is_set():
                wanted = [rng.randrange(self.num_pages) for _ in range(3)]
                t0 = time.monotonic()
                try:
                    epoch, got = c.get_with_epoch(wanted)
                except PirError as exc:
                    with self.lock:
                        self.errors.append((time.monotonic(), type(exc).__name__))
                    continue
                bad = sum(g != self._expected(epoch, p) for p, g in zip(wanted, got, strict=True))
                with self.lock:
                    self.done.append((t0, time.monotonic(), epoch))
                    self.wrong += bad

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(300)

    def count(self, t0: float, t1: float) -> int:
        with self.lock:
            return sum(1 for _, t, _ in self.done if t0 <= t < t1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=65536, help="snapshot pages (65536 = 256 MiB)")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--clients", type=int, default=4, help="client threads fetching pages")
    ap.add_argument("--steady", type=float, default=15.0,
                    help="seconds of measured load before and after the rotation")
    ap.add_argument("--quick", action="store_true", help="16 MiB, short stretches")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.pages, args.steady = 4096, 4.0

    from cluster import local
    from morphogen.client.admin import AdminClient
    from morphogen.config import PartyConfig
    from morphogen.snapshot.manifest import MANIFEST_FILE
    from morphogen.snapshot.source import ensure_synthetic
    from morphogen.snapshot.synthetic import build_synthetic

    cores = os.cpu_count() or 2
    mib = args.pages * 4096 / 2**20
    cache = os.environ.get("MORPHOGEN_CACHE_DIR") or tempfile.gettempdir() + "/morphogen-bench"
    rot_dir = Path(cache) / "rotation"
    next_name = f"next-p{args.pages}-s1"
    if not (rot_dir / next_name / MANIFEST_FILE).is_file():
        _log(f"[bench] building the second snapshot ({mib:.0f} MiB)")
        build_synthetic(rot_dir / next_name, args.pages, seed=1, epoch_id=2, progress=True)
    workdir = Path(tempfile.mkdtemp(prefix="morphogen-rot-"))
    token_file = workdir / "token"
    token_file.write_text(TOKEN)
    cfg_args = {
        "synthetic_pages": args.pages,
        "synthetic_seed": 0,
        "synthetic_epoch": 1,
        "cache_dir": cache,
        "num_shards": args.shards,
        "engine": "cpu",
        "engine_options": {"threads": max(1, cores // args.shards)},
        "shard_num_cpus": 0.1,
        "router_num_cpus": 0.1,
        "graceful_shutdown_timeout_s": 1.0,
        "admin_token_file": str(token_file),
        "admin_snapshot_dir": str(rot_dir),
    }
    ensure_synthetic(PartyConfig(**cfg_args), progress=True)
    seeds = {1: 0, 2: 1}

    from ray import serve

    from deployments.app import build_app

    rotation: dict[str, float] = {}
    verify: dict[str, float] = {}
    marks: dict[str, float] = {}
    with local.running(num_cpus=max(2, cores), disable_auth=True) as cluster:
        for name in ("ra", "rb"):
            t = time.monotonic()
            serve.run(build_app({**cfg_args, "epoch_log_dir": str(workdir / f"log-{name}")}),
                      name=name, route_prefix=f"/{name}")
            _log(f"[bench] party {name} deployed in {time.monotonic() - t:.1f}s")
        url_a, url_b = cluster.app_url("/ra"), cluster.app_url("/rb")
        local.wait_routed([url_a, url_b])
        load = _Load(url_a, url_b, args.clients, args.pages, seeds)
        load.start()
        time.sleep(min(3.0, args.steady / 2))  # warm-up: page cache, connections, JIT
        marks["before"] = time.monotonic()
        time.sleep(args.steady)

        def rotate(url: str, key: str) -> None:
            with AdminClient(url, TOKEN) as adm:
                t = time.monotonic()
                res = adm.snapshot(next_name)
                rotation[key] = time.monotonic() - t
                verify[key] = float(res.get("verify_seconds", float("nan")))
                assert res["epoch_id"] == 2, res

        _log("[bench] rotating both parties")
        marks["rotate"] = time.monotonic()
        threads = [threading.Thread(target=rotate, args=(u, k))
                   for u, k in ((url_a, "a"), (url_b, "b"))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        marks["rotated"] = time.monotonic()
        time.sleep(args.steady)
        marks["end"] = time.monotonic()
        load.finish()
        for name in ("ra", "rb"):
            serve.delete(name)

    before = load.count(marks["before"], marks["rotate"]) / (marks["rotate"] - marks["before"])
    during_s = marks["rotated"] - marks["rotate"]
    during = load.count(marks["rotate"], marks["rotated"]) / during_s
    after = load.count(marks["rotated"], marks["end"]) / (marks["end"] - marks["rotated"])
    # fetches started once both parties had switched: all on the new epoch (fetches in flight
    # during the switch may finish on the old one, which they started on)
    epochs_after = {e for t, _, e in load.done if t >= marks["rotated"]}
    summary = {
        "pages": args.pages,
        "snapshot_mib": round(mib, 1),
        "shards": args.shards,
        "clients": args.clients,
        "cores": cores,
        "rotation_s_a": round(rotation.get("a", float("nan")), 3),
        "rotation_s_b": round(rotation.get("b", float("nan")), 3),
        "verify_s_a": round(verify.get("a", float("nan")), 3),
        "verify_s_b": round(verify.get("b", float("nan")), 3),
        "rotation_window_s": round(during_s, 3),
        "qps_before": round(before, 2),
        "qps_during": round(during, 2),
        "qps_after": round(after, 2),
        "fetches": len(load.done),
        "wrong_pages": load.wrong,
        "failed_fetches": len(load.errors),
        "epochs_started_after_rotation": sorted(epochs_after),
        "quick": args.quick,
    }

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "rotation_quick" if args.quick else "rotation"
    t0 = marks["before"]
    bins: dict[int, list[int]] = {}
    for _, t, e in load.done:
        if t >= t0:
            bins.setdefault(int((t - t0) / BIN_S), [0, 0])[0 if e == 1 else 1] += 1
    rows = [{"t_s": round(i * BIN_S, 2), "qps_epoch1": round(v[0] / BIN_S, 2),
             "qps_epoch2": round(v[1] / BIN_S, 2)} for i, v in sorted(bins.items())]
    import csv

    with open(out / f"{stem}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["t_s", "qps_epoch1", "qps_epoch2"])
        w.writeheader()
        w.writerows(rows)
    (out / f"{stem}_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if not args.no_plot and rows:
        _plot(rows, marks, out / f"{stem}.png",
              f"rotation of {mib:.0f} MiB under load ({args.shards} shards, {args.clients} "
              f"clients, {cores} cores)")
    _log(json.dumps(summary, indent=2))
    ok = load.wrong == 0 and epochs_after == {2}
    return 0 if ok else 1


def _plot(rows: list[dict], marks: dict[str, float], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _log("matplotlib not installed: no plot")
        return
    t = [r["t_s"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(t, [r["qps_epoch1"] for r in rows], width=BIN_S, align="edge", label="epoch 1")
    ax.bar(t, [r["qps_epoch2"] for r in rows], width=BIN_S, align="edge",
           bottom=[r["qps_epoch1"] for r in rows], label="epoch 2 (new snapshot)")
    ax.axvspan(marks["rotate"] - marks["before"], marks["rotated"] - marks["before"],
               color="C3", alpha=0.2, label="rotation in progress")
    ax.set_xlabel("seconds")
    ax.set_ylabel("private queries / s")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    _log(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
