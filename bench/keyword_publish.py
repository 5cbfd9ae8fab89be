"""Publish time of a keyword-table version touching 10,000 pages, through two real parties.

One local Ray runs two parties (one shard each, CPU engine) serving a table of one record a
page (4000-byte values, `--pages` records in 1.2 times as many buckets). Each run changes every
record's value (the owner's `apply`, timed apart), then times `records publish` of that version
from the owner's call to both parties' answers: the version's snapshot written where the
parties rotate from, and one rotation on each party (checksum verified, every shard loaded,
switched in one step). A version that size is larger than one batch, so it goes as a rotation.

    python bench/keyword_publish.py              # 10,000 pages, 3 runs
    python bench/keyword_publish.py --runs 5
Results: bench/results/keyword_publish.json (median over the runs, and every run)
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
VALUE_SIZE = 4000  # one record a page: a change of every value touches every record's page


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(pages: int, runs: int) -> dict:
    from _common import serve_two_parties
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from ray import serve

    from cluster import local
    from cluster.parties import HttpParties
    from morphogen.client import PirClient
    from morphogen.client.admin import AdminClient
    from morphogen.keyword import KeywordClient, build_table
    from morphogen.keyword.owner import Change, OwnerTable, create_owner_dir
    from morphogen.keyword.publishing import publish

    key = Ed25519PrivateKey.generate()
    work = Path(tempfile.mkdtemp(prefix="morphogen-kwpublish-"))
    rng = random.Random(1)
    records = {rng.randbytes(20): rng.randbytes(VALUE_SIZE) for _ in range(pages)}
    table = build_table(records.items(), value_size=VALUE_SIZE, signing_key=key,
                        num_buckets=int(pages * 1.2))
    snapshot = create_owner_dir(table, work / "owner")
    (work / "token").write_text("kw-publish-bench-token-0123456789")
    (work / "snaps").mkdir()
    out: dict = {"records_changed": pages, "table_pages": table.descriptor.geometry.num_pages,
                 "table_mib": round(table.descriptor.geometry.num_pages * 4096 / 2**20, 1),
                 "runs": []}
    with local.running(num_cpus=max(2, os.cpu_count() or 2), disable_auth=True) as cluster:
        urls = serve_two_parties(cluster, snapshot, work)
        owner = OwnerTable(work / "owner")
        token = (work / "token").read_text()
        for i in range(runs):
            changed = {k: rng.randbytes(VALUE_SIZE) for k in records}
            t = time.perf_counter()
            version, batch = owner.apply([Change("put", k, v) for k, v in changed.items()], key)
            applied = time.perf_counter() - t
            admins = [AdminClient(u, token) for u in urls]
            try:
                t = time.perf_counter()
                done = publish(owner, HttpParties(admins, retry_for_s=120.0, max_updates=None),
                               snapshot_dir=str(work / "snaps"))
                seconds = time.perf_counter() - t
            finally:
                for a in admins:
                    a.close()
            assert [(p.version, p.mode) for p in done] == [(version, "rotation")]
            records.update(changed)
            with PirClient(*urls, encoding="msgpack") as pir:
                probe = rng.sample(sorted(records), 8)
                assert KeywordClient(pir, key.public_key()).get_many(probe) == [
                    records[k] for k in probe]
            out["runs"].append({"version": version, "pages": len(batch),
                                "publish_s": round(seconds, 3), "apply_s": round(applied, 3)})
            _log(f"[bench] run {i + 1}: version {version}, {len(batch)} pages: publish "
                 f"{seconds:.2f} s (apply {applied:.2f} s)")
        for name in ("a", "b"):
            serve.delete(name)
    out["pages_changed"] = out["runs"][-1]["pages"]  # data, their tree paths, the descriptor
    out["publish_s_median"] = statistics.median(r["publish_s"] for r in out["runs"])
    out["apply_s_median"] = statistics.median(r["apply_s"] for r in out["runs"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=10_000, help="records, one a page")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    result = {"machine_cpus": os.cpu_count(), **run(args.pages, args.runs)}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "keyword_publish.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"publish of a version of {result['records_changed']} data pages "
          f"({result['pages_changed']} with its tree paths and descriptor): median "
          f"{result['publish_s_median']:.2f} s over {args.runs} runs (apply "
          f"{result['apply_s_median']:.2f} s); bench/results/keyword_publish.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
