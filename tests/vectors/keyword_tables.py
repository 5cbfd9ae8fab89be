"""Writes keyword_tables.json, the known answers of keyword tables (docs/keyword.md): small
tables built with a fixed owner key, fixed random choices and a fixed time, and the lookups
they answer:

    PYTHONPATH=. python tests/vectors/keyword_tables.py

Per table: the owner's public key, the matrix's page count and its pages that are not all
zero (index -> hex without the page's trailing zero bytes: most buckets of a sparse table are
empty or hold one record), the descriptor's fields, and
lookups (key, the three candidate buckets, the tag, the value or null). The tables cover both
layouts, a tree level read privately (`deep`: 3 pages above 300 data pages, read a page per
candidate when `whole_level_pages` is 1), an anchored version and a named table.
tests/unit/test_keyword_vectors.py checks every field with the project's code; the
TypeScript client (clients/js) looks the same keys up in the same pages.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from morphogen.keyword.build import Draws, KeywordTable, build_table
from morphogen.keyword.descriptor import Anchor
from morphogen.keyword.hashing import candidates
from morphogen.keyword.pages import tag_of
from morphogen.keyword.signing import public_bytes
from tests.unit._kw import lookup

HERE = Path(__file__).resolve().parent
OWNER = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"morphogen keyword vector owner")
                                             .digest())
CREATED = 1_800_000_000
# name: (records, value size, layout, row size, buckets, anchor, table name)
CASES = {
    "small": (200, 32, "page", 0, None, None, ""),
    "deep": (40, 8, "page", 0, 300, None, ""),
    "row": (50, 32, "row", 64, None, Anchor(1, 21_000_000, "0x" + "ab" * 32), "accounts"),
}
ABSENT = 6


def records(n: int, value_size: int, seed: str) -> dict[bytes, bytes]:
    rng = random.Random(seed)
    return {rng.randbytes(rng.choice([8, 20, 32])): rng.randbytes(value_size) for _ in range(n)}


def built(name: str) -> tuple[KeywordTable, dict[bytes, bytes]]:
    """Table `name` as the owner built it (tests/integration/test_js_client.py serves one),
    and its records."""
    n, value_size, layout, row_size, buckets, anchor, table_name = CASES[name]
    recs = records(n, value_size, f"morphogen keyword vector {name}")
    t = build_table(recs.items(), value_size=value_size, signing_key=OWNER, layout=layout,
                    row_size=row_size, num_buckets=buckets, anchor=anchor, name=table_name,
                    draws=Draws(f"morphogen keyword vector draws {name}"), created=CREATED)
    return t, recs


def table(name: str) -> dict:
    t, recs = built(name)
    desc = t.descriptor
    rng = random.Random(f"morphogen keyword vector absent {name}")
    keys = list(recs)[:12] + [rng.randbytes(20) for _ in range(ABSENT)]
    values = lookup(t.pages, desc, keys)
    assert values == [recs.get(k) for k in keys]
    nonzero = {i: t.pages[i].tobytes().rstrip(b"\0").hex()
               for i in np.flatnonzero(t.pages.any(axis=1))}
    return {
        "public_key": public_bytes(OWNER.public_key()).hex(),
        "num_pages": len(t.pages),
        "pages": {str(i): h for i, h in nonzero.items()},
        "descriptor": desc.to_dict(),
        "lookups": [{"key": k.hex(),
                     "candidates": list(candidates(k, desc.seeds, desc.geometry.num_buckets)),
                     "tag": tag_of(desc.dataset, k).hex(),
                     "value": None if v is None else v.hex()} for k, v in zip(keys, values,
                                                                             strict=True)],
    }


def main() -> None:
    out = HERE / "keyword_tables.json"
    out.write_text(json.dumps({name: table(name) for name in CASES}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
