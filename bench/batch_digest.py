"""What a party's identity chain costs a block: the digest of one update batch, in both
versions, against the pages the block touches.

Each party names what it serves by a running hash of the update batches it applied
(`morphogen.protocol.identity`). Version 1 of a batch's digest covers its whole pages, 4 KiB
each, however few bytes of them changed; version 2 covers the changed bytes in their canonical
sparse form (`sparse.canonical`). A block-shaped batch (XOR diffs of 40 changed bytes a page,
as bench/party_publish.py's) at the page counts a 3,000-record block touches in tables of 1 M
and 16 M records (bench/chain_scale.py: 2,918 and 4,672), and twice the larger, for a table
whose tree has a level more: each digest as a router makes it (`ChangeBatch.digest` of a
batch that came as its changed bytes, never unpacked whole; version 2 checks that the runs
are canonical first). Sizes alternate, `--rounds` times; medians.

    python bench/batch_digest.py
Results: bench/results/batch_digest.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
RESULTS = ROOT / "bench" / "results"
PAGES = (2918, 4672, 9344)


def block(rng: np.random.Generator, n: int):
    """(pages, packed changed bytes) of bench/party_publish.py's block-shaped batch of `n`
    pages."""
    from party_publish import block as triples

    from morphogen.protocol.changes import ChangeBatch

    batch = ChangeBatch.from_triples(triples(rng, n))
    return batch.pages, batch.packed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=11)
    args = ap.parse_args(argv)
    from morphogen.protocol.changes import ChangeBatch

    rng = np.random.default_rng(1)
    batches = {n: block(rng, n) for n in PAGES}
    took: dict[int, dict[int, list[float]]] = {v: {n: [] for n in PAGES} for v in (1, 2)}
    for _ in range(args.rounds):
        for n, (pages, packed) in batches.items():
            for version in (1, 2):
                batch = ChangeBatch.from_packed(pages, np.zeros(n, bool), packed)
                batch = batch.with_digest(version)
                t = time.perf_counter()
                batch.digest  # noqa: B018 - a cached property: computed here, once
                took[version][n].append(time.perf_counter() - t)

    def ms(version: int, n: int) -> float:
        return statistics.median(took[version][n]) * 1e3

    out = {"rounds": args.rounds, "changed_bytes_a_page": 40, "sizes": {
        str(n): {"packed_kib": round(len(batches[n][1]) / 1024, 1),
                 "digest_v1_ms": round(ms(1, n), 2),
                 "digest_v1_us_a_page": round(ms(1, n) * 1e3 / n, 2),
                 "digest_v2_ms": round(ms(2, n), 3),
                 "v1_over_v2": round(ms(1, n) / ms(2, n), 1)}
        for n in PAGES}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "batch_digest.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
