"""What a party's log compaction costs as the updates since its last rotation pile up.

A party that takes a block every 12 s and never rotates compacts its epoch log every 64
publications (`COMPACT_AFTER` records): it folds every committed update since the last rotation
but the newest 64 into one batch (`compaction._fold`, `changes.composed`), the last fold
included. So each compaction reads and rewrites the net change of everything since the
rotation, not of the 64 blocks it adds. This script publishes block-shaped batches (XOR diffs
of `--changed-bytes` bytes a page, at `--pages` pages scattered over a matrix of
`--matrix-pages`) into a real directory log, as a router does (propose, commit, digest version
2), and times each compaction, with the distinct pages its fold then holds, the fold file's
bytes and the process's resident memory at its peak during the compaction (its high-water mark,
reset before: `cluster.chain_import._peak_reset`, as bench/chain_build.py). Block sizes: 2,918
and 4,672 pages are what a 3,000-record block touches at 1 M and 16 M records
(bench/chain_scale.py).

    python bench/log_fold.py                        # 4,672-page blocks, 256 of them
    python bench/log_fold.py --pages 2918 --blocks 128
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=4672, help="pages a block touches")
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--matrix-pages", type=int, default=1 << 24)
    ap.add_argument("--changed-bytes", type=int, default=40)
    ap.add_argument("--out", type=Path, default=RESULTS / "log_fold.json")
    args = ap.parse_args(argv)
    from _common import build_updates

    from cluster.chain_import import _peak_reset, _status_mib
    from morphogen.publication.log import EpochLog

    work = Path(tempfile.mkdtemp(prefix="morphogen-logfold-"))
    rng = np.random.default_rng(1)
    log = EpochLog(work / "log")
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
            t = time.perf_counter()
            dropped = log.compact()
            took = time.perf_counter() - t
            peak = _status_mib("VmHWM")
            fold = [e for e in log.live() if e.kind == "fold"]
            blob = (work / "log" / fold[0].blob) if fold else None
            rows.append({
                "after_blocks": i + 1,
                "fold_pages": int(fold[0].count) if fold else 0,
                "fold_file_mib": round(blob.stat().st_size / 2**20, 2)
                if blob is not None and blob.exists() else None,
                "compact_s": round(took, 3),
                "rss_before_mib": None if before is None else round(before, 1),
                "rss_peak_mib": None if before is None else round(peak, 1),
                "records_dropped": dropped,
            })
            print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {"pages_a_block": args.pages, "blocks": args.blocks,
           "matrix_pages": args.matrix_pages, "changed_bytes_a_page": args.changed_bytes,
           "publish_s_median": round(float(np.median(publish_s)), 4),
           "compactions": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "compactions"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
