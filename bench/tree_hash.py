"""The hash tree's per-page hashing (`morphogen.keyword.tree`), per page, against the way it
was done before, in the same run.

    python bench/tree_hash.py [--pages 113000] [--runs 5]

A table's build hashes every data page once and every block rehashes the paths of the pages
it changed (a 3,000-record block on 16 M records: some 4,700 pages), one BLAKE3 hash of the
domain and the page a page. Measured per page, medians of the runs, on random pages:
- `copy`: the domain's hasher made once and copied for each page, then updated with it
  (this project's way before; the baseline);
- `tree`: `tree._hashes`, as the build and the rehash call it: a hasher made from the domain
  and the page together;
- `threads`: the same on two threads, each a half of the pages (BLAKE3 holds the interpreter's
  lock for an input this small: the reason `tree._hashes` uses none);
- `floor`: a hasher made from the page alone (no domain: what one call costs at least).
Results: bench/results/tree_hash.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from morphogen.keyword import tree  # noqa: E402


def copied(pages: np.ndarray) -> np.ndarray:
    out = np.empty((len(pages), tree.HASH_SIZE), np.uint8)
    base = blake3.blake3(tree.LEAF_DOMAIN)
    for i in range(len(pages)):
        h = base.copy()
        h.update(pages[i])
        out[i] = np.frombuffer(h.digest(), np.uint8)
    return out


def threads(pages: np.ndarray) -> np.ndarray:
    half = len(pages) // 2
    with ThreadPoolExecutor(2) as pool:
        parts = list(pool.map(lambda p: tree._hashes(p, True), (pages[:half], pages[half:])))
    return np.concatenate(parts)


def floor(pages: np.ndarray) -> None:
    rows = memoryview(pages).cast("B")
    for a in range(0, pages.size, pages.shape[1]):
        blake3.blake3(rows[a:a + pages.shape[1]]).digest()


def median_us(fn, pages: np.ndarray, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn(pages)
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] / len(pages) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, nargs="+", default=[4_700, 113_000])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "tree_hash.json")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    rows = []
    for n in args.pages:
        pages = rng.integers(0, 256, (n, tree.PAGE_SIZE), dtype=np.uint8)
        if not np.array_equal(copied(pages[:64]), tree._hashes(pages[:64], True)):
            raise SystemExit("the two ways give different hashes")
        row = {"pages": n}
        for name, fn in (("copy", copied), ("tree", lambda p: tree._hashes(p, True)),
                         ("threads", threads), ("floor", floor)):
            row[f"{name}_us_a_page"] = round(median_us(fn, pages, args.runs), 2)
        row["copy_over_tree"] = round(row["copy_us_a_page"] / row["tree_us_a_page"], 2)
        rows.append(row)
        print(json.dumps(row))
    args.out.write_text(json.dumps({"runs": args.runs, "sizes": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
