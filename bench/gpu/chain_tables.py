"""Chain tables on one GPU: the mainnet-shaped matrix, table lookups on the device, blocks of page
updates written into device memory while lookups run (issue 41).

    python bench/gpu/chain_tables.py [--gib N] [--out DIR] [--seconds S] [--dry-run MODE]

The matrix holds three keyword tables in mainnet proportions (accounts 35 : storage 77 : code
15, as the design's "Mainnet" section sizes them), each a data table, its hash-tree levels
(32-byte hashes, 128 a page) and a descriptor page, placed back to back so that every table but
none of the data starts mid-chunk of the sliced layout, at --gib GiB (default 32 on a card
under 100 GiB, 64 above). Pages are a 64 MiB random pool, each page stamped with its number and
version, so any page's bytes are known without a host copy; every answer is checked by XOR-ing
both parties' answers (both parties' keys in one call, so they read one generation of the
data).

Phases, each bounded by --seconds and written to $OUT/chain_tables_<device>.json as it ends:
  ratio    each data table and the largest tree level: a table query (3 keys; 8 queries = 24
           keys) against the whole-matrix kernel over the same number of pages, alternated,
           medians of --runs; target <= 1.1x
  lookups  keyword-shaped lookups (3 keys of a data table, then one of each tree level and the
           descriptor, both parties' keys in each call) by --readers threads, no updates: per
           table p50/p99 and lookups/s
  updates  the same lookups while blocks of --block-pages changed pages, scattered over all
           tables, are written every --interval s (GpuShard.write_pages): time a block takes to
           reach device memory (target 100 ms), lookups p99 against the phase before (target
           1.5x)
0 wrong pages anywhere is the target that every phase checks.

--dry-run model|emulator runs the same script on the CuPy fakes of tests/unit (the kernels'
NumPy model, or the real .cu program compiled as host C++) at a few MiB: the logic, not a figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from scan_gpu import device_slug  # noqa: E402

from morphogen.engine.gpu import GpuEngine, GpuShard  # noqa: E402
from morphogen.engine.gpu_tables import ScanRange  # noqa: E402
from morphogen.protocol import dpf  # noqa: E402
from morphogen.snapshot.layout import domain_bits_for  # noqa: E402

PROPORTIONS = {"accounts": 35, "storage": 77, "code": 15}  # GiB at mainnet (the design, "Mainnet")
HASHES_PER_PAGE = 128
POOL_PAGES = 1 << 14  # 64 MiB of random pages, tiled
LEAD_PAGES = 37  # pages before the first table: no data table starts on a chunk boundary


@dataclass(frozen=True)
class Table:
    name: str
    first: int
    pages: int

    @property
    def d(self) -> int:
        return domain_bits_for(self.pages)


def layout(total: int) -> tuple[list[Table], dict[str, list[Table]]]:
    """Tables of a matrix of `total` pages: per kind, data, tree levels, descriptor."""
    budget = total - LEAD_PAGES - 64
    weight = sum(PROPORTIONS.values())
    tables: list[Table] = []
    parts: dict[str, list[Table]] = {}
    at = LEAD_PAGES
    for kind, w in PROPORTIONS.items():
        data = int(budget * w / weight * HASHES_PER_PAGE / (HASHES_PER_PAGE + 1.01))
        sizes = [data]
        while sizes[-1] > 1:
            sizes.append(-(-sizes[-1] // HASHES_PER_PAGE))
        sizes.append(1)  # the descriptor
        names = ["data"] + [f"tree{i}" for i in range(1, len(sizes) - 1)] + ["descriptor"]
        parts[kind] = []
        for name, size in zip(names, sizes, strict=True):
            t = Table(f"{kind}.{name}", at, size)
            tables.append(t)
            parts[kind].append(t)
            at += size
    assert at <= total
    return tables, parts


class Pages:
    """Page bytes as a function of (page, version): a pool page, stamped."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.pool = rng.integers(0, 256, (POOL_PAGES, 4096), dtype=np.uint8)

    def content(self, page: np.ndarray, version: np.ndarray) -> np.ndarray:
        page, version = np.asarray(page, np.int64), np.asarray(version, np.int64)
        out = self.pool[(page * 7 + version * 7919) % POOL_PAGES]
        out[:, 0:8] = page.astype("<u8").view(np.uint8).reshape(-1, 8)
        out[:, 8:16] = version.astype("<u8").view(np.uint8).reshape(-1, 8)
        return out

    def fill(self, out: np.ndarray, threads: int = 16) -> None:
        n = out.shape[0]
        step = 1 << 16

        def part(lo: int) -> None:
            hi = min(n, lo + step)
            page = np.arange(lo, hi, dtype=np.int64)
            np.take(self.pool, (page * 7) % POOL_PAGES, axis=0, out=out[lo:hi])
            out[lo:hi, 0:8] = page.astype("<u8").view(np.uint8).reshape(-1, 8)
            out[lo:hi, 8:16] = 0  # version 0

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(part, range(0, n, step)))


