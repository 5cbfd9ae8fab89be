"""`morphogen demo`: a local Ray cluster, both parties on one synthetic snapshot, private
fetches over HTTP and Serve handles, every page checked against the snapshot."""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cluster.report import eprint, latency_row, print_table


def run_demo(args: argparse.Namespace) -> int:
    from cluster import local

    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="morphogen-demo-")
    eprint(f"[demo] starting a local Ray cluster ({os.cpu_count()} cores)")
    cluster = local.start(
        port=args.port, num_cpus=max(2, os.cpu_count() or 2), disable_auth=True,
        temp_dir=None,
    )
    ok = False
    try:
        ok = _demo(args, cluster, workdir)
    finally:
        eprint("[demo] shutting down")
        local.stop(cluster)
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    eprint(f"[demo] {'all pages verified' if ok else 'FAILED'} in "
           f"{time.monotonic() - started:.1f}s")
    return 0 if ok else 1


def _demo(args: argparse.Namespace, cluster: Any, workdir: str) -> bool:
    import numpy as np
    from ray import serve

    from cluster import local
    from deployments.app import build_app
    from morphogen.client import HandlePirClient, PirClient
    from morphogen.config import PartyConfig
    from morphogen.snapshot.source import open_snapshot

    shared = {
        "synthetic_pages": args.pages,
        "synthetic_seed": args.seed,
        "cache_dir": workdir,
        "engine": args.engine,
        "shard_num_cpus": 0.25,
        "router_num_cpus": 0.1,
        "graceful_shutdown_timeout_s": 1.0,
    }
    cfg_a = PartyConfig(**shared, num_shards=args.shards_a)
    cfg_b = PartyConfig(**shared, num_shards=args.shards_b)
    eprint(f"[demo] synthetic snapshot: {args.pages} pages "
           f"({args.pages * 4096 / 2**20:.0f} MiB)")
    snap = open_snapshot(cfg_a)
    t = time.monotonic()
    eprint(f"[demo] deploying party A ({args.shards_a} shards) at /a and party B "
           f"({args.shards_b} shards) at /b")
    serve.run(build_app(cfg_a), name="a", route_prefix="/a", blocking=False)
    serve.run(build_app(cfg_b), name="b", route_prefix="/b", blocking=False)
    local.wait_routed([cluster.app_url("/a"), cluster.app_url("/b")])
    eprint(f"[demo] both parties ready in {time.monotonic() - t:.1f}s; "
           f"HTTP at {cluster.url}/a and {cluster.url}/b")

    rng = random.Random(args.seed + 1)
    n = snap.num_pages
    rows: list[list[str]] = []
    mismatches = 0
    fetched = 0

    def check(wanted: Sequence[int], got: Sequence[bytes]) -> None:
        nonlocal mismatches, fetched
        for p, page in zip(wanted, got, strict=True):
            fetched += 1
            if page != np.asarray(snap.pages(p, p + 1)[0]).tobytes():
                mismatches += 1

    def one_query_at_a_time(name: str, get: Any) -> None:
        """`args.requests` sequential requests of one query (3 pages) each, as a table row."""
        lat = []
        t0 = time.monotonic()
        for _ in range(args.requests):
            wanted = [rng.randrange(n) for _ in range(3)]
            t = time.monotonic()
            got = get(wanted)
            lat.append(time.monotonic() - t)
            check(wanted, got)
        rows.append(latency_row(name, 3 * args.requests, lat, args.requests,
                                time.monotonic() - t0))

    url_a, url_b = cluster.app_url("/a"), cluster.app_url("/b")
    for encoding in ("json", "msgpack"):
        with PirClient(url_a, url_b, encoding=encoding) as c:
            c.info()
            one_query_at_a_time(f"http {encoding}, 1 query/request", c.get)

    # 16 clients at once: the routers merge their requests into shared scans.
    with PirClient(url_a, url_b) as c:
        c.info()
        lat = []

        def one(seed: int) -> None:
            r = random.Random(seed)
            wanted = [r.randrange(n) for _ in range(3)]
            t = time.monotonic()
            got = c.get(wanted)
            lat.append(time.monotonic() - t)
            check(wanted, got)

        t0 = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(one, range(args.requests * 4)))
        rows.append(latency_row("http json, 16 concurrent", 3 * len(lat), lat, len(lat),
                                time.monotonic() - t0))

    with PirClient(url_a, url_b) as c:
        wanted = [rng.randrange(n) for _ in range(96)]
        t = time.monotonic()
        got = c.get(wanted)
        dt = time.monotonic() - t
        check(wanted, got)
        rows.append(latency_row("http json, batch of 32", 96, [dt], 32, dt))

    hc = HandlePirClient(serve.get_app_handle("a"), serve.get_app_handle("b"))
    hc.info()
    one_query_at_a_time("handles, 1 query/request", hc.get)

    print()
    print_table(["path", "pages", "requests", "p50 ms", "p99 ms", "queries/s"], rows)
    print()
    print(f"{fetched} pages fetched privately, {fetched - mismatches} byte-identical to the "
          f"snapshot, {mismatches} wrong")
    snap.close()
    ok = mismatches == 0 and fetched > 0
    if args.records:
        from cluster.demo_records import run_records_demo

        # the page parties' CPU slots go to the keyword parties (2 cores hold both sets only
        # just, and a replica that does not fit waits forever)
        serve.delete("a")
        serve.delete("b")
        ok = run_records_demo(args, cluster, workdir) and ok
    return ok
