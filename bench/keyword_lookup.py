"""Keyword tables: build rate, load reached, lookups through HTTP against page reads, and the
client's verification time.

1. Build rate: records/s of `build_table` at `--records` (default 1 M) synthetic accounts
   (20-byte addresses, 32-byte values), for both bucket layouts.
2. Load factor reached with zero stash: the fullest fixed size at which a build still places
   every record (bisection on the bucket count, `--load-records` records).
3. Through HTTP, in one run on one local Ray: two parties serve a keyword table; lookups/s of
   `KeywordClient.get_many` (one query of three keys per lookup, every page verified) against
   page reads/s of `PirClient.get` with the same number of random three-page queries per
   request, sequential and batched, for a small table (where the scan is nearly free and the
   client's checks show) and a 1 M-record one. Target: lookups/s >= 0.9 of
   page-query reads/s.
   Requests are padded to a bucket of lookups (docs/keyword.md); `--per-request` sizes that
   are buckets measure no padding.
4. Client check time per lookup: `verify.check` on the pages of 1 and of 32 lookups at once
   (every page hashed up its path to the version's root, and the slot scan), per lookup, with
   the client's default levels and with every level but the top read privately.
5. Tree scan: the pages the servers scan for the tree, per page of the data scan, a lookup
   and once a version.

    python bench/keyword_lookup.py          # 1 M records, 20 s per HTTP measurement
    python bench/keyword_lookup.py --quick  # 100 k records, short measurements
    python bench/keyword_lookup.py --parts verify http --http-records 50000 --seconds 12
    python bench/keyword_lookup.py --parts http --key-format v1 packed \
        --out bench/results/keyword_http_v1_packed.json
Results: bench/results/keyword.json. With several `--key-format`s (v1: PROTOCOL.md's keys,
packed: docs/packed-keys.md), each HTTP figure is measured for each format in the same run,
interleaved, on the same parties (the client made to use that format).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PARTS = {"build": "build", "load": "max_load", "verify": "verification", "http": "http",
         "tree": "tree_scan"}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build_rates(n: int, runs: int) -> dict:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from morphogen.keyword import build_table
    from morphogen.keyword.accounts import synthetic_accounts

    key = Ed25519PrivateKey.generate()
    accounts = synthetic_accounts(n, seed=1)
    out = {}
    for layout, row_size in (("page", 0), ("row", 128)):
        times, loads = [], []
        for _ in range(runs):
            t = time.perf_counter()
            table = build_table(accounts, value_size=32, signing_key=key, layout=layout,
                                row_size=row_size)
            times.append(time.perf_counter() - t)
            loads.append(table.stats.load)
        med = statistics.median(times)
        out[layout] = {"records": n, "seconds_median": round(med, 3),
                       "records_per_s": round(n / med), "load_at_default_size": min(loads),
                       "pages": table.descriptor.geometry.num_pages}
        _log(f"[bench] build {layout}: {n} records in {med:.2f} s ({n / med:,.0f} records/s)")
    return out


def max_load(n: int) -> dict:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from morphogen.keyword import TableFullError, build_table
    from morphogen.keyword.accounts import synthetic_accounts
    from morphogen.keyword.layout import Geometry

    key = Ed25519PrivateKey.generate()
    accounts = synthetic_accounts(n, seed=2)
    out = {}
    for layout, row_size in (("page", 0), ("row", 128)):
        per = Geometry(layout, 32, 1, row_size).slots_per_bucket
        lo, hi = -(-n // per), int(n / per / 0.7) + 1  # lo: exactly full; hi: 70 % full
        while hi - lo > max(1, lo // 500):
            mid = (lo + hi) // 2
            try:
                build_table(accounts, value_size=32, signing_key=key, layout=layout,
                            row_size=row_size, num_buckets=mid)
                hi = mid
            except TableFullError:
                lo = mid
        out[layout] = {"records": n, "num_buckets": hi, "load": round(n / (hi * per), 4),
                       "stash": 0}
        _log(f"[bench] fullest {layout} table: {n / (hi * per):.1%} with zero stash")
    return out


def verify_time(runs: int, per_request: list[int]) -> dict:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from morphogen.keyword import build_table
    from morphogen.keyword.accounts import synthetic_accounts
    from morphogen.keyword.verify import check, plan, private_levels, prove_whole

    key = Ed25519PrivateKey.generate()
    accounts = synthetic_accounts(200_000, seed=3)
    table = build_table(accounts, value_size=32, signing_key=key)
    desc, pages = table.descriptor, table.pages
    g = desc.geometry
    out: dict = {"table_pages": g.num_pages, "levels": g.levels}
    # the client's default (levels of up to 128 pages read whole once a version: the paths end
    # there), and every level but the top read privately, a page a candidate
    for name, whole in (("default", 128), ("private_levels", 1)):
        private = private_levels(desc, whole)
        t = time.perf_counter()
        proof = prove_whole(desc, private, {
            k: [pages[g.level_first(k) + i].tobytes() for i in range(g.levels[k - 1])]
            for k in range(private + 1, len(g.levels) + 1)})
        whole_s = time.perf_counter() - t
        firsts = [0] + [g.level_first(k) for k in range(1, private + 1)]
        for q in per_request:
            batches = [[k for k, _ in accounts[i:i + q]] for i in range(0, runs * q, q)][:runs]
            times = []
            for b in batches:
                wanted, buckets = plan(proof, b)
                got = [[pages[f + p].tobytes() for p in want]
                       for f, want in zip(firsts, wanted, strict=True)]
                t = time.perf_counter()
                check(proof, b, buckets, got)
                times.append((time.perf_counter() - t) / q)
            med = statistics.median(times)
            _log(f"[bench] client check ({name}: {private} level(s) read privately), {q} "
                 f"lookups at once: {med * 1e6:.1f} us per lookup")
            out[f"{name}_lookups_{q}"] = {"us_per_lookup_median": round(med * 1e6, 1),
                                          "private_levels": private}
        out[f"{name}_version_check_ms"] = round(whole_s * 1e3, 2)
    return out


def tree_scan_fraction(records: int) -> dict:
    """Pages the servers scan for the tree a lookup, per page of the data scan: the levels
    read privately (three queries each, like the data) and, once a version, the levels read
    whole (one query a page of the level)."""
    from morphogen.keyword import Geometry
    from morphogen.keyword.build import DEFAULT_LOAD, _sizes

    out = {}
    for n in records:
        g = Geometry("page", 32, _sizes(n, "page", 32, 0, DEFAULT_LOAD["page"]))
        private = [n_ for n_ in g.levels if n_ > 128]
        whole = [n_ for n_ in g.levels if n_ <= 128]
        out[f"records_{n}"] = {
            "data_pages": g.data_pages, "levels": g.levels,
            "per_lookup": round(sum(private) / g.data_pages, 5),
            "per_version": round(sum(n_ * n_ for n_ in whole) / g.data_pages, 5)}
        _log(f"[bench] {n} records: tree scan {sum(private) / g.data_pages:.4f} of the data "
             f"scan a lookup, {sum(n_ * n_ for n_ in whole) / g.data_pages:.4f} once a version")
    return out


def _rate(fn, seconds: float) -> tuple[float, int]:
    fn()  # warm
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        done += fn()
    return done / (time.perf_counter() - t0), done


def http_rates(sizes: list[int], seconds: float, per_request: list[int],
               whole_level_pages: int, formats: list[str]) -> dict:
    from _common import serve_two_parties
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from ray import serve

    from cluster import local
    from morphogen.keyword import build_table
    from morphogen.keyword.accounts import synthetic_accounts
    from morphogen.keyword.owner import create_owner_dir

    key = Ed25519PrivateKey.generate()
    work = Path(tempfile.mkdtemp(prefix="morphogen-kwbench-"))
    rng = random.Random(5)
    out: dict = {}
    with local.running(num_cpus=max(2, os.cpu_count() or 2), disable_auth=True) as cluster:
        for n in sizes:
            # one table at a time on the machine: the other's parties would share its cores
            accounts = dict(synthetic_accounts(n, seed=4))
            table = build_table(accounts.items(), value_size=32, signing_key=key)
            snapshot = create_owner_dir(table, work / f"owner-{n}")
            num_pages = table.descriptor.geometry.num_pages
            keys = sorted(accounts)
            serve_two_parties(cluster, snapshot, work, admin=False)
            out[f"records_{n}"] = _http_pair(cluster, key, accounts, keys, num_pages, rng,
                                             seconds, per_request, whole_level_pages, formats)
            for name in ("a", "b"):
                serve.delete(name)
    return out


def _http_pair(cluster, key, accounts: dict, keys: list, num_pages: int, rng: random.Random,
               seconds: float, per_request: list[int], whole_level_pages: int,
               formats: list[str]) -> dict:
    from morphogen.client import PirClient
    from morphogen.keyword import KeywordClient

    out: dict = {"table_pages": num_pages, "table_mib": round(num_pages * 4096 / 2**20, 1),
                 "whole_level_pages": whole_level_pages}
    pirs = {f: PirClient(cluster.app_url("/a"), cluster.app_url("/b"), encoding="msgpack",
                         key_format="v1" if f == "v1" else "auto") for f in formats}
    try:
        kcs = {}
        for f, pir in pirs.items():
            if pir.info().key_format() != f and f != "v1":
                raise SystemExit(f"the parties do not take {f} keys")
            kcs[f] = KeywordClient(pir, key.public_key(), whole_level_pages=whole_level_pages)
            kcs[f].descriptor()
        for q_req in per_request:
            def pages_fn(f: str, q=q_req) -> int:
                pirs[f].get([rng.randrange(num_pages) for _ in range(3 * q)])
                return q

            def lookups_fn(f: str, q=q_req) -> int:
                wanted = rng.sample(keys, q)
                got = kcs[f].get_many(wanted)
                assert got == [accounts[k] for k in wanted]
                return q

            # interleaved thirds, formats in turn: drift on a shared machine hits all alike
            page_rates: dict = {f: [] for f in formats}
            lookup_rates: dict = {f: [] for f in formats}
            for _ in range(3):
                for f in formats:
                    page_rates[f].append(_rate(lambda f=f: pages_fn(f), seconds / 6)[0])
                    lookup_rates[f].append(_rate(lambda f=f: lookups_fn(f), seconds / 6)[0])
            for f in formats:
                pr = statistics.median(page_rates[f])
                lr = statistics.median(lookup_rates[f])
                name = f"queries_per_request_{q_req}"
                if len(formats) > 1:
                    name += f"_{f}"
                out[name] = {"key_format": f, "page_queries_per_s": round(pr, 1),
                             "lookups_per_s": round(lr, 1), "ratio": round(lr / pr, 3)}
                _log(f"[bench] {num_pages} pages, {q_req} per request, {f} keys: {lr:.1f} "
                     f"lookups/s against {pr:.1f} page queries/s: {lr / pr:.2f}")
            if "v1" in formats and "packed" in formats:
                gain = (statistics.median(lookup_rates["packed"])
                        / statistics.median(lookup_rates["v1"]))
                out[f"packed_vs_v1_lookups_{q_req}"] = round(gain, 3)
                _log(f"[bench] {q_req} per request: packed/v1 lookups/s {gain:.2f}")
    finally:
        for pir in pirs.values():
            pir.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--load-records", type=int, default=200_000)
    ap.add_argument("--http-records", type=int, nargs="+", default=[50_000, 1_000_000],
                    help="table sizes served in turn for the HTTP comparison")
    ap.add_argument("--seconds", type=float, default=20.0, help="per HTTP measurement")
    ap.add_argument("--per-request", type=int, nargs="+", default=[1, 32],
                    help="lookups (and three-page queries) per request, measured in turn")
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS),
                    help="what to measure (all by default)")
    ap.add_argument("--whole-level-pages", type=int, default=128,
                    help="the client's whole_level_pages (1: every level but the top read "
                         "privately, a page a candidate)")
    ap.add_argument("--runs", type=int, default=3, help="builds per layout (median)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--key-format", nargs="+", default=["v1"], choices=["v1", "packed"],
                    help="key formats the HTTP figures are measured with, in the same run")
    ap.add_argument("--out", default=str(RESULTS / "keyword.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.records, args.load_records, args.http_records, args.seconds, args.runs = (
            100_000, 20_000, [5_000], 6.0, 1)
    parts = {
        "build": lambda: build_rates(args.records, args.runs),
        "max_load": lambda: max_load(args.load_records),
        "verification": lambda: verify_time(300, args.per_request),
        "http": lambda: http_rates(args.http_records, args.seconds, args.per_request,
                                   args.whole_level_pages, args.key_format),
        "tree_scan": lambda: tree_scan_fraction([50_000, 1_000_000, 100_000_000]),
    }
    result: dict = {"machine": f"{os.cpu_count()} cpus"}
    for part in args.parts:
        result[PARTS[part]] = parts[PARTS[part]]()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
