"""What a GPU shard's commits of blocks keep and cost on the host, against the blocks taken.

A GPU shard writes each committed block into its device copy (morphogen.party.device_fold).
Its host side is measured here without a device: the shard's engine is a stand-in whose
scanner takes `write_pages` and counts the bytes it is given (what would cross the bus), so
what is timed and weighed is the party's own work: the commit, the fold's plan and the writes
into the shard's host copy. Each block is `--block-pages` random pages of the shard (3,000 by
default, as a mainnet block's data and tree pages), each changing `--changed-bytes` bytes (40).

Per checkpoint of blocks taken (16, 64 and 256 by default): the median times of the blocks'
prepare (the batch checked and staged) and commit (the fold: the device's writes and the
host's) since the last checkpoint (not the first block, which compiles the fold's kernel), the
process's resident memory above what it was once the shard had loaded and taken its first
block, and the distinct pages changed so far. Where the host keeps something per page ever
changed, memory and commit time grow with the blocks; where it does not, both stay flat.
At the end every changed page of the shard's host copy is checked
against a model of the matrix.

    python bench/gpu_fold_host.py                       # 2^18 pages (1 GiB), 256 blocks
    python bench/gpu_fold_host.py --pages 65536 --checkpoints 8,32,128
Results: bench/results/gpu_fold_host.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"


class _DeviceStandIn:
    """A GPU shard's scanner as far as a commit uses it: takes writes, counts their bytes."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self.bytes_written = 0

    def write_pages(self, pages: np.ndarray, diffs: np.ndarray) -> None:
        self.bytes_written += int(diffs.nbytes)

    def scan(self, batch):
        raise AssertionError("this benchmark scans nothing")

    def close(self) -> None:
        pass


class _EngineStandIn:
    name = "device-stand-in"
    key_formats = ("v1",)

    def __init__(self) -> None:
        self.scanners: list[_DeviceStandIn] = []

    def load(self, pages: np.ndarray, first_page: int = 0) -> _DeviceStandIn:
        self.scanners.append(_DeviceStandIn(int(pages.shape[0])))
        return self.scanners[-1]


def run(n: int, checkpoints: list[int], block_pages: int, changed: int) -> dict:
    from cluster.chain_import import _status_mib
    from morphogen.constants import PAGE_SIZE
    from morphogen.party.epoch import ShardState
    from morphogen.protocol.changes import PageUpdate
    from morphogen.snapshot.reader import Snapshot
    from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages

    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        build_synthetic(Path(tmp) / "s", n, seed=3, epoch_id=1, progress=False)
        engine = _EngineStandIn()
        state = ShardState(engine, Snapshot.open(Path(tmp) / "s"), 0, n)
        model = synthetic_pages(3, 0, n).copy()
        changed_pages = np.zeros(n, bool)  # a fixed size: the benchmark's own memory stays flat
        times: list[float] = []
        rows: list[dict] = []
        rss0 = None
        for block in range(1, max(checkpoints) + 1):
            pages = rng.choice(n, block_pages, replace=False)
            updates = []
            for p in pages.tolist():
                diff = np.zeros(PAGE_SIZE, np.uint8)
                at = int(rng.integers(0, PAGE_SIZE - changed + 1))
                diff[at:at + changed] = rng.integers(1, 256, changed, dtype=np.uint8)
                model[p] ^= diff
                updates.append(PageUpdate(p, diff.tobytes()))
            changed_pages[pages] = True
            t0 = time.perf_counter()
            state.prepare_updates(block + 1, updates)
            t1 = time.perf_counter()
            state.commit(block + 1)  # the fold: the device's writes and the host's
            t2 = time.perf_counter()
            times.append((t1 - t0, t2 - t1))
            assert not state.current.pending  # written into the "device" at commit
            del updates
            if rss0 is None:
                rss0 = _status_mib("VmRSS")
            if block in checkpoints:
                # the first block compiles (or loads) the fold's kernel: not timed
                since = times[max(1, rows[-1]["blocks"] if rows else 0):]
                rows.append({
                    "blocks": block,
                    "distinct_pages_changed": int(changed_pages.sum()),
                    "prepare_s_median": round(statistics.median(t[0] for t in since), 4),
                    "commit_s_median": round(statistics.median(t[1] for t in since), 4),
                    "commit_s_max": round(max(t[1] for t in since), 4),
                    "rss_above_mib": round(_status_mib("VmRSS") - rss0, 1),
                })
                r = rows[-1]
                print(f"{block:5d} blocks, {r['distinct_pages_changed']:8d} pages changed: "
                      f"prepare {r['prepare_s_median'] * 1e3:6.1f} ms, commit median "
                      f"{r['commit_s_median'] * 1e3:6.1f} ms, max {r['commit_s_max'] * 1e3:6.1f}"
                      f" ms; resident {r['rss_above_mib']:7.1f} MiB above the first block's")
        ours = np.flatnonzero(changed_pages)
        wrong = sum(not np.array_equal(state.current.page(int(p)), model[p]) for p in ours)
        device_bytes = sum(s.bytes_written for s in engine.scanners)
        state.close()
    return {"pages": n, "block_pages": block_pages, "changed_bytes_a_page": changed,
            "checkpoints": rows, "pages_checked": int(ours.size), "pages_wrong": int(wrong),
            "device_bytes_a_block": device_bytes // max(checkpoints)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=1 << 18)
    ap.add_argument("--checkpoints", default="16,64,256")
    ap.add_argument("--block-pages", type=int, default=3_000)
    ap.add_argument("--changed-bytes", type=int, default=40)
    ap.add_argument("--out", type=Path, default=RESULTS / "gpu_fold_host.json")
    args = ap.parse_args()
    checkpoints = sorted(int(c) for c in args.checkpoints.split(","))
    result = run(args.pages, checkpoints, args.block_pages, args.changed_bytes)
    first, last = result["checkpoints"][0], result["checkpoints"][-1]
    result["ratio_last_to_first"] = {
        "commit_s_median": round(last["commit_s_median"] / first["commit_s_median"], 2)}
    print(f"commit median at {last['blocks']} blocks / at {first['blocks']}: "
          f"{result['ratio_last_to_first']['commit_s_median']:.2f}x; "
          f"{result['pages_checked']} changed pages checked, {result['pages_wrong']} wrong")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    if result["pages_wrong"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
