"""What a publication costs in the epoch log: a directory on local disk against write-once
objects on an S3 server, in one run, and the object log's cost in requests.

A publication here is what a router writes to the log for one page-update batch: the batch
(one blob), the proposal and the commit decision (two records), through `EpochLog.propose` and
`EpochLog.decide`, with no shards behind it (their prepare and commit cost the same whatever
the backend). For the object log the requests are counted by kind, and the raw latency of the
same requests (a create-only PUT, a LIST, a GET of one small object) is measured against the
same server in the same run, so the publication time reads as a number of round trips.

Against an S3 protocol server on loopback (moto's server mode, started here) unless --endpoint
names another (then AWS_* credentials come from the environment and --bucket must exist).

    python bench/log_publish.py            # 200 publications per run, 3 runs
    python bench/log_publish.py --quick    # 40 per run
Results: bench/results/log_publish.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def publish_rate(log, count: int, rng: np.random.Generator, tag: str) -> float:
    """Publications per second of `count` one-page batches through `log`."""
    from bench._common import build_updates
    from morphogen.protocol.changes import ChangeBatch

    batches = [ChangeBatch(rng.integers(0, 1 << 20, 1, dtype=np.int64), np.array([True]),
                           rng.integers(0, 256, 4096, np.uint8).tobytes())
               for _ in range(count)]
    t = time.perf_counter()
    for i, batch in enumerate(batches):
        p = log.propose(f"{tag}-{i}", f"req-{tag}-{i}", "bench", 60.0, build_updates(batch))
        log.decide(p, "commit")
    return count / (time.perf_counter() - t)


class Counted:
    """Counts the object store requests of one `LogObjects` by kind."""

    def __init__(self, objects) -> None:
        self.calls: Counter[str] = Counter()
        ob = objects._ob

        def wrap(name: str):
            real = getattr(ob, name)

            def call(*args, **kwargs):
                if name == "put":
                    self.calls["create" if kwargs.get("mode") == "create" else "put"] += 1
                else:
                    self.calls[name] += 1
                return real(*args, **kwargs)
            return call

        class Proxy:
            get, put, list, delete = (wrap(n) for n in ("get", "put", "list", "delete"))

        objects._ob = Proxy


def raw_latency(uri: str, runs: int) -> dict[str, float]:
    """Median seconds of one create-only PUT, one LIST (after the newest key) and one small GET
    on the same store."""
    import obstore

    from morphogen.storage import open_location

    loc = open_location(uri)
    out: dict[str, list[float]] = {"create": [], "list": [], "get": []}
    for i in range(runs):
        key = loc.key(f"raw/{i:06d}")
        t = time.perf_counter()
        obstore.put(loc.store, key, b"x" * 200, mode="create")
        out["create"].append(time.perf_counter() - t)
        t = time.perf_counter()  # from the newest key on, as the log lists its records
        obstore.list(loc.store, prefix=loc.key("raw"), offset=key).collect()
        out["list"].append(time.perf_counter() - t)
        t = time.perf_counter()
        obstore.get(loc.store, key).bytes()
        out["get"].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=200, help="publications per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--endpoint", default=None, help="an S3 endpoint (default: moto, here)")
    ap.add_argument("--bucket", default="morphogen-bench")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "log_publish.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.count, args.runs = 40, 1
    sys.path.insert(0, str(ROOT))
    from morphogen.publication.log import EpochLog

    server = None
    if args.endpoint is None:
        from tests.s3.server import running_s3_server

        server = running_s3_server()
        s3 = server.__enter__()
        os.environ.update(s3.env())
        s3.boto().create_bucket(Bucket=args.bucket)
        where = f"moto S3 server on loopback ({s3.endpoint})"
    else:
        os.environ["AWS_ENDPOINT_URL"] = args.endpoint
        where = args.endpoint
    rng = np.random.default_rng(7)
    work = Path(tempfile.mkdtemp(prefix="morphogen-logbench-"))
    rates: dict[str, list[float]] = {"directory": [], "s3": []}
    calls: Counter[str] = Counter()
    try:
        stamp = int(time.time())
        for run in range(args.runs):
            # interleaved: drift on a shared machine hits both backends alike
            rates["directory"].append(publish_rate(EpochLog(work / f"log-{run}"), args.count,
                                                   rng, f"d{run}"))
            log = EpochLog(f"s3://{args.bucket}/bench/log-{stamp}-{run}")
            counted = Counted(log._objects)
            rates["s3"].append(publish_rate(log, args.count, rng, f"s{run}"))
            calls += counted.calls
        raw = raw_latency(f"s3://{args.bucket}/bench/raw-{stamp}", 50)
    finally:
        if server is not None:
            server.__exit__(None, None, None)
    per_pub = {k: round(v / (args.count * args.runs), 2) for k, v in sorted(calls.items())}
    s3_rate = statistics.median(rates["s3"])
    # what the requests counted would take at the raw latencies, one after another
    raw_s = sum(per_pub.get(k, 0) * raw[k] for k in ("create", "list", "get")) + \
        per_pub.get("put", 0) * raw["create"]
    result = {
        "server": where,
        "machine": f"{os.cpu_count()} cpus",
        "publications_per_run": args.count,
        "runs": args.runs,
        "directory_publications_per_s": round(statistics.median(rates["directory"]), 1),
        "s3_publications_per_s": round(s3_rate, 1),
        "s3_requests_per_publication": per_pub,
        "raw_ms": {k: round(v * 1e3, 2) for k, v in raw.items()},
        "s3_publication_ms": round(1e3 / s3_rate, 2),
        "s3_publication_over_raw_requests": round((1 / s3_rate) / raw_s, 2),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
