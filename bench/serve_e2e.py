"""End-to-end benchmark of one party over HTTP, next to the engine alone on the same snapshot.

For each concurrency (clients in flight) and batch size (queries per request) it measures
queries per second and p50/p99 request latency:

- `engine`: the scan engine in this process over the whole snapshot, each of the `c` clients
  scanning its own request's keys (the same query mix, no Ray, no HTTP);
- `engine_merged`: the same work as ONE scan per round (what perfect coalescing would reach);
- `e2e_coalesce`: HTTP -> Serve router -> shards, coalescing on;
- `e2e_direct`: the same with coalescing off (one shard pass per request).

Keys are made before timing (key generation is the client's cost, not the server's). Results go
to `bench/results/serve_e2e.csv` and `serve_e2e.png`.

    python bench/serve_e2e.py            # 64 MiB, 2 shards, c in 1/8/16, batch 1..32
    python bench/serve_e2e.py --quick    # a small smoke run (seconds)
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import percentile  # noqa: E402
from bench._http_load import http_load  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Point:
    mode: str
    concurrency: int
    batch: int
    requests: int
    queries: int
    seconds: float
    qps: float
    p50_ms: float
    p99_ms: float


def _point(mode: str, c: int, b: int, lat: list[float], seconds: float) -> Point:
    ms = [x * 1000 for x in lat]
    return Point(mode, c, b, len(lat), len(lat) * b, round(seconds, 3),
                 round(len(lat) * b / seconds, 2), round(percentile(ms, 50), 2),
                 round(percentile(ms, 99), 2))


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- keys


def make_key_pool(domain_bits: int, num_pages: int, n_keys: int, seed: int = 1) -> list[bytes]:
    from morphogen.protocol.dpf import generate_keys

    rng = random.Random(seed)
    return [generate_keys(domain_bits, rng.randrange(num_pages))[0].to_bytes()
            for _ in range(n_keys)]


def request_keys(pool: list[bytes], batch: int, i: int) -> list[list[bytes]]:
    n = len(pool)
    start = (i * 3 * batch) % n
    flat = [pool[(start + j) % n] for j in range(3 * batch)]
    return [flat[j : j + 3] for j in range(0, len(flat), 3)]


# --------------------------------------------------------------------------- engine alone


def bench_engine(snapshot, engine_name: str, threads: int | None, pool: list[bytes],
                 concurrencies: list[int], batches: list[int], duration: float) -> list[Point]:
    from morphogen import engine as engines
    from morphogen.protocol.dpf import DpfKey, KeyBatch

    opts = {"threads": threads} if threads and engine_name == "cpu" else {}
    scanner = engines.create(engine_name, **opts).load(snapshot.pages(), 0)
    parsed = [DpfKey.from_bytes(k) for k in pool]
    scanner.scan(KeyBatch.from_keys(parsed[:3]))  # warm-up (JIT, page cache)

    def batch_for(b: int, i: int) -> KeyBatch:
        flat = [k for q in request_keys(pool, b, i) for k in q]
        return KeyBatch.from_keys([DpfKey.from_bytes(k) for k in flat])

    points = []
    for c in concurrencies:
        for b in batches:
            prepared = [batch_for(b, i) for i in range(max(c, 8))]
            lat: list[float] = []
            stop = time.monotonic() + duration
            lock = threading.Lock()

            def worker(w: int, prepared=prepared, lat=lat, stop=stop, lock=lock, step=c) -> None:
                i = w
                while time.monotonic() < stop:
                    t = time.monotonic()
                    scanner.scan(prepared[i % len(prepared)])
                    with lock:
                        lat.append(time.monotonic() - t)
                    i += step

            t0 = time.monotonic()
            ths = [threading.Thread(target=worker, args=(w,)) for w in range(c)]
            for th in ths:
                th.start()
            for th in ths:
                th.join()
            points.append(_point("engine", c, b, lat, time.monotonic() - t0))

            merged = batch_for(b * c, 0)
            lat_m: list[float] = []
            t0 = time.monotonic()
            while time.monotonic() - t0 < duration or not lat_m:
                t = time.monotonic()
                scanner.scan(merged)
                lat_m.append(time.monotonic() - t)
            seconds = time.monotonic() - t0
            # one merged scan answers c requests of b queries each
            p = _point("engine_merged", c, b, lat_m, seconds)
            p.requests, p.queries = len(lat_m) * c, len(lat_m) * c * b
            p.qps = round(p.queries / seconds, 2)
            points.append(p)
            _log(f"  engine        c={c:<3} b={b:<3} {points[-2].qps:9.1f} q/s   "
                 f"merged {p.qps:9.1f} q/s")
    scanner.close()
    return points


# --------------------------------------------------------------------------- end to end


def bench_e2e(cluster, cfg_args: dict, pool: list[bytes], concurrencies: list[int],
              batches: list[int], duration: float,
              cpu_ms: dict[str, dict[str, float]]) -> list[Point]:
    """HTTP load per (mode, c, b); `cpu_ms` gets each point's CPU milliseconds per query by
    process group (where the time went)."""
    from ray import serve

    from cluster import local
    from deployments.app import build_app
    from morphogen.protocol.codec import to_hex

    points = []
    for mode, window in (("e2e_coalesce", cfg_args["coalesce_window_ms"]), ("e2e_direct", 0.0)):
        args = dict(cfg_args, coalesce_window_ms=window)
        t = time.monotonic()
        serve.run(build_app(args), name="bench", route_prefix="/bench")
        _log(f"[bench] deployed {mode} in {time.monotonic() - t:.1f}s")
        url = cluster.app_url("/bench")
        local.wait_routed([url])
        for c in concurrencies:
            for b in batches:
                bodies = []
                for i in range(max(2 * c, 8)):
                    qs = request_keys(pool, b, i)
                    obj = ({"keys": [to_hex(k) for k in qs[0]]} if b == 1 else
                           {"queries": [{"keys": [to_hex(k) for k in q]} for q in qs]})
                    bodies.append(json.dumps(obj).encode())
                lat, seconds, errors, cpu = asyncio.run(http_load(url, bodies, b, c, duration))
                p = _point(mode, c, b, lat, seconds)
                points.append(p)
                _log(f"  {mode:<13} c={c:<3} b={b:<3} {p.qps:9.1f} q/s  p50 {p.p50_ms:7.1f} ms"
                     f"  p99 {p.p99_ms:7.1f} ms" + (f"  ({errors} errors)" if errors else ""))
                if p.queries:
                    per_query = {g: round(1e3 * v / p.queries, 3) for g, v in cpu.items()
                                 if v * 1e3 / p.queries >= 0.01}
                    cpu_ms[f"{mode} c={c} b={b}"] = per_query
                    _log("      CPU ms/query: " + ", ".join(
                        f"{g} {v:.2f}" for g, v in list(per_query.items())[:6]))
        serve.delete("bench")
    return points


# --------------------------------------------------------------------------- output


def write_csv(points: list[Point], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(asdict(points[0])))
        w.writeheader()
        for p in points:
            w.writerow(asdict(p))


def plot(points: list[Point], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conc = sorted({p.concurrency for p in points})
    fig, axes = plt.subplots(1, len(conc), figsize=(5 * len(conc), 4), squeeze=False)
    styles = {"engine": "k--", "engine_merged": "k:", "e2e_coalesce": "C0-o", "e2e_direct": "C3-s"}
    for ax, c in zip(axes[0], conc, strict=True):
        for mode, style in styles.items():
            pts = sorted((p for p in points if p.mode == mode and p.concurrency == c),
                         key=lambda p: p.batch)
            if pts:
                ax.plot([p.batch for p in pts], [p.qps for p in pts], style, label=mode)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("queries per request")
        ax.set_ylabel("queries / s")
        ax.set_title(f"concurrency {c}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(points: list[Point]) -> dict[str, float]:
    def qps(mode: str, c: int, b: int) -> float:
        return next((p.qps for p in points if (p.mode, p.concurrency, p.batch) == (mode, c, b)),
                    float("nan"))

    c = max(p.concurrency for p in points)
    on, off = qps("e2e_coalesce", c, 1), qps("e2e_direct", c, 1)
    eng, merged = qps("engine", c, 1), qps("engine_merged", c, 1)
    return {
        "concurrency": c,
        "e2e_coalesce_qps": on,
        "e2e_direct_qps": off,
        "engine_qps": eng,
        "engine_merged_qps": merged,
        "coalesce_vs_engine": round(on / eng, 3) if eng else float("nan"),
        "coalesce_vs_engine_merged": round(on / merged, 3) if merged else float("nan"),
        "coalesce_vs_direct": round(on / off, 3) if off else float("nan"),
    }


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=16384, help="snapshot pages (16384 = 64 MiB)")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--engine", default="cpu")
    ap.add_argument("--concurrency", default="1,8,16")
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per point")
    ap.add_argument("--window-ms", type=float, default=2.0)
    ap.add_argument("--max-in-flight", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small and short (a smoke run)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.pages, args.concurrency, args.batches, args.duration = 2048, "1,16", "1,8", 1.0

    concurrencies = [int(x) for x in args.concurrency.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 2
    threads = max(1, cores // args.shards)

    from cluster import local
    from morphogen.config import PartyConfig
    from morphogen.snapshot.source import open_snapshot

    cache = os.environ.get("MORPHOGEN_CACHE_DIR") or tempfile.gettempdir() + "/morphogen-bench"
    cfg_args = {
        "synthetic_pages": args.pages,
        "cache_dir": cache,
        "num_shards": args.shards,
        "engine": args.engine,
        "engine_options": {"threads": threads} if args.engine == "cpu" else {},
        "shard_num_cpus": 0.1,
        "router_num_cpus": 0.1,
        "coalesce_window_ms": args.window_ms,
        "coalesce_max_in_flight": args.max_in_flight,
        "graceful_shutdown_timeout_s": 1.0,
    }
    cfg = PartyConfig(**cfg_args)
    snap = open_snapshot(cfg, progress=True)
    _log(f"[bench] snapshot {snap.num_pages} pages ({snap.num_pages * 4096 / 2**20:.0f} MiB), "
         f"domain {snap.domain_bits}, {args.shards} shards, {cores} cores")
    pool = make_key_pool(snap.domain_bits, snap.num_pages, 3 * 32 * 4)

    _log("[bench] engine alone")
    points = bench_engine(snap, args.engine, cores if args.engine == "cpu" else None, pool,
                          concurrencies, batches, args.duration)
    _log("[bench] end to end over HTTP")
    with local.running(num_cpus=max(2, cores), disable_auth=True) as cluster:
        cpu_ms: dict[str, dict[str, float]] = {}
        points += bench_e2e(cluster, cfg_args, pool, concurrencies, batches, args.duration,
                            cpu_ms)
    snap.close()

    stem = "serve_e2e_quick" if args.quick else "serve_e2e"
    write_csv(points, out / f"{stem}.csv")
    s = summary(points)
    s["cpu_ms_per_query"] = cpu_ms
    s.update(pages=args.pages, shards=args.shards, cores=cores, engine=args.engine,
             window_ms=args.window_ms, quick=args.quick)
    (out / f"{stem}_summary.json").write_text(json.dumps(s, indent=2) + "\n")
    if not args.no_plot:
        plot(points, out / f"{stem}.png",
             f"one party over HTTP, {args.pages * 4096 // 2**20} MiB, {args.shards} shards, "
             f"{cores} cores")
    _log(json.dumps(s, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
