"""Verified loading of a snapshot range against a plain read of the same file, in the same run.

    python bench/verify_speed.py [--mib 1024] [--runs 7] [--chunk-pages 16384] [--cold]
                                 [--snapshot DIR]

What a shard does at start (`Snapshot.read_verified`: read its range into private memory and
hash every chunk against the manifest) is timed beside a plain read of the same bytes into
fresh memory (`preadv` in 64 MiB steps: the fastest way this process has to get them) and a
hash of bytes already in memory. The two reads alternate within each run; medians over the
runs. `--cold` drops this file's pages from the page cache before every read
(posix_fadvise DONTNEED: only this file, nothing else on the machine), so the disk is read.

Prints GiB/s and seconds per GiB of each, and verify / read (>= ~1 means checking costs no
more than reading); writes bench/results/verify_speed.csv, verify_speed.png and
verify_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, drop_cache, machine_label, plot, write_csv  # noqa: E402

from morphogen.constants import PAGE_SIZE  # noqa: E402
from morphogen.snapshot.hashes import DEFAULT_CHUNK_PAGES, HASH_THREADS, new_hasher  # noqa: E402
from morphogen.snapshot.reader import Snapshot  # noqa: E402
from morphogen.snapshot.synthetic import build_synthetic  # noqa: E402

STEP = 64 << 20


def plain_read(path: Path, nbytes: int) -> np.ndarray:
    out = np.empty(nbytes, np.uint8)
    view = memoryview(out)
    fd = os.open(path, os.O_RDONLY)
    try:
        for off in range(0, nbytes, STEP):
            part = view[off : off + STEP]
            done = 0
            while done < len(part):
                got = os.preadv(fd, [part[done:]], off + done)
                if got == 0:
                    raise OSError(f"{path}: short read at {off + done}")
                done += got
    finally:
        os.close(fd)
    return out


def hash_in_memory(buf: np.ndarray, chunk_bytes: int) -> None:
    view = memoryview(buf)
    for off in range(0, len(view), chunk_bytes):
        h = new_hasher()
        h.update(view[off : off + chunk_bytes])
        h.digest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024, help="snapshot size to build")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--chunk-pages", type=int, default=DEFAULT_CHUNK_PAGES)
    ap.add_argument("--cold", action="store_true", help="read from disk, not the page cache")
    ap.add_argument("--snapshot", type=Path, help="an existing snapshot instead of building one")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="verify-speed-") as tmp:
        snap_dir = args.snapshot
        if snap_dir is None:
            snap_dir = Path(tmp) / "snap"
            pages = args.mib * (1 << 20) // PAGE_SIZE
            print(f"building a {args.mib} MiB snapshot ({pages} pages) ...", flush=True)
            build_synthetic(snap_dir, pages, seed=1, progress=False, chunk_pages=args.chunk_pages)
        snap = Snapshot.open(snap_dir)
        nbytes = snap.num_pages * PAGE_SIZE
        gib = nbytes / 2**30
        chunk_bytes = snap.manifest.chunk_pages * PAGE_SIZE
        rows = []
        for run in range(args.runs + 1):  # run 0 warms the page cache and the allocator
            timings = {}
            for what in ("read", "verify"):
                if args.cold:
                    drop_cache(snap.data_path)
                t = time.perf_counter()
                if what == "read":
                    buf = plain_read(snap.data_path, nbytes)
                else:
                    buf = snap.read_verified()
                timings[what] = time.perf_counter() - t
                del buf
            mem = np.ones(min(nbytes, 1 << 30), np.uint8)
            t = time.perf_counter()
            hash_in_memory(mem, chunk_bytes)
            timings["hash"] = (time.perf_counter() - t) * nbytes / len(mem)
            del mem
            if run:
                rows.append({"run": run, **{f"{k}_s": round(v, 4) for k, v in timings.items()}})
                print(f"run {run}: " + ", ".join(f"{k} {gib / v:.2f} GiB/s"
                                               for k, v in timings.items()), flush=True)
        snap.close()

    med = {k: float(np.median([r[f"{k}_s"] for r in rows])) for k in ("read", "verify", "hash")}
    summary = {
        "machine": machine_label(),
        "bytes": nbytes,
        "chunk_pages": snap.manifest.chunk_pages,
        "hash_threads": HASH_THREADS,
        "cold": args.cold,
        "runs": args.runs,
        **{f"{k}_gib_s": round(gib / v, 3) for k, v in med.items()},
        **{f"{k}_s_per_gib": round(v / gib, 4) for k, v in med.items()},
        "verify_over_read": round(med["read"] / med["verify"], 3),
    }
    print(f"\n{gib:.2f} GiB, chunks of {snap.manifest.chunk_pages} pages, "
          f"{'cold (disk)' if args.cold else 'warm (page cache)'}, medians of {args.runs} runs, "
          f"{summary['machine']}")
    hash_label = f"hash only ({HASH_THREADS} thr)"
    for k, label in (("read", "plain read"), ("verify", "verified load"), ("hash", hash_label)):
        print(f"  {label:20s} {summary[f'{k}_gib_s']:6.2f} GiB/s  "
              f"{summary[f'{k}_s_per_gib']:.3f} s/GiB")
    print(f"  verified load / plain read speed: {summary['verify_over_read']:.2f}")

    suffix = "_cold" if args.cold else ""
    write_csv(args.out / f"verify_speed{suffix}.csv", rows)
    (args.out / f"verify_speed{suffix}.json").write_text(json.dumps(summary, indent=2) + "\n")

    def draw(ax) -> None:
        names = ["plain read", "verified load", hash_label]
        values = [summary[f"{k}_gib_s"] for k in ("read", "verify", "hash")]
        ax.bar(names, values, color=["#888888", "#3b7dd8", "#9ecae1"])
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom")
        ax.set_ylabel("GiB/s (median)")
        ax.set_title(f"Snapshot range load, {gib:.1f} GiB, "
                     f"{'cold' if args.cold else 'page cache'}\n{summary['machine']}")

    plot(args.out / f"verify_speed{suffix}.png", draw)


if __name__ == "__main__":
    main()