class Versions:
    """Each page's version by write generation (the writer records a block before writing it)."""

    def __init__(self) -> None:
        self.changes: dict[int, list[tuple[int, int]]] = {}

    def at(self, pages: list[int], generation: int) -> np.ndarray:
        out = []
        for p in pages:
            v = 0
            for gen, ver in self.changes.get(p, ()):
                if gen <= generation:
                    v = ver
            out.append(v)
        return np.array(out, np.int64)


class Checker:
    def __init__(self, pages: Pages, versions: Versions) -> None:
        self.pages, self.versions = pages, versions
        self.checked = self.wrong = 0
        self._lock = threading.Lock()

    def call(self, scanner: Any, table: Table, targets: list[int]) -> float:
        """One call with both parties' keys for `targets` (table indices); checks the pages,
        returns the call's wall ms."""
        pairs = [dpf.generate_keys(table.d, t) for t in targets]
        batch = dpf.KeyBatch.from_keys([p[0] for p in pairs] + [p[1] for p in pairs])
        t0 = time.perf_counter()
        got, timings = scanner.scan_timed(batch)
        ms = (time.perf_counter() - t0) * 1e3
        k = len(targets)
        glob = [table.first + t for t in targets]
        want = self.pages.content(np.array(glob), self.versions.at(glob, timings.generation))
        bad = sum(not np.array_equal(got[i] ^ got[k + i], want[i]) for i in range(k))
        with self._lock:
            self.checked += k
            self.wrong += bad
        return ms


def ratio_phase(shard: GpuShard, tables: list[Table], check: Checker, runs: int,
                deadline: float, rng: np.random.Generator) -> list[dict]:
    rows = []
    for t in tables:
        scanner = shard.table_scanner(t.first, t.pages, 0)
        whole = ScanRange(shard.first_page, t.pages, shard.first_page, table=False)
        for q in (1, 8):
            if time.monotonic() > deadline:
                return rows
            targets = [int(x) for x in rng.integers(0, t.pages, 3 * q)]
            pairs = [dpf.generate_keys(t.d, x) for x in targets]
            k0 = dpf.KeyBatch.from_keys([p[0] for p in pairs])
            k1 = dpf.KeyBatch.from_keys([p[1] for p in pairs])
            tab, who = [], []
            shard.scan_range_timed(k0, whole)  # warm both
            scanner.scan_timed(k0)
            for _ in range(runs):
                tab.append(scanner.scan_timed(k0)[1].kernel_ms)
                who.append(shard.scan_range_timed(k0, whole)[1].kernel_ms)
            got = scanner.scan(k0) ^ scanner.scan(k1)
            want = check.pages.content(np.array(targets) + t.first, np.zeros(len(targets)))
            bad = sum(not np.array_equal(got[i], want[i]) for i in range(len(targets)))
            got_w = shard.scan_range_timed(k0, whole)[0] ^ shard.scan_range_timed(k1, whole)[0]
            want_w = check.pages.content(np.array(targets), np.zeros(len(targets)))
            bad += sum(not np.array_equal(got_w[i], want_w[i]) for i in range(len(targets)))
            check.checked += 2 * len(targets)
            check.wrong += bad
            tm, wm = statistics.median(tab), statistics.median(who)
            rows.append({"table": t.name, "pages": t.pages, "shift": t.first % 256,
                         "queries": q, "keys": 3 * q, "table_ms": round(tm, 3),
                         "whole_ms": round(wm, 3), "ratio": round(tm / wm, 3),
                         "wrong": bad})
            print(f"  {t.name:22s} {t.pages:>10d} pages Q={q}: table {tm:8.3f} ms, whole "
                  f"{wm:8.3f} ms, ratio {tm / wm:.3f}, wrong {bad}", flush=True)
    return rows


