"""A new replica's snapshot fetch from object storage: time from placement to pages ready,
its fetch rate against the raw GET rate of the same server in the same run, and the
load-time verification rate.

Against an S3 protocol server on loopback (moto's server mode, started here) unless
--endpoint names another (MinIO, say: then AWS_* credentials come from the environment and
--bucket must exist). For each run: a fresh node cache, `RemoteSnapshot.open` +
`read_verified` of one shard's range (what a shard replica does when placed), timed; then the
same bytes by plain ranged GETs in parallel (the same part size and threads: the raw rate);
then `read_verified` again from the warm cache (verification alone). Medians of --runs.

    python bench/fetch.py                 # 256 MiB snapshot, 2 shards, 5 runs
    python bench/fetch.py --quick         # 32 MiB, 3 runs
Results: bench/results/fetch.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--chunk-pages", type=int, default=4096, help="16 MiB chunks")
    ap.add_argument("--endpoint", default=None, help="an S3 endpoint (default: moto, here)")
    ap.add_argument("--bucket", default="morphogen-bench")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "fetch.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.mib, args.runs = 32, 3

    import obstore

    from morphogen.snapshot.chunk_cache import FETCH_THREADS, PART_BYTES
    from morphogen.snapshot.layout import shard_ranges
    from morphogen.snapshot.open import open_any
    from morphogen.snapshot.synthetic import build_synthetic
    from morphogen.storage import open_location

    server = None
    if args.endpoint is None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.s3.server import running_s3_server

        server = running_s3_server()
        s3 = server.__enter__()
        os.environ.update(s3.env())
        s3.boto().create_bucket(Bucket=args.bucket)
        where = f"moto S3 server on loopback ({s3.endpoint})"
    else:
        os.environ["AWS_ENDPOINT_URL"] = args.endpoint
        where = args.endpoint
    work = Path(tempfile.mkdtemp(prefix="morphogen-fetch-"))
    try:
        pages = args.mib * 256
        build_synthetic(work / "snap", pages, seed=5, chunk_pages=args.chunk_pages,
                        progress=False)
        uri = f"s3://{args.bucket}/bench/snap-{pages}"
        loc = open_location(uri)
        for f in ("manifest.json", "pages.bin"):
            obstore.put(loc.store, loc.key(f), (work / "snap" / f).read_bytes())
        first, stop = shard_ranges(pages, args.shards)[0]
        cp = args.chunk_pages
        lo, hi = first // cp * cp * 4096, min(pages, -(-stop // cp) * cp) * 4096
        nbytes = hi - lo
        key = loc.key("pages.bin")
        fetch_s, raw_s, verify_s = [], [], []
        for run in range(args.runs):
            cache = work / f"cache-{run}"
            t = time.perf_counter()
            with open_any(uri, cache_dir=cache) as snap:  # a replica placed on a new node
                snap.read_verified(first, stop)
            fetch_s.append(time.perf_counter() - t)
            parts = [(s, min(hi, s + PART_BYTES)) for s in range(lo, hi, PART_BYTES)]
            t = time.perf_counter()
            with ThreadPoolExecutor(FETCH_THREADS) as pool:
                got = sum(len(b) for b in pool.map(
                    lambda r: obstore.get_range(loc.store, key, start=r[0], end=r[1]), parts))
            raw_s.append(time.perf_counter() - t)
            assert got == nbytes
            t = time.perf_counter()
            with open_any(uri, cache_dir=cache) as snap:  # a second replica: cache only
                snap.read_verified(first, stop)
            verify_s.append(time.perf_counter() - t)
            shutil.rmtree(cache)
        med = {k: statistics.median(v) for k, v in
               (("fetch", fetch_s), ("raw", raw_s), ("verify", verify_s))}
        gib = nbytes / 2**30
        result = {
            "server": where, "snapshot_mib": args.mib, "shard_range_mib": nbytes / 2**20,
            "runs": args.runs, "machine": f"{os.cpu_count()} cpus",
            "placement_to_pages_ready_s": round(med["fetch"], 3),
            "fetch_mib_per_s": round(nbytes / 2**20 / med["fetch"], 1),
            "raw_get_mib_per_s": round(nbytes / 2**20 / med["raw"], 1),
            "fetch_over_raw": round(med["raw"] / med["fetch"], 3),
            "cached_load_verify_s_per_gib": round(med["verify"] / gib, 3),
        }
        print(json.dumps(result, indent=1))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if server is not None:
            server.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
