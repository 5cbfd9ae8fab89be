"""What a shard replica that starts pays to replay a fold of its party's epoch log.

A fold is the net change of the updates since the last rotation (docs/publication.md, "Folds"):
up to every page of the matrix for a party that follows a chain and never rotates. Kept as its
changed bytes it is some 60 bytes a page; staged as pending updates, as every other batch a
shard takes, it is 4 KiB a page beside the pages themselves until a fold writes it into them.
A replica now writes a fold into its pages `REPLAY_ROWS` changes at a time
(`ShardState.replay_updates`); the baseline, measured in the same run on the same fold, is the
path before: the fold staged whole, committed, then written into the pages (`fold_pending`).

Each (fold size, path) runs in a process of its own: a synthetic snapshot of `--matrix-pages`
pages loaded by a shard, then the log replayed (`ShardCore.catch_up`). The peak is the
process's resident high-water mark, reset once the pages are loaded (`cluster.chain_import`'s
helpers), less what it held then. Every run checks `--check` pages against the snapshot's page
XOR the fold's change, and both paths must end at the same identity.

    python bench/fold_replay.py                      # 2^20 pages; folds of 2^16, 2^17, 2^18
    python bench/fold_replay.py --matrix-pages 262144 --folds 16384,65536
Results: bench/results/fold_replay.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
RESULTS = ROOT / "bench" / "results"


def write_log(log_dir: Path, matrix: int, pages: int, changed: int, seed: int) -> None:
    """A directory log whose one live entry is a fold of `pages` changes (block-shaped: XOR
    diffs of `changed` bytes a page), made by the log's own compaction."""
    from log_fold import block

    from morphogen.protocol.identity import EpochIdentity
    from morphogen.publication import compaction
    from morphogen.publication.log import EpochLog, updates_entry
    from morphogen.snapshot.reader import Snapshot

    snap = Snapshot.open(log_dir.parent / "snap")
    base = EpochIdentity.of_snapshot(snap.manifest.epoch_id, snap.fingerprint())
    snap.close()
    log = EpochLog(log_dir)
    rng = np.random.default_rng(seed)
    for i in range(8):  # eight blocks, folded into one
        batch = block(rng, pages // 8, matrix, changed)

        def build(head, seq, batch=batch):
            at = base if head is None else head.epoch_identity()
            epoch = at.epoch_id + 1
            return updates_entry(epoch, at.epoch_id, batch,
                                 at.after_updates(epoch, batch.digest), seq), batch

        p = log.propose(f"p-{i:022x}", "updates:" + batch.digest, "bench", 60.0, build)
        log.decide(p, "commit")
    compaction.FOLD_KEEP = 0
    assert log.compact() > 0 and [e.kind for e in log.live()] == ["fold"]


def replay(work: Path, path: str, check: int) -> dict:
    """In this process: load the shard, replay the log, check pages; the figures."""
    from cluster.chain_import import _peak_reset, _status_mib
    from morphogen.party import epoch
    from morphogen.party.shard import ShardCore
    from morphogen.publication.log import EpochLog
    from morphogen.snapshot.reader import Snapshot

    if path == "staged":  # the path before: staged whole, committed, then folded
        epoch.ShardState.replay_updates = lambda self, *a, **k: None  # type: ignore[method-assign]
    snap = Snapshot.open(work / "snap")
    log = EpochLog(work / "log", create=False)
    # a first replay, untimed, on a shard of the first 1,024 pages: every kernel the path
    # runs is loaded before the clock starts (the first call of each costs some 60 ms)
    warm = ShardCore(Snapshot.open(work / "snap"), 0, 1024, "cpu")
    warm.catch_up(log)
    warm.fold_pending()
    warm.close()
    core = ShardCore.open(snap, 0, 1, "cpu")
    before = _peak_reset()
    t = time.perf_counter()
    replayed = core.catch_up(log)
    caught = time.perf_counter() - t
    folded = core.fold_pending()
    took = time.perf_counter() - t
    peak = _status_mib("VmHWM")
    fold = log.live()[0]
    batch = log.load_batch(fold)
    rng = np.random.default_rng(5)
    now = core.state.current
    for i in rng.choice(len(batch), min(check, len(batch)), replace=False).tolist():
        page = int(batch.pages[i])
        want = snap.pages(page, page + 1)[0] ^ np.frombuffer(
            batch.data[i * 4096:(i + 1) * 4096], np.uint8)
        if not np.array_equal(now.page(page), want):
            raise SystemExit(f"page {page} differs after the replay ({path})")
    if now.pending:
        raise SystemExit(f"{len(now.pending)} updates still pending ({path})")
    return {"path": path, "fold_pages": len(batch), "replayed": replayed,
            "identity": core.identity.digest, "replay_s": round(caught, 3),
            "folded_after": folded, "total_s": round(took, 3),
            "rss_before_mib": None if before is None else round(before, 1),
            "peak_above_mib": None if before is None else round(peak - before, 1),
            "checked_pages": min(check, len(batch))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--matrix-pages", type=int, default=1 << 20)
    ap.add_argument("--folds", default="65536,131072,262144", help="fold pages, comma-separated")
    ap.add_argument("--changed-bytes", type=int, default=40)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--check", type=int, default=200, help="pages checked a run")
    ap.add_argument("--out", type=Path, default=RESULTS / "fold_replay.json")
    ap.add_argument("--replay", nargs=2, metavar=("WORK", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.replay:
        print(json.dumps(replay(Path(args.replay[0]), args.replay[1], args.check)))
        return 0
    from morphogen.snapshot.synthetic import build_synthetic

    root = Path(tempfile.mkdtemp(prefix="morphogen-foldreplay-"))
    sizes = []
    try:
        build_synthetic(root / "snap", args.matrix_pages, seed=7, progress=False)
        for n in (int(x) for x in args.folds.split(",")):
            log_dir = root / "log"
            shutil.rmtree(log_dir, ignore_errors=True)
            write_log(log_dir, args.matrix_pages, n, args.changed_bytes, seed=n)
            runs: dict[str, list[dict]] = {"slices": [], "staged": []}
            for _ in range(args.runs):
                for path in runs:  # alternating, each in a fresh process
                    out = subprocess.run(
                        [sys.executable, __file__, "--replay", str(root), path,
                         "--check", str(args.check)],
                        check=True, capture_output=True, text=True).stdout
                    runs[path].append(json.loads(out.strip().splitlines()[-1]))
                    print(json.dumps(runs[path][-1]), flush=True)
            ids = {r["identity"] for rs in runs.values() for r in rs}
            if len(ids) != 1:
                raise SystemExit(f"the paths ended at different identities: {ids}")
            sizes.append({
                "fold_pages": runs["slices"][0]["fold_pages"],
                **{f"{path}_{k}_median": round(float(np.median([r[k] for r in rs])), 3)
                   for path, rs in runs.items() for k in ("total_s", "peak_above_mib")},
                "runs": runs,
            })
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = {"matrix_pages": args.matrix_pages, "changed_bytes_a_page": args.changed_bytes,
           "sizes": sizes}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps([{k: v for k, v in s.items() if k != "runs"} for s in sizes], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