def lookup_phase(shard: GpuShard, parts: dict[str, list[Table]], check: Checker,
                 readers: int, seconds: float) -> dict[str, list[float]]:
    """Keyword-shaped lookups for `seconds` by `readers` threads, kinds in turn."""
    scanners = {t.name: shard.table_scanner(t.first, t.pages, 0)
                for ts in parts.values() for t in ts}
    lat: dict[str, list[float]] = {k: [] for k in parts}
    stop = time.monotonic() + seconds
    kinds = list(parts)

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        i = seed
        while time.monotonic() < stop:
            kind = kinds[i % len(kinds)]
            i += 1
            data, *levels = parts[kind]
            ms = check.call(scanners[data.name], data,
                            [int(x) for x in rng.integers(0, data.pages, 3)])
            for t in levels:
                ms += check.call(scanners[t.name], t, [int(rng.integers(0, t.pages))])
            lat[kind].append(ms)

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(readers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return lat


def writer(shard: GpuShard, tables: list[Table], pages: Pages, versions: Versions,
           block_pages: int, interval: float, stop: threading.Event,
           times: list[dict], seed: int) -> None:
    rng = np.random.default_rng(seed)
    starts = np.array([t.first for t in tables])
    sizes = np.array([t.pages for t in tables])
    ends = np.cumsum(sizes)
    current: dict[int, int] = {}
    while not stop.is_set():
        t_block = time.monotonic()
        flat = np.unique(rng.integers(0, int(ends[-1]), block_pages))
        which = np.searchsorted(ends, flat, side="right")
        glob = starts[which] + flat - (ends[which] - sizes[which])
        old = np.array([current.get(int(p), 0) for p in glob], np.int64)
        diffs = pages.content(glob, old) ^ pages.content(glob, old + 1)
        gen = shard.generation + 1  # the one writer: the generation this write makes
        for p, v in zip(glob, old + 1, strict=True):
            versions.changes.setdefault(int(p), []).append((gen, int(v)))
            current[int(p)] = int(v)
        t0 = time.perf_counter()
        made = shard.write_pages(glob, diffs)
        ms = (time.perf_counter() - t0) * 1e3
        assert made == gen, (made, gen)
        times.append({"pages": int(glob.size), "write_ms": round(ms, 3)})
        stop.wait(max(0.0, interval - (time.monotonic() - t_block)))


def summary(lat: dict[str, list[float]], seconds: float) -> dict[str, dict]:
    out = {}
    for kind, xs in lat.items():
        if not xs:
            continue
        xs = sorted(xs)
        out[kind] = {"lookups": len(xs), "p50_ms": round(xs[len(xs) // 2], 3),
                     "p99_ms": round(xs[min(len(xs) - 1, int(len(xs) * 0.99))], 3),
                     "lookups_s": round(len(xs) / seconds, 2)}
    return out


def make_engine(dry_run: str | None) -> GpuEngine:
    if dry_run is None:
        return GpuEngine(pool_size=2)
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    from _gpu_fakes import FakeBackend

    backend = FakeBackend(mode=dry_run, sm_count=2, blocks_per_sm_value=1)
    return GpuEngine(backend=backend, kernel="sliced", pool_size=2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=None)
    ap.add_argument("--out", type=Path, default=Path("/tmp/morphogen-gpu-session"))
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=30.0, help="per lookup phase")
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--block-pages", type=int, default=3000)
    ap.add_argument("--interval", type=float, default=1.0, help="s between blocks")
    ap.add_argument("--dry-run", choices=("model", "emulator"), default=None)
    args = ap.parse_args()
    t_start = time.monotonic()
    engine = make_engine(args.dry_run)
    device = engine.device_name
    gib = args.gib or (1 / 64 if args.dry_run else 64 if engine.info.total_memory > 100 << 30
                       else 32)
    n = int(gib * (1 << 18))
    tables, parts = layout(n)
    pages = Pages(41)
    host = np.empty((n, 4096), np.uint8)
    t0 = time.perf_counter()
    pages.fill(host)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    shard = engine.load(host)
    loaded = time.perf_counter() - t0
    del host  # every expected page is computed from its stamp from here on
    result: dict[str, Any] = {"device": device, "gib": gib, "pages": n, "kernel": engine.layout,
                              "tables": [t.__dict__ for t in tables], "dry_run": args.dry_run,
                              "built_s": round(built, 1), "loaded_s": round(loaded, 1)}
    out = args.out / f"chain_tables_{device_slug(device)}.json"
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        result["wrong_pages"], result["checked_pages"] = check.wrong, check.checked
        out.write_text(json.dumps(result, indent=1))

    print(f"{device}: {n} pages ({gib:g} GiB), {len(tables)} tables, built {built:.1f} s, "
          f"loaded {loaded:.1f} s", flush=True)
    versions = Versions()
    check = Checker(pages, versions)
    rng = np.random.default_rng(7)
    biggest_levels = [max(ts[1:-1], key=lambda t: t.pages) for ts in parts.values()]
    print("== ratio: table query vs whole-matrix kernel over as many pages", flush=True)
    result["ratio"] = ratio_phase(shard, [ts[0] for ts in parts.values()] + biggest_levels,
                                  check, args.runs, time.monotonic() + 4 * args.seconds, rng)
    save()
    print("== lookups without updates", flush=True)
    base = lookup_phase(shard, parts, check, args.readers, args.seconds)
    result["lookups"] = summary(base, args.seconds)
    save()
    print("== lookups while blocks are written", flush=True)
    stop, times = threading.Event(), []
    w = threading.Thread(target=writer, args=(shard, tables, pages, versions, args.block_pages,
                                              args.interval, stop, times, 11))
    w.start()
    during = lookup_phase(shard, parts, check, args.readers, args.seconds)
    stop.set()
    w.join()
    result["lookups_during_updates"] = summary(during, args.seconds)
    writes = sorted(x["write_ms"] for x in times)
    result["blocks"] = {"count": len(times), "pages_each": args.block_pages,
                        "write_ms_p50": writes[len(writes) // 2] if writes else None,
                        "write_ms_max": writes[-1] if writes else None, "all": times}
    # after the blocks: one more lookup round checks every table on the final data
    lookup_phase(shard, parts, check, 1, min(args.seconds, 2.0))
    save()
    shard.close()
    print("\n== summary", device, f"{gib:g} GiB", engine.layout)
    for row in result["ratio"]:
        print(f"  ratio {row['table']:22s} Q={row['queries']}: {row['ratio']:.3f} "
              f"(table {row['table_ms']} ms, whole {row['whole_ms']} ms)")
    for kind, s in result["lookups"].items():
        d = result["lookups_during_updates"].get(kind, {})
        p99 = d.get("p99_ms")
        print(f"  {kind:9s} p50 {s['p50_ms']} ms p99 {s['p99_ms']} ms {s['lookups_s']}/s | "
              f"during updates p50 {d.get('p50_ms')} p99 {p99} {d.get('lookups_s')}/s, "
              f"p99 ratio {p99 / s['p99_ms'] if p99 else float('nan'):.2f}")
    b = result["blocks"]
    print(f"  blocks: {b['count']} of {b['pages_each']} pages, in device memory p50 "
          f"{b['write_ms_p50']} ms, max {b['write_ms_max']} ms")
    print(f"  pages checked {check.checked}, wrong {check.wrong}; "
          f"{time.monotonic() - t_start:.0f} s in all; {out}")
    return 1 if check.wrong else 0


if __name__ == "__main__":
    sys.exit(main())
