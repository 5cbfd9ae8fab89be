"""What a block's apply costs when the owner's table is not in memory, and how much of it the
follower's prefetch takes off the apply's path.

At mainnet's size (DESIGN.md) an owner's working table is some 128 GiB and its key index tens
of GiB more: a follower's machine may not hold them in its page cache, and a block's 3,000
records then land on pages read from disk. This builds owner directories of `--sizes`
records (bench/chain_scale.py's state and block shape, mainnet's proportions) and applies
blocks of 3,018 changed records, each after one of:

- none: no prefetch (the apply takes every fault itself);
- serial: the prefetch without read-ahead, every page read in by a fault of its own, in turn
  (the follower's prefetch before read-ahead);
- read-ahead: the follower's prefetch (`morphogen.keyword.prefetch.block`), whose reads of
  the candidates' pages, the key index's slots and the tree pages are asked of the kernel
  together (MADV_WILLNEED) before they are read;

with the owner's working files evicted from the page cache first (cold: synced, no mapping
left, POSIX_FADV_DONTNEED: a table larger than the machine's memory) or read into it whole
(warm: a machine that holds them; the process's mapping kept, as a follower's between
blocks). The share of the files' pages resident before each block is reported (mincore).
Per size, mode and cache: the prefetch's
time to its end (a follower hides it inside the node's read of the block's values, some
0.3 to 0.6 s) and the apply's time after it, medians of `--rounds`.

    python bench/block_cold.py
    python bench/block_cold.py --sizes 1000000 --rounds 3
Results: bench/results/block_cold.json
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import json
import mmap
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
RESULTS = ROOT / "bench" / "results"
MODES = ("none", "serial", "read-ahead")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _working_files(owner_dir: Path) -> list[Path]:
    return sorted(p for p in (owner_dir / "working").rglob("*.bin"))


def _resident(path: Path) -> float:
    """The share of the file's pages in the page cache (mincore over a fresh mapping)."""
    size = path.stat().st_size
    if not size:
        return 1.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = np.zeros(pages, np.uint8)
    with path.open("rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
        view = np.frombuffer(mm, np.uint8)
        rc = libc.mincore(ctypes.c_void_p(view.ctypes.data), size, vec.ctypes.data)
        del view
    if rc:
        raise OSError(ctypes.get_errno(), "mincore")
    return float((vec & 1).mean())


def _load(owner_dir: Path) -> None:
    """Every page of the working files read into the page cache (a machine that holds them)."""
    buf = bytearray(1 << 24)
    for path in _working_files(owner_dir):
        with path.open("rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def _prefetch(owner, mode: str, by_table: dict) -> None:
    from morphogen.keyword import prefetch
    from morphogen.keyword.descriptor import parts_of

    pages, index = owner._working()
    parts = parts_of(pages)
    if mode == "read-ahead":
        prefetch.block(pages, parts, by_table, index)
    elif mode == "serial":
        located = prefetch.locate(parts, by_table)
        prefetch.touch_index(index, prefetch.tags(located))
        prefetch.populate(pages, prefetch.plan(pages, located))


def run_size(size: int, rounds: int, work: Path, key) -> dict:
    import chain_scale as cs
    from _common import drop_cache

    from morphogen.chain.tables import build_chain_tables
    from morphogen.keyword.descriptor import Anchor
    from morphogen.keyword.owner import Change, OwnerTable, create_owner_dir

    _log(f"{size:,} records: making the state and building the tables")
    records, addrs, slots = cs.make_state(size)
    table = build_chain_tables(records, key, Anchor(1, 999, "0x" + "00" * 32), room=cs.ROOM,
                               min_records=0, seed=1)
    del records
    owner_dir = work / f"n{size}"
    shutil.rmtree(owner_dir, ignore_errors=True)
    create_owner_dir(table, owner_dir)
    table_pages = len(table.pages)
    del table
    gc.collect()
    owner = OwnerTable(owner_dir)
    owner.checkpoints_in_background()
    owner.map_working_pages()
    rng = np.random.default_rng(size)
    number = 1000
    samples: dict = collections.defaultdict(list)

    def one_block(mode: str, cold: bool) -> None:
        nonlocal number
        number += 1
        changes = [Change("delete_absent", c.key, table=c.table) if c.op == "delete" else c
                   for c in cs.block_changes(rng, addrs, slots, number)]
        by_table: dict = collections.defaultdict(list)
        for c in changes:
            by_table[c.table].append(c.key)
        owner.wait_checkpoints()  # a full copy reads the whole file: never beside a block
        if cold:
            owner._drop_cache()  # no mapping of the files left in this process
            gc.collect()
            for path in _working_files(owner_dir):
                drop_cache(path)
        else:
            _load(owner_dir)
        resident = {p.name: round(_resident(p), 3) for p in _working_files(owner_dir)}
        t = time.perf_counter()
        if mode != "none":
            _prefetch(owner, mode, by_table)
        t1 = time.perf_counter()
        version, _ = owner.apply(changes, key, rng=lambda n: int(rng.integers(0, n)),
                                 anchor=Anchor(1, number, "0x" + f"{number:064x}"))
        t2 = time.perf_counter()
        owner.mark_published(version)
        samples[(mode, cold)].append((t1 - t, t2 - t1, resident))

    for mode in MODES:  # loads every kernel and maps the files once before any timed block
        one_block(mode, False)
    samples.clear()
    for r in range(rounds):
        for cold in (True, False):
            for mode in MODES:  # taking turns: the host's changing load falls on each alike
                one_block(mode, cold)
        _log(f"  round {r + 1}: " + ", ".join(
            f"{m} {'cold' if c else 'warm'} {s[-1][0] + s[-1][1]:.3f} s"
            for (m, c), s in samples.items()))
    owner.wait_checkpoints()
    owner._drop_cache()
    shutil.rmtree(owner_dir, ignore_errors=True)
    row: dict = {"table_pages": table_pages, "table_mib": round(table_pages * 4096 / 2**20)}
    for (mode, cold), got in samples.items():
        prefetch_s = [g[0] for g in got]
        apply_s = [g[1] for g in got]
        row[f"{mode} {'cold' if cold else 'warm'}"] = {
            "prefetch_s": round(statistics.median(prefetch_s), 4),
            "apply_s": round(statistics.median(apply_s), 4),
            "both_s": round(statistics.median(a + b for a, b in zip(prefetch_s, apply_s,
                                                                     strict=True)), 4),
            "resident_before": {name: round(statistics.median(g[2][name] for g in got), 3)
                                for name in got[0][2]},
            "rounds": len(got)}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+",
                        default=[1_000_000, 4_000_000, 16_000_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None,
                        help="where the owner directories go (a temporary directory)")
    parser.add_argument("--out", type=Path, default=RESULTS / "block_cold.json")
    args = parser.parse_args(argv)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from morphogen.keyword import hashing, prefetch
    from morphogen.protocol import sparse

    sparse.warm()
    hashing.warm()
    prefetch.warm()
    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    work = args.work or Path(tempfile.mkdtemp(prefix="block-cold-"))
    out = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
           "block_records": 3018, "rounds": args.rounds, "sizes": {}}
    try:
        for size in args.sizes:
            out["sizes"][str(size)] = run_size(size, args.rounds, work, key)
            _log(json.dumps(out["sizes"][str(size)]))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    _log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
