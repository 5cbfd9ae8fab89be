"""What a party's log compaction costs as the updates since its last rotation pile up.

A party that takes a block every 12 s and never rotates compacts its epoch log every 64
publications (`COMPACT_AFTER` records) and folds the updates it drops into a fold. Folds are
kept in levels (`compaction.fold_run`): a compaction writes one new fold, of what it drops and
of the newest folds no larger than that. The baseline, measured in the same run on the same
blocks, is the rule before levels: every compaction folded everything since the rotation into
one fold (`--rules single`; here that rule is the same code choosing a longer run).

This script publishes block-shaped batches (XOR diffs of `--changed-bytes` bytes a page, at
`--pages` pages scattered over a matrix of `--matrix-pages`) into a real directory log, as a
router does (propose, commit, digest version 2), and times each compaction: all of it, and
the part that holds the writers' lock (the fold is composed before the lock is taken); with
the pages of the fold it writes, the folds it leaves and the process's resident memory at its
peak during the compaction (its high-water mark, reset before: `cluster.chain_import`'s
helpers, as bench/chain_build.py). Block sizes: 2,918 and 4,672 pages are what a 3,000-record
block touches at 1 M and 16 M records (bench/chain_scale.py).

    python bench/log_fold.py                        # 4,672-page blocks, 1,024 of them
    python bench/log_fold.py --pages 2918 --blocks 256 --rules levels
Results: bench/results/log_fold.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
RESULTS = ROOT / "bench" / "results"


def block(rng: np.random.Generator, n: int, matrix: int, changed: int):
    """A block-shaped batch: `n` distinct pages, `changed` bytes of each XORed."""
    from morphogen.constants import PAGE_SIZE
    from morphogen.protocol import sparse
    from morphogen.protocol.changes import ChangeBatch

    pages = np.sort(rng.permutation(np.unique(rng.integers(0, matrix, 2 * n)))[:n])
    dense = np.zeros((len(pages), PAGE_SIZE), np.uint8)
    at = rng.integers(0, PAGE_SIZE - changed, len(pages))
    for row, a in zip(dense, at.tolist(), strict=True):
        row[a:a + changed] = rng.integers(1, 256, changed, dtype=np.uint8)
    packed = sparse.pack(dense)
    return ChangeBatch.from_packed(pages.astype(np.int64), np.zeros(len(pages), bool),
                                   packed).with_digest(2)


def run(rule: str, args: argparse.Namespace) -> dict:
    from _common import build_updates

    from cluster.chain_import import _peak_reset, _status_mib
    from morphogen.publication import compaction
    from morphogen.publication.log import EpochLog

    real_run = compaction.fold_run

    def single(state):  # the rule before levels: the new fold takes every fold before it
        run = real_run(state)
        live = state.live()
        folds = [e for e in live if e.kind == "fold"]
        return folds + [e for e in run if e.kind != "fold"] if run else []

    compaction.fold_run = single if rule == "single" else real_run
    import morphogen.publication.log as log_mod
    log_mod.fold_run = compaction.fold_run
    work = Path(tempfile.mkdtemp(prefix="morphogen-logfold-"))
    rng = np.random.default_rng(1)
    log = EpochLog(work / "log")
    held: list[float] = []
    real_locked = log._locked

    class Timed:
        def __init__(self) -> None:
            self.cm = real_locked()

        def __enter__(self):
            self.t = time.perf_counter()
            return self.cm.__enter__()

        def __exit__(self, *exc):
            held.append(time.perf_counter() - self.t)
            return self.cm.__exit__(*exc)

    log._locked = Timed  # type: ignore[method-assign]
    rows = []
    publish_s = []
    try:
        for i in range(args.blocks):
            batch = block(rng, args.pages, args.matrix_pages, args.changed_bytes)
            t = time.perf_counter()
            p = log.propose(f"p-{i:024x}", "updates:" + batch.digest, "bench", 60.0,
                            build_updates(batch))
            log.decide(p, "commit")
            publish_s.append(time.perf_counter() - t)
            if not log.worth_compacting(read=False):
                continue
            before = _peak_reset()
            held.clear()
            t = time.perf_counter()
            dropped = log.compact()
            took = time.perf_counter() - t
            peak = _status_mib("VmHWM")
            folds = [e for e in log.live() if e.kind == "fold"]
            rows.append({
                "after_blocks": i + 1,
                "fold_pages_written": int(folds[-1].count) if folds else 0,
                "folds": [int(f.count) for f in folds],
                "fold_files_mib": round(sum((work / "log" / f.blob).stat().st_size
                                            for f in folds) / 2**20, 2),
                # every batch file, and those no record names any more: what a compaction
                # dropped stays until the next one, for a reader of the records it replaced
                **batch_files(work / "log", log),
                "compact_s": round(took, 3),
                "held_s": round(held[-1], 4) if held else None,
                "rss_before_mib": None if before is None else round(before, 1),
                "rss_peak_mib": None if before is None else round(peak, 1),
                "records_dropped": dropped,
            })
            print(rule, json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        compaction.fold_run = log_mod.fold_run = real_run
    compact = [r["compact_s"] for r in rows]
    return {
        "publish_s_median": round(float(np.median(publish_s)), 4),
        "compact_s_median": round(float(np.median(compact)), 3) if rows else None,
        "compact_s_max": max(compact) if rows else None,
        "compact_s_total": round(sum(compact), 2),
        "held_s_max": max((r["held_s"] for r in rows if r["held_s"] is not None),
                          default=None),
        "fold_pages_written_total": sum(r["fold_pages_written"] for r in rows),
        "pages_published": args.pages * args.blocks,
        "compactions": rows,
    }


def batch_files(directory: Path, log) -> dict[str, float]:
    from morphogen.publication.records import BLOB_NAME

    named = {e.blob for e in log.entries()}
    sizes = {p.name: p.stat().st_size for p in directory.iterdir()
             if BLOB_NAME.fullmatch(p.name)}
    return {"batch_files_mib": round(sum(sizes.values()) / 2**20, 2),
            "unnamed_files_mib": round(sum(v for k, v in sizes.items() if k not in named)
                                       / 2**20, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=4672, help="pages a block touches")
    ap.add_argument("--blocks", type=int, default=1024)
    ap.add_argument("--matrix-pages", type=int, default=1 << 24)
    ap.add_argument("--changed-bytes", type=int, default=40)
    ap.add_argument("--rules", default="single,levels",
                    help="comma-separated: single (the baseline), levels")
    ap.add_argument("--out", type=Path, default=RESULTS / "log_fold.json")
    args = ap.parse_args(argv)
    out = {"pages_a_block": args.pages, "blocks": args.blocks,
           "matrix_pages": args.matrix_pages, "changed_bytes_a_page": args.changed_bytes,
           "rules": {}}
    for rule in args.rules.split(","):
        out["rules"][rule] = run(rule, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({rule: {k: v for k, v in r.items() if k != "compactions"}
                      for rule, r in out["rules"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
