"""The cuckoo placement every keyword table is built with (`keyword.build._place`), alone, at
growing sizes: how its rate falls once the buckets' counters and slots leave the caches, which
a build or an import of 16 M records does not show and one of mainnet's 1.56 B storage
records meets.

Records with three random candidate buckets each, storage-page buckets (85 slots of 48 bytes),
the build's load at room 1.25 (0.8); the placement of the same input timed `--runs` times,
the median; every record placed. The import's funnel (`bench/chain_build.py`) places its
tables with this function.

    python bench/place_scale.py                       # 4 M, 16 M, 64 M, 256 M records
    python bench/place_scale.py --sizes 1000000 --runs 1
Results: bench/results/place_scale.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"
SLOTS = 85  # a storage page: 4,096 bytes of 48-byte slots
LOAD = 0.8


def run(sizes: list[int], runs: int) -> dict:
    from morphogen.keyword.build import MAX_KICKS, _place

    _place(np.zeros((1, 3), np.int64), SLOTS, np.full((1, SLOTS), -1, np.int64),
           np.zeros(1, np.int32), MAX_KICKS, 1)  # compiled or loaded before the clock
    rows = []
    for n in sizes:
        buckets = int(n / (SLOTS * LOAD))
        cands = np.random.default_rng(1).integers(0, buckets, (n, 3), dtype=np.int64)
        times = []
        for _ in range(runs):
            occ = np.full((buckets, SLOTS), -1, np.int64)
            fill = np.zeros(buckets, np.int32)
            t = time.perf_counter()
            left = _place(cands, SLOTS, occ, fill, MAX_KICKS, 7)
            times.append(time.perf_counter() - t)
            if left != -1:
                raise SystemExit(f"{n} records: record {left} was not placed")
            del occ, fill
        s = statistics.median(times)
        rows.append({"records": n, "buckets": buckets,
                     "slot_array_mib": round(buckets * SLOTS * 8 / 2**20),
                     "seconds": round(s, 3), "records_per_s": round(n / s),
                     "seconds_all": [round(x, 3) for x in times]})
        print(f"{n:>13,} records, {buckets:,} buckets: {s:.3f} s, "
              f"{n / s / 1e6:.1f} M records/s", flush=True)
        del cands
    return {"slots_per_bucket": SLOTS, "load": LOAD, "runs": runs, "sizes": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+",
                    default=[4_000_000, 16_000_000, 64_000_000, 256_000_000])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=None, help="results file (default: place_scale.json)")
    args = ap.parse_args(argv)
    result = run(args.sizes, args.runs)
    RESULTS.mkdir(exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / "place_scale.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
