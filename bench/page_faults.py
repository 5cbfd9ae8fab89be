"""What a page of an owner's mapped working file costs to touch, by how it is touched.

An owner's current pages are a file mapped shared (morphogen/keyword/working.py) and a block
writes a few thousand pages of it scattered over the whole table. A page this process has not
mapped yet takes a fault to read; a page the kernel wrote back since it was last written takes
another to be written (the file system is told it is dirty again). The follower takes both
ahead of the block's apply, while the node reads the block's values
(morphogen/keyword/prefetch.py, MADV_POPULATE_WRITE). This measures, on a file of `--mib`
in the page cache, for `--pages` random pages at a time, in microseconds a page, medians of
`--rounds`:

- read: the first read of pages not mapped in this process;
- write after read: writing pages just read (mapped, clean);
- write after writeback: writing pages written before and synced since;
- write hot: writing pages written just before (mapped, dirty: no fault at all);
- populate: MADV_POPULATE_WRITE of pages not mapped, one call a page (the prefetch's way);
- write after populate: writing those pages (what the apply then pays).

    python bench/page_faults.py
    python bench/page_faults.py --mib 4096 --pages 5000
    python bench/page_faults.py --file OWNER/working/pages.bin   # an owner's own file
Results: bench/results/page_faults.json (with --file: page_faults_file.json)

How the file came to be matters: one written and read back whole may sit in the page cache
in large folios (the kernel's choice), which a write fault then dirties whole; an owner's
working file is copied from a snapshot and patched through a mapping.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"
PAGE = 4096


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _read(mapped: np.ndarray, which: np.ndarray) -> None:
    for i in which.tolist():
        mapped[i, 100]


def _write(mapped: np.ndarray, which: np.ndarray) -> None:
    for i in which.tolist():
        mapped[i, 100] = mapped[i, 100]  # the same byte: the file never changes


def _populate(mapped: np.ndarray, which: np.ndarray) -> None:
    from morphogen.keyword import prefetch

    for i in range(len(which)):  # a call a page: a block's pages are scattered
        if not prefetch.populate(mapped, which[i:i + 1]):
            raise SystemExit("MADV_POPULATE_WRITE is not offered by this kernel")


def measure(path: Path, pages: int, rounds: int, seed: int = 1) -> dict:
    n = path.stat().st_size // PAGE
    rng = np.random.default_rng(seed)
    fd = os.open(path, os.O_RDWR)
    took: dict[str, list[float]] = {}
    faults: dict[str, list[float]] = {}

    def timed(name: str, fn, mapped: np.ndarray, which: np.ndarray) -> None:
        f, t = _faults(), time.perf_counter()
        fn(mapped, which)
        took.setdefault(name, []).append((time.perf_counter() - t) / len(which) * 1e6)
        faults.setdefault(name, []).append((_faults() - f) / len(which))

    try:
        for _ in range(rounds):
            # a fresh mapping a round: none of its pages mapped in this process yet
            mapped = np.memmap(path, np.uint8, "r+", shape=(n, PAGE)).view(np.ndarray)
            a, b = (np.sort(rng.choice(n, pages, replace=False)) for _ in range(2))
            timed("read", _read, mapped, a)
            timed("write after read", _write, mapped, a)
            os.fsync(fd)  # written back: writing them again is a fault each
            timed("write after writeback", _write, mapped, a)
            timed("write hot", _write, mapped, a)
            timed("populate", _populate, mapped, b)
            timed("write after populate", _write, mapped, b)
            os.fsync(fd)
    finally:
        os.close(fd)
    return {name: {"us_a_page": round(statistics.median(v), 2),
                   "faults_a_page": round(statistics.median(faults[name]), 2)}
            for name, v in took.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024, help="the mapped file's size")
    ap.add_argument("--pages", type=int, default=3000, help="pages touched a round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--file", type=Path, default=None,
                    help="measure on this file of pages instead (an owner's working/pages.bin, "
                         "not in use by a follower: its bytes are written as they are)")
    ap.add_argument("--dir", type=Path, default=None,
                    help="where the file goes (default: a temporary directory on the disk "
                         "the repository is on, as an owner directory would be)")
    args = ap.parse_args(argv)
    if args.file is not None:
        result = {"machine": platform.machine(), "kernel": platform.release(),
                  "cpus": os.cpu_count(), "file": str(args.file),
                  "file_mib": args.file.stat().st_size >> 20, "pages": args.pages,
                  "rounds": args.rounds, "by_access": measure(args.file, args.pages, args.rounds)}
        return _save(result, "page_faults_file.json")
    where = Path(tempfile.mkdtemp(prefix="morphogen-faults-", dir=args.dir or ROOT))
    path = where / "pages.bin"
    try:
        with path.open("wb") as f:
            chunk = np.random.default_rng(0).integers(0, 256, 1 << 20, np.uint8).tobytes()
            for _ in range(args.mib):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        with path.open("rb") as f:  # in the page cache, as a warm owner's file is
            while f.read(1 << 24):
                pass
        result = {"machine": platform.machine(), "kernel": platform.release(),
                  "cpus": os.cpu_count(), "file_mib": args.mib, "pages": args.pages,
                  "rounds": args.rounds, "by_access": measure(path, args.pages, args.rounds)}
    finally:
        path.unlink(missing_ok=True)
        where.rmdir()
    return _save(result, "page_faults.json")


def _save(result: dict, name: str) -> int:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / name).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["by_access"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
