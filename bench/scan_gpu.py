"""GPU scan engine against the card's read bandwidth, measured in the same run.

    python bench/scan_gpu.py [--gib 16] [--matrix PATH] [--queries 1,2,4,8,16,32]
                             [--concurrency 1,8,16] [--runs 5]

Needs CuPy and a CUDA device (exits with status 2 and a message otherwise). The matrix is a
snapshot: `--matrix` names one, else a synthetic one of `--gib` GiB is written once under
`--workdir` and reused. Measures, on one GpuShard:
  * read: the plain vectorised read kernel over the same device buffer (the yardstick);
  * scan: Q = 1, 2, 4, 8, 16, 32 queries of 3 keys per call, time per call (median), matrix
    bytes per time (TB/s), queries/s; every answer is checked: the two parties' answers of
    each query XOR to the target page read back from the snapshot (checksum_ok);
  * concurrency: N threads issuing Q=1 calls through the workspace pool, each call its own
    launch on its own stream (the engine never merges callers). A Q=1 launch already reads
    at the card's bandwidth, so launches side by side only share it;
  * coalesced: N clients issuing Q=1 calls through the router's coalescer
    (morphogen/party/coalesce.py, the party's defaults: 2 ms window, 96 keys a call, as many calls
    in flight as the pool has workspaces) in front of the same shard, as a party's router
    drives it; every answer is compared with the one its keys got alone. Merging is where
    concurrency pays: end to end through Serve, bench/serve_e2e.py.
Writes bench/results/scan_gpu_<device>_<kernel>.csv and .png (scan_gpu_h100_sliced.csv).
Targets (same run, same device): Q=1 >= 0.85 x read bandwidth; Q=8 >= 5 x the queries/s of Q=1;
coalesced concurrency 8 >= 2 x concurrency 1.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, write_csv  # noqa: E402

from morphogen.constants import KEYS_PER_QUERY  # noqa: E402
from morphogen.engine import gpu_available  # noqa: E402
from morphogen.engine.sliced import sliced_digest  # noqa: E402
from morphogen.protocol import dpf  # noqa: E402


def open_matrix(args: argparse.Namespace):
    from morphogen.snapshot.reader import Snapshot
    from morphogen.snapshot.synthetic import build_synthetic

    if args.matrix is not None:
        return Snapshot.open(args.matrix)
    num_pages = int(args.gib * (1 << 30)) // 4096
    out = args.workdir / f"synthetic-{num_pages}"
    manifest = out / "manifest.json"
    if manifest.exists():
        snap = Snapshot.open(out)
        if snap.num_pages == num_pages:
            return snap
    print(f"writing a synthetic {args.gib} GiB snapshot to {out} (once)")
    build_synthetic(out, num_pages, seed=args.seed, progress=True)
    return Snapshot.open(out)


def query_keys(rng, d: int, num_pages: int, queries: int):
    targets = [int(rng.integers(num_pages)) for _ in range(queries * KEYS_PER_QUERY)]
    pairs = [dpf.generate_keys(d, t) for t in targets]
    a = dpf.KeyBatch.from_keys([p[0] for p in pairs])
    b = dpf.KeyBatch.from_keys([p[1] for p in pairs])
    return targets, a, b


def checksum_ok(shard, pages, targets, batch_a, batch_b, answer_a=None) -> bool:
    a = shard.scan(batch_a) if answer_a is None else answer_a
    b = shard.scan(batch_b)
    got = a ^ b
    return all(np.array_equal(got[i], pages[t]) for i, t in enumerate(targets))


def timed(fn, runs: int) -> tuple[float, list]:
    fn()  # warm
    times, outs = [], []
    for _ in range(runs):
        t = time.perf_counter()
        outs.append(fn())
        times.append(time.perf_counter() - t)
    return statistics.median(times), outs


def run_coalesced(shard, keysets, clients: int, seconds: float) -> tuple[float, float, int]:
    """(queries/s, mean ms per call, calls) with `clients` asyncio callers issuing Q=1 scans
    through a Coalescer, as the router does; every answer checked against `shard.scan` alone."""
    import asyncio

    from morphogen.party.coalesce import Coalescer

    alone = [shard.scan(k) for k in keysets]

    async def scan_merged(parts):
        return None, await asyncio.to_thread(shard.scan, dpf.KeyBatch.concat(parts))

    async def main() -> tuple[int, float, float]:
        co = Coalescer(scan_merged, window_s=0.002, max_items=96,
                       max_in_flight=shard.pool_size)
        stop = time.perf_counter() + seconds
        counts, lat = [0] * clients, [0.0] * clients

        async def client(i: int) -> None:
            j = i
            while time.perf_counter() < stop:
                t = time.perf_counter()
                _, got = await co.submit(keysets[j % len(keysets)])
                lat[i] += time.perf_counter() - t
                if not np.array_equal(got, alone[j % len(keysets)]):
                    raise AssertionError(f"coalesced answer {j} differs from its own scan")
                counts[i] += 1
                j += clients

        t0 = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        return sum(counts), time.perf_counter() - t0, sum(lat)

    calls, wall, total = asyncio.run(main())
    return calls / wall, 1e3 * total / max(calls, 1), calls


def run_concurrency(shard, keysets, threads: int, seconds: float) -> tuple[float, float, int]:
    """(queries/s, mean ms per call, calls) with `threads` callers issuing Q=1 scans."""
    stop = time.perf_counter() + seconds
    counts = [0] * threads
    lat = [0.0] * threads
    errors: list[BaseException] = []
    start_line = threading.Barrier(threads)

    def worker(i: int) -> None:
        try:
            start_line.wait()
            j = i
            while time.perf_counter() < stop:
                t = time.perf_counter()
                shard.scan(keysets[j % len(keysets)])
                lat[i] += time.perf_counter() - t
                counts[i] += 1
                j += threads
        except BaseException as exc:  # reported after the run
            errors.append(exc)

    t0 = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    calls = sum(counts)
    return calls / wall, 1e3 * sum(lat) / max(calls, 1), calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=16.0, help="synthetic matrix size")
    ap.add_argument("--matrix", type=Path, default=None, help="an existing snapshot")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/morphogen-bench"))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--queries", default="1,2,4,8,16,32")
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--seconds", type=float, default=5.0, help="per concurrency level")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pool-size", type=int, default=None,
                    help="launches in flight (default: the engine's)")
    ap.add_argument("--key-group-max", type=int, default=16)
    ap.add_argument("--kernel", choices=("fused", "sliced"), default=None,
                    help="scan kernel (default: the engine's)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    if not gpu_available():
        print("scan_gpu: needs CuPy and a CUDA device; none here, nothing measured",
              file=sys.stderr)
        return 2
    from morphogen.engine.gpu import GpuEngine

    queries = [int(q) for q in args.queries.split(",")]
    levels = [int(c) for c in args.concurrency.split(",")]
    snap = open_matrix(args)
    pages = snap.pages()
    n, d = snap.num_pages, snap.domain_bits
    gib = n * 4096 / (1 << 30)

    engine = GpuEngine(pool_size=args.pool_size, key_group_max=args.key_group_max,
                       kernel=args.kernel)
    device = engine.device_name
    t = time.perf_counter()
    shard = engine.load(pages)
    print(f"{device}: {n} pages ({gib:.2f} GiB), d={d}, loaded and warmed in "
          f"{time.perf_counter() - t:.1f} s, pool {shard.pool_size}")

    if engine.layout == "sliced":
        host_digest = sliced_digest(pages, 0)
    else:
        folded = np.zeros(2, np.uint64)
        for start in range(0, n, 1 << 16):
            chunk = pages[start : start + (1 << 16)].reshape(-1).view(np.uint64).reshape(-1, 2)
            folded ^= np.bitwise_xor.reduce(chunk, axis=0)
        host_digest = folded.tobytes()
    read_ms, digest = shard.read_pages_timed(repeats=args.runs)
    read_tbs = n * 4096 / (read_ms / 1e3) / 1e12
    base = {"device": device, "kernel": engine.layout, "pages": n, "gib": round(gib, 3)}
    rows = [{**base, "kind": "read", "queries": 0, "keys": 0, "concurrency": 1,
             "ms": round(read_ms, 3), "tb_s": round(read_tbs, 3), "queries_s": "",
             "frac_read_bw": 1.0, "kernel_ms": round(read_ms, 3), "h2d_ms": "", "d2h_ms": "",
             "checksum_ok": digest == host_digest}]
    print(f"read kernel: {read_ms:.2f} ms, {read_tbs:.3f} TB/s, checksum "
          f"{'ok' if rows[0]['checksum_ok'] else 'MISMATCH'}")

    rng = np.random.default_rng(args.seed)
    for q in queries:
        targets, ka, kb = query_keys(rng, d, n, q)
        secs, outs = timed(lambda ka=ka: shard.scan_timed(ka), args.runs)
        answer, timing = outs[-1]
        ok = checksum_ok(shard, pages, targets, ka, kb, answer)
        tbs = n * 4096 / secs / 1e12
        rows.append({**base, "kind": "scan", "queries": q, "keys": q * KEYS_PER_QUERY,
                     "concurrency": 1, "ms": round(secs * 1e3, 3), "tb_s": round(tbs, 3),
                     "queries_s": round(q / secs, 2), "frac_read_bw": round(tbs / read_tbs, 3),
                     "kernel_ms": round(timing.kernel_ms, 3), "h2d_ms": round(timing.h2d_ms, 3),
                     "d2h_ms": round(timing.d2h_ms, 3), "checksum_ok": ok})
        r = rows[-1]
        print(f"Q={q:2d} ({r['keys']:2d} keys): {r['ms']:8.2f} ms (kernel {r['kernel_ms']:.2f})"
              f"  {tbs:.3f} TB/s = {r['frac_read_bw']:.2f} x read  {r['queries_s']:8.1f} q/s"
              f"  checksum {'ok' if ok else 'MISMATCH'}")

    keysets = [query_keys(rng, d, n, 1)[1] for _ in range(64)]
    for c in levels:
        qps, ms, calls = run_concurrency(shard, keysets, c, args.seconds)
        rows.append({**base, "kind": "concurrency", "queries": 1, "keys": KEYS_PER_QUERY,
                     "concurrency": c, "ms": round(ms, 3),
                     "tb_s": round(qps * n * 4096 / 1e12, 3), "queries_s": round(qps, 2),
                     "frac_read_bw": "", "kernel_ms": "", "h2d_ms": "", "d2h_ms": "",
                     "checksum_ok": ""})
        print(f"concurrency {c:2d}: {qps:8.1f} queries/s, {ms:.2f} ms per call ({calls} calls)")
    for c in levels:
        qps, ms, calls = run_coalesced(shard, keysets, c, args.seconds)
        rows.append({**base, "kind": "coalesced", "queries": 1, "keys": KEYS_PER_QUERY,
                     "concurrency": c, "ms": round(ms, 3),
                     "tb_s": round(qps * n * 4096 / 1e12, 3), "queries_s": round(qps, 2),
                     "frac_read_bw": "", "kernel_ms": "", "h2d_ms": "", "d2h_ms": "",
                     "checksum_ok": True})
        print(f"coalesced   {c:2d}: {qps:8.1f} queries/s, {ms:.2f} ms per call ({calls} calls, "
              "answers checked)")

    by = {(r["kind"], r["queries"], r["concurrency"]): r for r in rows}
    if ("scan", 1, 1) in by:
        print(f"target Q=1 >= 0.85 x read bandwidth: {by[('scan', 1, 1)]['frac_read_bw']:.2f}")
    if ("scan", 1, 1) in by and ("scan", 8, 1) in by:
        ratio = by[("scan", 8, 1)]["queries_s"] / by[("scan", 1, 1)]["queries_s"]
        print(f"target Q=8 >= 5 x Q=1 queries/s: {ratio:.2f}")
    if ("concurrency", 1, 1) in by and ("concurrency", 1, 8) in by:
        ratio = by[("concurrency", 1, 8)]["queries_s"] / by[("concurrency", 1, 1)]["queries_s"]
        print(f"pool alone, concurrency 8 / concurrency 1: {ratio:.2f}")
    if ("concurrency", 1, 1) in by and ("coalesced", 1, 8) in by:
        ratio = by[("coalesced", 1, 8)]["queries_s"] / by[("concurrency", 1, 1)]["queries_s"]
        print(f"target coalesced concurrency 8 >= 2 x concurrency 1: {ratio:.2f}")
    stem = f"scan_gpu_{device_slug(device)}_{engine.layout}"
    write_csv(args.out / f"{stem}.csv", rows)
    draw(args.out / f"{stem}.png", rows, device, gib, read_tbs)
    shard.close()
    return 0 if all(r["checksum_ok"] in (True, "") for r in rows) else 1


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100': the model token of a device name, for file names."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    for w in words:
        if re.fullmatch(r"[a-z]{1,3}\d{2,4}[a-z]?", w) and w not in ("nvidia",):
            return w
    return "-".join(words[:3]) or "gpu"


def draw(path: Path, rows: list[dict], device: str, gib: float, read_tbs: float) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install 'morphogen[bench]')")
        return
    scans = [r for r in rows if r["kind"] == "scan"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    qs = [r["queries"] for r in scans]
    ax1.plot(qs, [r["tb_s"] for r in scans], "o-", label="scan: matrix bytes / time")
    ax1.axhline(read_tbs, color="grey", ls="--", label=f"read kernel {read_tbs:.2f} TB/s")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("queries per call (3 keys each)")
    ax1.set_ylabel("TB/s")
    ax1b = ax1.twinx()
    ax1b.plot(qs, [r["queries_s"] for r in scans], "s-", color="tab:orange", label="queries/s")
    ax1b.set_ylabel("queries/s")
    ax1.legend(loc="lower left")
    ax1b.legend(loc="lower right")
    ax1.set_title(f"{rows[0]['kernel']} scan, {gib:.1f} GiB, {device}")
    for kind, label in (("concurrency", "workspace pool alone"),
                        ("coalesced", "through the router's coalescer")):
        pts = [r for r in rows if r["kind"] == kind]
        ax2.plot([r["concurrency"] for r in pts], [r["queries_s"] for r in pts], "o-",
                 label=label)
    ax2.set_xlabel("concurrent callers (Q=1 each)")
    ax2.set_ylabel("queries/s")
    ax2.set_title("concurrent single-query callers")
    ax2.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
