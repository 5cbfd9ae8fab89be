"""The sliced scan's tuning switches and prefetch rule compared on one matrix, one device, one run.

    python bench/gpu/variants.py [--gib 16] [--runs 7] [--out DIR]

Loads one random matrix of `--gib` GiB once, then for each configuration (the switches of
sliced.SLICED_TUNING, and sliced.PREFETCH_MAX_GROUPS: the most key groups a launch may have and
still use the prefetching kernel) compiles the engine's program with it, swaps it into the loaded
shard and times Q = 1, 2, 4, 8, 16, 32 queries of 3 keys a call (median of `--runs`, CUDA
events). The default configuration's two parties' answers XOR to the target pages; every other
configuration's answers equal the default's byte for byte. The read kernel over the same
buffer is the yardstick.

Writes DIR/variants_<device>.csv and DIR/best.env (`MORPHOGEN_GPU_TUNING=...` of the switches
that give the best geometric mean over Q, for the runs that follow).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, write_csv  # noqa: E402
from reference_scale import build_pages  # noqa: E402
from scan_gpu import device_slug, query_keys  # noqa: E402

from morphogen.engine import gpu_kernels, sliced  # noqa: E402
from morphogen.engine.gpu import GpuEngine  # noqa: E402

QUERIES = (1, 2, 4, 8, 16, 32)


def label(tuning: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(tuning.items()))


class Bench:
    def __init__(self, shard, engine, pages, runs: int) -> None:
        self.shard, self.engine, self.pages, self.runs = shard, engine, pages, runs
        n = pages.shape[0]
        d = max(1, (n - 1).bit_length())
        rng = np.random.default_rng(7)
        self.sets = {q: query_keys(rng, d, n, q) for q in QUERIES}
        self.reference: dict[int, np.ndarray] = {}

    def use(self, tuning: dict[str, int], max_groups: int) -> float:
        sliced.PREFETCH_MAX_GROUPS = max_groups  # read by plan_sliced_launch at each call
        t = time.perf_counter()
        self.shard._compiled = gpu_kernels.compile_kernels(self.engine.backend, tuning)
        return time.perf_counter() - t

    def measure(self) -> dict[int, dict]:
        out = {}
        for q in QUERIES:
            targets, a, b = self.sets[q]
            got = self.shard.scan(a)  # also the warm-up of this kernel and shape
            if q not in self.reference:  # the default configuration: checked against the pages
                both = got ^ self.shard.scan(b)
                ok = all(np.array_equal(both[i], self.pages[t]) for i, t in enumerate(targets))
                self.reference[q] = got.copy()
            else:
                ok = bool(np.array_equal(got, self.reference[q]))
            timings = [self.shard.scan_timed(a)[1] for _ in range(self.runs)]
            out[q] = {
                "kernel_ms": statistics.median(t.kernel_ms for t in timings),
                "call_ms": statistics.median(t.total_ms for t in timings),
                "correct": ok,
            }
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=16.0)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    n = int(args.gib * (1 << 30)) // 4096
    t = time.perf_counter()
    pages = build_pages(n, np.random.default_rng(3))
    engine = GpuEngine(pool_size=1, kernel="sliced")
    shard = engine.load(pages)
    device = engine.device_name
    print(f"{device}: {n} pages ({n * 4096 / 2**30:.1f} GiB) built and loaded in "
          f"{time.perf_counter() - t:.1f} s")
    read_ms, _ = shard.read_pages_timed(repeats=args.runs)
    print(f"read kernel {read_ms:.3f} ms = {n * 4096 / read_ms / 1e9:.3f} TB/s")

    default = gpu_kernels.kernel_tuning()
    default_groups = sliced.PREFETCH_MAX_GROUPS
    configs = [(default, default_groups)]
    configs += [({**default, "SLICED_FOLD_IMAD": f}, 0) for f in (0, 1)]  # no prefetch
    configs += [({**default, "SLICED_PREFETCH_ROUNDS": r}, 6) for r in (1, 2, 3, 4)]
    configs += [({**default, "SLICED_PREFETCH_BULK": 0}, 6)]
    bench = Bench(shard, engine, pages, args.runs)
    rows: list[dict] = []
    results: dict[str, dict[int, dict]] = {}
    failed = False
    for tuning, groups in configs:
        name = f"{label(tuning)},PREFETCH_MAX_GROUPS={groups}"
        if name in results:
            continue
        secs = bench.use(tuning, groups)
        res = results[name] = bench.measure()
        for q, r in res.items():
            failed |= not r["correct"]
            rows.append({"device": device, "config": name, "pages": n, "queries": q,
                         "keys": 3 * q, "kernel_ms": round(r["kernel_ms"], 3),
                         "call_ms": round(r["call_ms"], 3),
                         "queries_s": round(q / r["call_ms"] * 1e3, 1),
                         "x_q1": round(q * res[1]["call_ms"] / r["call_ms"], 2),
                         "frac_read": round(read_ms / r["kernel_ms"], 3),
                         "read_ms": round(read_ms, 3), "correct": r["correct"]})
        print(f"{name} (compiled in {secs:.1f} s)")
        print("    " + "  ".join(
            f"Q={q} {r['call_ms']:.3f} ms x{q * res[1]['call_ms'] / r['call_ms']:.2f}"
            f"{'' if r['correct'] else ' WRONG'}" for q, r in res.items()), flush=True)
    sliced.PREFETCH_MAX_GROUPS = default_groups
    write_csv(args.out / f"variants_{device_slug(device)}.csv", rows)

    def gmean(res: dict[int, dict]) -> float:
        return math.exp(sum(math.log(r["call_ms"]) for r in res.values()) / len(res))

    best = min(configs, key=lambda c: gmean(results[f"{label(c[0])},PREFETCH_MAX_GROUPS={c[1]}"]))
    print(f"best geometric mean: {label(best[0])}, PREFETCH_MAX_GROUPS={best[1]}")
    (args.out / "best.env").write_text(f"MORPHOGEN_GPU_TUNING={label(best[0])}\n")
    for q in QUERIES:  # the fastest configuration at each Q
        name = min(results, key=lambda k: results[k][q]["call_ms"])
        print(f"Q={q:2d}: fastest {name} {results[name][q]['call_ms']:.3f} ms")
    shard.close()
    print("variants:", "ANSWERS DIFFER" if failed else "every answer equal")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
