"""Disk used by the owner's versions of a keyword table: diffs with periodic full copies.

Builds a table of `--records` synthetic accounts (200,000: about 9.8 MiB), then applies
`--versions` versions of `--changes` changes each (half new accounts, half changed balances)
and reports the owner directory's size with the default full-copy period and retention, and
what full copies of every version would take (the table's size times the versions).

    python bench/keyword_owner_storage.py
Results: bench/results/keyword_owner_storage.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dir_bytes  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from morphogen.keyword import build_table
    from morphogen.keyword.accounts import synthetic_accounts
    from morphogen.keyword.owner import FULL_EVERY, KEEP, Change, OwnerTable, create_owner_dir

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--versions", type=int, default=25)
    ap.add_argument("--changes", type=int, default=200)
    args = ap.parse_args(argv)
    key = Ed25519PrivateKey.generate()
    accounts = dict(synthetic_accounts(args.records, seed=1))
    table = build_table(accounts.items(), value_size=32, signing_key=key, load=0.9)
    root = Path(tempfile.mkdtemp(prefix="morphogen-kwstore-")) / "owner"
    create_owner_dir(table, root)
    owner = OwnerTable(root)
    table_bytes = dir_bytes(root / "v000001")
    rng = random.Random(2)
    keys = sorted(accounts)
    t = time.perf_counter()
    for _ in range(args.versions):
        half = args.changes // 2
        changes = [Change("put", rng.randbytes(20), rng.randbytes(32)) for _ in range(half)]
        changes += [Change("put", k, rng.randbytes(32)) for k in rng.sample(keys, half)]
        version, _ = owner.apply(changes, key)
        owner.mark_published(version)
    seconds = time.perf_counter() - t
    used = dir_bytes(root)
    versions = args.versions + 1
    result = {"records": args.records, "versions": versions, "changes_per_version": args.changes,
              "full_every": FULL_EVERY, "keep": KEEP,
              "version_1_mib": round(table_bytes / 2**20, 2),
              "owner_dir_mib": round(used / 2**20, 2),
              "full_copies_mib": round(table_bytes * versions / 2**20, 1),
              "apply_s_per_version": round(seconds / args.versions, 3)}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "keyword_owner_storage.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{versions} versions of a {result['version_1_mib']} MiB table: "
          f"{result['owner_dir_mib']} MiB on disk (full copies: {result['full_copies_mib']} MiB);"
          f" {result['apply_s_per_version']} s an apply")
    return 0


if __name__ == "__main__":
    sys.exit(main())
