"""CPU scan engine against this machine's memory-read bandwidth, measured in the same run.

    python bench/scan_cpu.py [--matrix-mib 256] [--runs 5] [--key-format v1,packed]

For each key format named (v1: PROTOCOL.md's keys; packed: docs/packed-keys.md), in the same
run and against the same bandwidth figure, writes bench/results/scan_cpu_<format>.csv (and a
.png) and prints the ratios the targets speak of: Q=1 (3 keys) matrix bytes/time vs bandwidth,
Q=8 keys x matrix bytes/time vs bandwidth and vs Q=1's, and eval_range outputs per second on
one core. For packed keys, also the time a call's bucket XORs take alone (each page into one
bucket a group of eight keys, the buckets kept in L1) and the Q=8 gain over Q=1 they would
allow: what the kernel's design, not its overheads, bounds on this machine.

`--threads N` runs the engine on N threads (default: numba's, the machine's cores) and names
the files scan_cpu_<format>_t<N>.csv: on a machine shared with other work, a 2-thread call
waits for its slower thread, where one thread shows what the kernel does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, machine_label, median_seconds, plot, write_csv  # noqa: E402

from morphogen import engine
from morphogen.constants import KEYS_PER_QUERY  # noqa: E402
from morphogen.engine._cpu_packed_kernel import _page_into, plan_groups  # noqa: E402
from morphogen.protocol import _dpf_jit, dpf, packed  # noqa: E402
from morphogen.snapshot.layout import domain_bits_for  # noqa: E402
from morphogen.snapshot.synthetic import synthetic_pages  # noqa: E402

QUERIES = (1, 2, 4, 8, 16, 32)


@numba.njit(parallel=True, cache=True)
def _parallel_xor_read(words, lanes):
    acc = np.zeros((lanes, 8), np.uint64)
    n = words.shape[0] // 8
    for w in numba.prange(lanes):
        lo = n * w // lanes
        hi = n * (w + 1) // lanes
        for i in range(lo, hi):
            for j in range(8):
                acc[w, j] ^= words[8 * i + j]
    return acc


@numba.njit(parallel=True, cache=True)
def _bucket_xor_floor(words, groups, buckets):
    """Every page XORed into one bucket of each of `groups` groups with the packed kernel's own
    code (`_page_into`), each group's bucket fixed so that all stay in L1: the XORs a packed
    scan cannot do without, and nothing else (no keys, no patterns, no fold)."""
    rows = np.arange(groups)
    n = words.shape[0]
    lanes = buckets.shape[0]
    for w in numba.prange(lanes):
        lo = n * w // lanes
        hi = n * (w + 1) // lanes
        for p in range(lo, hi):
            _page_into(buckets[w], rows, groups, words[p])
    return buckets


def measure_eval_range(runs: int) -> float:
    key, _ = dpf.generate_keys(25, 12345)
    b = dpf.KeyBatch.from_keys([key])
    n = 1 << 22
    out = np.empty((n, 4), np.uint32)
    scratch = _dpf_jit.new_scratch()
    args = (b.root_seed[0], b.root_t[0], b.cw[0], b.tcw[0], b.final_cw[0], 25, 0, n, out)
    t = median_seconds(lambda: _dpf_jit.eval_range_into(*args, *scratch), runs)
    return n / t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix-mib", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--queries", default=",".join(map(str, QUERIES)))
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--threads", type=int, default=None,
                    help="engine threads (default: numba's)")
    ap.add_argument("--key-format", default="v1,packed",
                    help="comma-separated key formats to run (v1, packed)")
    args = ap.parse_args()
    queries = [int(q) for q in args.queries.split(",")]
    formats = args.key_format.split(",")

    num_pages = args.matrix_mib * 256
    d = domain_bits_for(num_pages)
    print(f"{machine_label()}, numba threads {numba.get_num_threads()}")
    print(f"matrix: {num_pages} pages ({args.matrix_mib} MiB), domain bits {d}")
    pages = synthetic_pages(7, 0, num_pages)
    words = pages.reshape(-1).view(np.uint64)

    bw = pages.nbytes / median_seconds(lambda: np.bitwise_xor.reduce(words), args.runs)
    lanes = numba.get_num_threads()
    bw_par = pages.nbytes / median_seconds(lambda: _parallel_xor_read(words, lanes), args.runs)
    print(f"memory read, NumPy XOR-reduce (the baseline): {bw / 1e9:.2f} GB/s")
    print(f"memory read, {lanes}-thread XOR-reduce (for context): {bw_par / 1e9:.2f} GB/s")

    er = measure_eval_range(args.runs)
    print(f"eval_range: {er / 1e6:.1f} M outputs/s on one core (target >= 50)")

    shard = engine.create("cpu", threads=args.threads).load(pages)
    suffix = "" if args.threads is None else f"_t{args.threads}"
    for fmt in formats:
        rows = _run_format(fmt, shard, pages, d, queries, args.runs, bw, bw_par, er)
        _report(fmt + suffix, rows, args.out, args.matrix_mib)


def _batch(fmt: str, d: int, targets: list[int]):
    if fmt == "packed":
        return packed.PackedKeyBatch.from_keys(
            [packed.generate_packed_keys(d, t)[0] for t in targets])
    if fmt == "v1":
        return dpf.KeyBatch.from_keys([dpf.generate_keys(d, t)[0] for t in targets])
    raise SystemExit(f"unknown key format {fmt!r}")


def _run_format(fmt, shard, pages, d, queries, runs, bw, bw_par, er) -> list[dict]:
    num_pages = pages.shape[0]
    rng = np.random.default_rng(1)
    rows = []
    print(f"-- key format {fmt}")
    for q in queries:
        batch = _batch(fmt, d, [int(rng.integers(num_pages)) for _ in range(q * 3)])
        t = median_seconds(lambda batch=batch: shard.scan(batch), runs)
        rows.append(
            {
                "key_format": fmt,
                "queries": q,
                "keys": q * KEYS_PER_QUERY,
                "ms": round(t * 1e3, 3),
                "matrix_gbps": round(pages.nbytes / t / 1e9, 3),
                "key_matrix_gbps": round(q * KEYS_PER_QUERY * pages.nbytes / t / 1e9, 3),
                "matrix_vs_bw": round(pages.nbytes / t / bw, 3),
                "key_matrix_vs_bw": round(q * KEYS_PER_QUERY * pages.nbytes / t / bw, 3),
                "queries_per_s": round(q / t, 2),
                "bw_numpy_gbps": round(bw / 1e9, 3),
                "bw_threads_gbps": round(bw_par / 1e9, 3),
                "eval_range_mops": round(er / 1e6, 2),
            }
        )
        r = rows[-1]
        if fmt == "packed":
            r["xor_floor_ms"] = round(_xor_floor(shard, pages, q, runs) * 1e3, 3)
            # what Q=1's key-effective bandwidth times this Q would be were the scan its XORs
            r["gain_ceiling"] = round(q * rows[0]["ms"] / r["xor_floor_ms"], 2) \
                if rows[0]["queries"] == 1 else None
        print(
            f"Q={q:2d} ({r['keys']:2d} keys): {r['ms']:8.1f} ms"
            f"  matrix {r['matrix_gbps']:6.2f} GB/s"
            f" ({r['matrix_vs_bw']:.2f} x bw)  keys x matrix {r['key_matrix_gbps']:7.2f} GB/s"
            f" ({r['key_matrix_vs_bw']:.2f} x bw)  {r['queries_per_s']:.1f} queries/s"
            + (f"  bucket XORs alone {r['xor_floor_ms']:.1f} ms" if "xor_floor_ms" in r else "")
        )
    return rows


def _xor_floor(shard, pages, q: int, runs: int) -> float:
    """Seconds the bucket XORs of a packed Q-query call take alone on the engine's threads:
    the passes and groups the engine plans for 3Q keys over its workers' shares."""
    eng = shard._engine
    share = -(-pages.shape[0] // eng.threads)
    keys, step = q * KEYS_PER_QUERY, min(eng.max_keys, eng.packed_pass_keys)
    passes = [min(step, keys - k) for k in range(0, keys, step)]
    groups = [len(plan_groups(k, share, eng.packed_group_keys)[1]) for k in passes]
    words = pages.reshape(pages.shape[0], -1).view(np.uint64)
    buckets = np.zeros((eng.threads, max(groups), words.shape[1]), np.uint64)

    def call() -> None:
        for g in groups:
            _bucket_xor_floor(words, g, buckets)

    prev = numba.get_num_threads()
    numba.set_num_threads(eng.threads)
    try:
        return median_seconds(call, runs)
    finally:
        numba.set_num_threads(prev)


def _report(fmt: str, rows: list[dict], out: Path, matrix_mib: int) -> None:
    by_q = {r["queries"]: r for r in rows}
    if 1 in by_q:
        print(f"[{fmt}] target Q=1: matrix/time >= 0.8 x bw: {by_q[1]['matrix_vs_bw']:.2f}")
    if 8 in by_q:
        print(f"[{fmt}] target Q=8: keys x matrix/time >= 2.5 x bw: "
              f"{by_q[8]['key_matrix_vs_bw']:.2f}")
    if 1 in by_q and 8 in by_q:
        gain = by_q[8]["key_matrix_gbps"] / by_q[1]["key_matrix_gbps"]
        print(f"[{fmt}] target Q=8 key-effective bandwidth >= 6 x Q=1's: {gain:.2f}")
        if by_q[8].get("gain_ceiling"):
            print(f"[{fmt}] Q=8 were the call its bucket XORs alone: "
                  f"{by_q[8]['gain_ceiling']:.2f} x Q=1's")
    write_csv(out / f"scan_cpu_{fmt}.csv", rows)

    def draw(ax) -> None:
        qs = [r["queries"] for r in rows]
        ax.plot(qs, [r["key_matrix_vs_bw"] for r in rows], "o-", label="keys x matrix / time")
        ax.plot(qs, [r["matrix_vs_bw"] for r in rows], "s-", label="matrix / time")
        ax.axhline(1.0, color="grey", ls="--", label="memory-read bandwidth (NumPy)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("queries per call (3 keys each)")
        ax.set_ylabel("x memory-read bandwidth")
        ax.set_title(f"CPU scan ({fmt} keys), {matrix_mib} MiB matrix, {machine_label()}")
        ax.legend()

    plot(out / f"scan_cpu_{fmt}.png", draw)


if __name__ == "__main__":
    main()
