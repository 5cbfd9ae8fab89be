"""The reference's scale: 2^24 pages (64 GiB) in host memory, scanned on one GPU.

    python bench/gpu/reference_scale.py [--log2-pages 24] [--out DIR]

The reference implementation measured 30.2 ms per query (about 33 queries/s) at 16.8 M pages
on an H100. The matrix is built in RAM by tiling 1 GiB of random pages, each tile stamped with
its index so no two tiles are equal; every answer of Q = 1, 8, 32 queries is checked against
the page it targets (both parties' answers XORed). Writes reference_scale_<device>.csv.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import RESULTS, write_csv  # noqa: E402
from scan_gpu import device_slug  # noqa: E402

from morphogen.engine.gpu import GpuEngine  # noqa: E402
from morphogen.protocol import dpf  # noqa: E402

REFERENCE_MS_PER_QUERY = 30.2


def build_pages(n: int, rng: np.random.Generator) -> np.ndarray:
    tile = min(n, 1 << 18)
    base = np.frombuffer(rng.bytes(tile * 4096), np.uint8).reshape(tile, 4096)
    pages = np.empty((n, 4096), np.uint8)
    for i in range(0, n, tile):
        m = min(tile, n - i)
        pages[i : i + m] = base[:m]
        pages[i : i + m, :4] = np.frombuffer(np.uint32(i // tile).tobytes(), np.uint8)
    return pages


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2-pages", type=int, default=24)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--kernel", choices=("fused", "sliced"), default=None)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    n, d = 1 << args.log2_pages, args.log2_pages
    rng = np.random.default_rng(2)
    t = time.perf_counter()
    pages = build_pages(n, rng)
    built = time.perf_counter() - t
    engine = GpuEngine(pool_size=2, kernel=args.kernel)
    t = time.perf_counter()
    shard = engine.load(pages)
    loaded = time.perf_counter() - t
    device = engine.device_name
    print(f"{device}, {engine.layout} kernel: {n} pages ({n * 4096 / 2**30:.0f} GiB) "
          f"built in {built:.1f} s, loaded and warmed in {loaded:.1f} s")
    read_ms, _ = shard.read_pages_timed(repeats=args.runs)
    read_tbs = n * 4096 / read_ms / 1e9
    print(f"read kernel: {read_ms:.2f} ms = {read_tbs:.3f} TB/s")
    base = {"device": device, "kernel": engine.layout, "pages": n}
    rows = [{**base, "kind": "read", "queries": 0, "kernel_ms": round(read_ms, 3),
             "call_ms": "", "ms_per_query": "", "queries_s": "", "tb_s": round(read_tbs, 3),
             "frac_read_bw": 1.0, "pages_correct": ""}]
    failed = False
    for q in (1, 8, 32):
        targets = [int(x) for x in rng.integers(0, n, 3 * q)]
        pairs = [dpf.generate_keys(d, x) for x in targets]
        a, b = (dpf.KeyBatch.from_keys([p[i] for p in pairs]) for i in (0, 1))
        shard.scan_timed(a)  # warm
        timings = [shard.scan_timed(a)[1] for _ in range(args.runs)]
        got = shard.scan(a) ^ shard.scan(b)
        correct = sum(np.array_equal(got[i], pages[x]) for i, x in enumerate(targets))
        failed |= correct != len(targets)
        km = statistics.median(t.kernel_ms for t in timings)
        cm = statistics.median(t.total_ms for t in timings)
        tbs = n * 4096 / km / 1e9
        rows.append({**base, "kind": "scan", "queries": q, "kernel_ms": round(km, 3),
                     "call_ms": round(cm, 3), "ms_per_query": round(cm / q, 3),
                     "queries_s": round(q / cm * 1e3, 2), "tb_s": round(tbs, 3),
                     "frac_read_bw": round(tbs / read_tbs, 3),
                     "pages_correct": f"{correct}/{len(targets)}"})
        print(f"Q={q:2d}: kernel {km:.2f} ms, call {cm:.2f} ms, {cm / q:.2f} ms/query, "
              f"{q / cm * 1e3:.1f} q/s, {tbs:.3f} TB/s matrix-equivalent "
              f"({tbs / read_tbs:.2f} x read), pages correct {correct}/{len(targets)}")
    q1 = rows[1]["call_ms"]
    print(f"target Q=1 under the reference's {REFERENCE_MS_PER_QUERY} ms: {q1:.2f} ms")
    write_csv(args.out / f"reference_scale_{device_slug(device)}_{engine.layout}.csv", rows)
    shard.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
