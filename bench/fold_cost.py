"""What a party's fold of one block's page updates costs, against the shard's size.

A CPU shard of N pages (64 MiB, 256 MiB, 1 GiB by default) takes one block's updates (3,000
pages anywhere in it, as a mainnet block's data and tree pages spread over a table) as one
commit, then folds them: in place (`host_fold.write_in_place`: each update XORed into its page
under the scan gate) and, on the same updates, the chunk-copy fold it replaced
(`host_fold.fold_on_host`: every touched chunk of `fold_chunk_pages` copied). Medians of
several runs per size, each on the shard as the commit left it; the answers of both folded
versions are checked against the model.

    python bench/fold_cost.py                       # 2^14, 2^16 and 2^18 pages
    python bench/fold_cost.py --pages 16384 --runs 5
Results: bench/results/fold_cost.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"
BLOCK_PAGES = 3_000
CHUNK = 1024  # PartyConfig.fold_chunk_pages' default


def _state(snap, n: int):
    from morphogen import engine
    from morphogen.party.epoch import ShardState

    return ShardState(engine.create("cpu", threads=1), snap, 0, n, chunk_pages=CHUNK)


def one_size(work: Path, n: int, runs: int) -> dict:
    from morphogen.party.host_fold import fold_on_host
    from morphogen.protocol import dpf
    from morphogen.protocol.changes import PageUpdate
    from morphogen.snapshot.reader import Snapshot
    from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages

    build_synthetic(work / f"s{n}", n, seed=1, epoch_id=1, progress=False)
    snap = Snapshot.open(work / f"s{n}")
    model = synthetic_pages(1, 0, n)
    rng = np.random.default_rng(n)
    in_place, copied = [], []
    state = _state(snap, n)
    for run in range(runs):
        pages = rng.choice(n, min(BLOCK_PAGES, n), replace=False)
        diffs = rng.integers(0, 256, (len(pages), 4096), np.uint8)
        state.prepare_updates(run + 2, [PageUpdate(int(p), d.tobytes())
                                        for p, d in zip(pages, diffs, strict=True)])
        state.commit(run + 2)
        model[pages] ^= diffs
        base = state.current
        t = time.perf_counter()
        copy = fold_on_host(base, state._engine, CHUNK)  # the old way, not swapped in
        copied.append(time.perf_counter() - t)
        t = time.perf_counter()
        assert state.fold_pending() == len(pages)
        in_place.append(time.perf_counter() - t)
        targets = [int(pages[0]), int(pages[-1]), 0, n - 1]
        keys = [dpf.generate_keys(snap.domain_bits, p)[0] for p in targets]
        want = engine_reference(model, keys)
        _, got = state.scan(keys)
        assert np.array_equal(got, want), "the in-place fold changed an answer"
        assert np.array_equal(copy.scan(dpf.KeyBatch.from_keys(keys)), want)
        for seg in copy.segments:
            if seg not in base.segments:
                seg.scanner.close()
    state.close()
    return {"pages": n, "mib": n * 4096 >> 20, "block_pages": min(BLOCK_PAGES, n),
            "in_place_s_median": round(statistics.median(in_place), 4),
            "chunk_copy_s_median": round(statistics.median(copied), 4),
            "in_place_mib_written": round(min(BLOCK_PAGES, n) * 4096 / 2**20, 1)}


def engine_reference(model: np.ndarray, keys) -> np.ndarray:
    from morphogen import engine

    return engine.create("reference").load(model, 0).scan(keys)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, nargs="+", default=[1 << 14, 1 << 16, 1 << 18])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="morphogen-fold-"))
    try:
        rows = []
        for n in args.pages:
            rows.append(one_size(work, n, args.runs))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    small, large = rows[0], rows[-1]
    result = {"block_pages": BLOCK_PAGES, "chunk_pages": CHUNK, "runs": args.runs,
              "sizes": rows,
              "ratio_largest_to_smallest": {
                  "in_place": round(large["in_place_s_median"] / small["in_place_s_median"], 2),
                  "chunk_copy": round(large["chunk_copy_s_median"]
                                      / small["chunk_copy_s_median"], 2)}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fold_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["ratio_largest_to_smallest"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
