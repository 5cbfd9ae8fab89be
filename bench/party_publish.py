"""One block's publication to two real parties (local Ray Serve, one CPU shard each), against
the pages the block touches: the party side of a follower's `publish` phase, without the node.

A block-shaped batch is XOR diffs of 40 changed bytes a page, one request to each party (the
body of changed bytes, as `chain follow` sends it), at the page counts a 3,000-record block
touches in tables of 1 M and 16 M records (bench/chain_scale.py: 2,918 and 4,672). Each size
alternates with the other, `--rounds` times; the figure is the median time for both parties.
The batch goes as the follower sends it (one `ChangeBatch` for both parties, packed once, under
the digest version both parties take: `batch`), the same under digest version 1 (what
publishers of earlier versions name: `batch-v1`), and as a list of pages (packed again for
each party, version 1), the form a caller of `AdminClient` may use.

    python bench/party_publish.py
Results: bench/results/party_publish.json
"""

from __future__ import annotations

import argparse
import json
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
PAGES = (2918, 4672)
MATRIX_PAGES = 60_000
TOKEN = "bench-" + "t" * 40
FORMS = ("batch", "batch-v1", "list")


def block(rng: np.random.Generator, n: int) -> list[tuple[int, str, bytes]]:
    out = []
    for page in np.sort(rng.choice(MATRIX_PAGES, n, replace=False)).tolist():
        diff = bytearray(4096)
        at = int(rng.integers(0, 4000))
        diff[at:at + 40] = rng.integers(1, 256, 40, dtype=np.uint8).tobytes()
        out.append((page, "diff", bytes(diff)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    from _common import serve_two_parties

    from cluster import local
    from morphogen.client.admin import AdminClient, common_digest_version
    from morphogen.protocol.changes import ChangeBatch
    from morphogen.snapshot.synthetic import build_synthetic

    work = Path(tempfile.mkdtemp(prefix="morphogen-partypub-"))
    build_synthetic(work / "base", MATRIX_PAGES, seed=3, epoch_id=1, progress=False)
    (work / "token").write_text(TOKEN)
    (work / "snaps").mkdir()
    rng = np.random.default_rng(1)
    times: dict[str, list[float]] = {}
    with local.running(num_cpus=2, disable_auth=True) as cluster:
        urls = serve_two_parties(cluster, work / "base", work)
        clients = [AdminClient(u, TOKEN) for u in urls]
        version = common_digest_version(clients)
        for _ in range(args.rounds + 1):  # the first round warms connections and kernels
            for form in FORMS:
                for n in PAGES:
                    changes = block(rng, n)
                    t = time.perf_counter()
                    sent = (changes if form == "list" else ChangeBatch.from_triples(changes)
                            .with_digest(1 if form == "batch-v1" else version))
                    for c in clients:
                        c.updates(sent, max_per_request=1024)
                    times.setdefault(f"{form}/{n}", []).append(time.perf_counter() - t)
        for c in clients:
            c.close()
    out = {"matrix_pages": MATRIX_PAGES, "rounds": args.rounds, "digest_version": version,
           "both_parties_s_median": {k: round(statistics.median(v[1:]), 3)
                                     for k, v in times.items()}}
    for form in FORMS:
        small, large = (out["both_parties_s_median"][f"{form}/{n}"] for n in PAGES)
        out[f"ratio_{form}"] = round(large / small, 2)
    for n in PAGES:
        got = out["both_parties_s_median"]
        out[f"batch_over_v1/{n}"] = round(got[f"batch/{n}"] / got[f"batch-v1/{n}"], 2)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "party_publish.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
