"""What a party's fold of one block's page updates costs, against the shard's size.

A CPU shard of N pages (64 MiB, 256 MiB, 1 GiB by default) takes one block's updates (3,000
pages anywhere in it, as a mainnet block's data and tree pages spread over a table) as one
commit, then folds them: in place (`host_fold.write_in_place`: the words each update changes
XORed into its page under the scan gate) and, on the same updates, the chunk-copy fold it
replaced (`host_fold.fold_on_host`: every touched chunk of `fold_chunk_pages` copied). Each
update changes `--changed-bytes` bytes of its page (40 by default, a block's slot or hash;
4096: every byte). The whole-page XOR of the same updates into the same pages (the in-place
write before it skipped unchanged words: `pages[rows] ^= diffs`) is timed on the plan too, as
the baseline, and undone. Medians of several runs per size, each on the shard as the commit
left it; the answers of both folded versions are checked against the model.

    python bench/fold_cost.py                       # 2^14, 2^16 and 2^18 pages
    python bench/fold_cost.py --pages 16384 --runs 5 --changed-bytes 4096
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


def one_size(work: Path, n: int, runs: int, changed: int) -> dict:
    from morphogen.party.host_fold import fold_on_host, plan_in_place
    from morphogen.protocol import dpf
    from morphogen.protocol.changes import PageUpdate
    from morphogen.snapshot.reader import Snapshot
    from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages

    build_synthetic(work / f"s{n}", n, seed=1, epoch_id=1, progress=False)
    snap = Snapshot.open(work / f"s{n}")
    model = synthetic_pages(1, 0, n)
    rng = np.random.default_rng(n)
    in_place, copied, whole = [], [], []
    state = _state(snap, n)
    for run in range(runs):
        pages = rng.choice(n, min(BLOCK_PAGES, n), replace=False)
        diffs = np.zeros((len(pages), 4096), np.uint8)
        for row in diffs:
            at = int(rng.integers(0, 4096 - changed + 1))
            row[at:at + changed] = rng.integers(1, 256, changed, np.uint8)
        state.prepare_updates(run + 2, [PageUpdate(int(p), d.tobytes())
                                        for p, d in zip(pages, diffs, strict=True)])
        state.commit(run + 2)
        model[pages] ^= diffs
        base = state.current
        t = time.perf_counter()
        copy = fold_on_host(base, state._engine, CHUNK)  # the old way, not swapped in
        copied.append(time.perf_counter() - t)
        whole.append(_whole_page_xor(plan_in_place(base)))
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
            "whole_page_xor_s_median": round(statistics.median(whole), 4),
            "changed_bytes_a_page": changed}


def _whole_page_xor(writes) -> float:
    """Seconds of the whole-page XOR of the plan's updates into their pages; then undone (a
    second XOR), so the fold after it starts from the same pages."""
    seconds = 0.0
    for owner, rows, diffs, mine in writes:
        was = owner.flags.writeable
        owner.flags.writeable = True
        try:
            t = time.perf_counter()
            owner[rows] ^= diffs[mine]
            seconds += time.perf_counter() - t
            owner[rows] ^= diffs[mine]
        finally:
            owner.flags.writeable = was
    return seconds


def engine_reference(model: np.ndarray, keys) -> np.ndarray:
    from morphogen import engine

    return engine.create("reference").load(model, 0).scan(keys)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, nargs="+", default=[1 << 14, 1 << 16, 1 << 18])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--changed-bytes", type=int, default=40,
                    help="bytes each update changes (1..4096)")
    args = ap.parse_args(argv)
    if not 1 <= args.changed_bytes <= 4096:
        ap.error("--changed-bytes is 1..4096")
    work = Path(tempfile.mkdtemp(prefix="morphogen-fold-"))
    try:
        rows = []
        for n in args.pages:
            rows.append(one_size(work, n, args.runs, args.changed_bytes))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    small, large = rows[0], rows[-1]
    result = {"block_pages": BLOCK_PAGES, "chunk_pages": CHUNK, "runs": args.runs,
              "changed_bytes_a_page": args.changed_bytes, "sizes": rows,
              "ratio_largest_to_smallest": {
                  "in_place": round(large["in_place_s_median"] / small["in_place_s_median"], 2),
                  "chunk_copy": round(large["chunk_copy_s_median"]
                                      / small["chunk_copy_s_median"], 2)},
              "whole_page_xor_over_in_place": [
                  round(r["whole_page_xor_s_median"] / r["in_place_s_median"], 2)
                  for r in rows]}
    RESULTS.mkdir(exist_ok=True)
    name = "fold_cost.json" if args.changed_bytes == 40 else \
        f"fold_cost_{args.changed_bytes}b.json"
    (RESULTS / name).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("ratio_largest_to_smallest",
                                             "whole_page_xor_over_in_place")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
