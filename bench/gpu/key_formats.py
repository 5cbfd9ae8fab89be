"""Both key formats on one GPU shard of 2^24 pages: v1 against packed, same run, same pages.

    python bench/gpu/key_formats.py [--log2-pages 24] [--kernel fused|sliced] [--out DIR]
                                    [--budget-s 150] [--dry-run model|emulator]

The matrix is reference_scale.py's (1 GiB of random pages tiled, each tile stamped), loaded
once in the engine's layout (default the engine's, sliced). For Q = 1, 8, 32 queries a call
(3 keys a query, as reference_scale.py and the router send them) and each format: a warm call,
then `--runs` timed calls, medians of the kernel and the whole call; every answer of both
parties' keys is XORed and compared with the page it targets. The card's read bandwidth is
measured in the same run. The whole script stops starting new measurements once `--budget-s`
seconds have passed since the load finished (what it measured is still written), so the phase
fits its device time. Writes key_formats_<device>_<layout>_<format>.csv, one per format, and
prints the packed / v1 ratio per Q. `--dry-run` runs it on the CuPy fakes of tests/unit at a
small size (its logic, no device).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
from _common import RESULTS, write_csv  # noqa: E402
from reference_scale import build_pages  # noqa: E402
from scan_gpu import device_slug  # noqa: E402

from morphogen.engine.gpu import GpuEngine  # noqa: E402
from morphogen.protocol import dpf  # noqa: E402
from morphogen.protocol.packed import PackedKeyBatch, generate_packed_keys  # noqa: E402

FORMATS = ("v1", "packed")
QUERIES = (1, 8, 32)
KEYS_PER_QUERY = 3


def make_engine(kernel: str | None, dry_run: str | None) -> GpuEngine:
    if dry_run is None:
        return GpuEngine(pool_size=2, kernel=kernel)
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    from _gpu_fakes import FakeBackend

    backend = FakeBackend(mode=dry_run, sm_count=2, blocks_per_sm_value=1)
    return GpuEngine(backend=backend, kernel=kernel or "sliced", pool_size=2)


def key_pairs(fmt: str, d: int, targets: list[int]) -> tuple[object, object]:
    """Both parties' batches for `targets` in format `fmt`."""
    if fmt == "packed":
        pairs = [generate_packed_keys(d, x) for x in targets]
        return tuple(PackedKeyBatch.from_keys([p[i] for p in pairs]) for i in (0, 1))
    pairs = [dpf.generate_keys(d, x) for x in targets]
    return tuple(dpf.KeyBatch.from_keys([p[i] for p in pairs]) for i in (0, 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2-pages", type=int, default=24)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--kernel", choices=("fused", "sliced"), default=None)
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="no new measurement starts after this many seconds past the load")
    ap.add_argument("--dry-run", choices=("model", "emulator"), default=None)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    n, d = 1 << args.log2_pages, args.log2_pages
    rng = np.random.default_rng(45)
    t = time.perf_counter()
    pages = build_pages(n, rng)
    built = time.perf_counter() - t
    engine = make_engine(args.kernel, args.dry_run)
    t = time.perf_counter()
    shard = engine.load(pages)
    start = time.perf_counter()
    device = engine.device_name
    print(f"{device}, {engine.layout} layout, formats {engine.key_formats}: {n} pages "
          f"({n * 4096 / 2**30:.2f} GiB) built in {built:.1f} s, loaded and warmed in "
          f"{start - t:.1f} s")
    read_ms, _ = shard.read_pages_timed(repeats=args.runs)
    read_tbs = n * 4096 / read_ms / 1e9
    print(f"read kernel: {read_ms:.3f} ms = {read_tbs:.3f} TB/s")
    base = {"device": device, "layout": engine.layout, "pages": n}
    rows: dict[str, list[dict[str, object]]] = {f: [] for f in FORMATS}
    qps: dict[tuple[str, int], float] = {}
    failed = False
    for q in QUERIES:
        targets = [int(x) for x in rng.integers(0, n, KEYS_PER_QUERY * q)]
        for fmt in FORMATS:
            if time.perf_counter() - start > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: Q={q} {fmt} not measured")
                continue
            a, b = key_pairs(fmt, d, targets)
            shard.scan_timed(a)  # warm
            timings = [shard.scan_timed(a)[1] for _ in range(args.runs)]
            got = shard.scan(a) ^ shard.scan(b)
            correct = sum(np.array_equal(got[i], pages[x]) for i, x in enumerate(targets))
            failed |= correct != len(targets)
            km = statistics.median(x.kernel_ms for x in timings)
            cm = statistics.median(x.total_ms for x in timings)
            tbs = n * 4096 / km / 1e9
            qps[fmt, q] = q / cm * 1e3
            rows[fmt].append({
                **base, "format": fmt, "queries": q, "keys": len(targets),
                "kernel_ms": round(km, 3), "call_ms": round(cm, 3),
                "queries_s": round(qps[fmt, q], 2), "tb_s": round(tbs, 3),
                "frac_read_bw": round(tbs / read_tbs, 3), "read_tb_s": round(read_tbs, 3),
                "pages_correct": f"{correct}/{len(targets)}"})
            print(f"{fmt:6s} Q={q:2d}: kernel {km:.2f} ms, call {cm:.2f} ms, "
                  f"{qps[fmt, q]:.1f} q/s, {tbs / read_tbs:.2f} x read, pages correct "
                  f"{correct}/{len(targets)}")
    for q in QUERIES:
        if ("v1", q) in qps and ("packed", q) in qps:
            print(f"Q={q:2d}: packed / v1 = {qps['packed', q] / qps['v1', q]:.2f}x")
    if ("packed", 1) in qps and ("packed", 8) in qps:
        print(f"packed: 8 queries a call = {qps['packed', 8] / qps['packed', 1]:.2f}x the q/s "
              f"of one")
    slug = device_slug(device) + ("_dry" if args.dry_run else "")
    for fmt in FORMATS:
        if rows[fmt]:
            write_csv(args.out / f"key_formats_{slug}_{engine.layout}_{fmt}.csv", rows[fmt])
    shard.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
