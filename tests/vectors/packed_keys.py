"""Writes packed_keys.json, the known answers of the packed key format (docs/packed-keys.md),
from fixed seeds with the project's key generation:

    PYTHONPATH=. python tests/vectors/packed_keys.py

Each case: domain bits, target, the two root seeds, both keys' bytes, and both parties' leaves
(hex, in leaf order). tests/unit/test_packed_vectors.py checks every field with the spec
client's evaluator (tests/integration/spec_client.py), which imports nothing of the project.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from morphogen.constants import PACKED_LEAF_BITS
from morphogen.protocol.packed import generate_packed_keys

HERE = Path(__file__).resolve().parent
# (domain bits, target): no tree (d <= 7), one level, several, the first and last pages
CASES = [(1, 1), (4, 5), (7, 0), (7, 127), (8, 200), (9, 300), (10, 5), (11, 2047), (12, 1234)]


def seeds(d: int, x: int) -> tuple[bytes, bytes]:
    """Fixed, distinct root seeds per case (a hash of the case, not a secret)."""
    h = hashlib.sha256(f"morphogen packed vector {d} {x}".encode()).digest()
    return h[:16], h[16:]


def case(d: int, x: int) -> dict:
    s0, s1 = seeds(d, x)
    k0, k1 = generate_packed_keys(d, x, seeds=(s0, s1))
    n = 1 << max(0, d - PACKED_LEAF_BITS)
    return {
        "domain_bits": d,
        "target": x,
        "seeds": [s0.hex(), s1.hex()],
        "keys": [k0.to_bytes().hex(), k1.to_bytes().hex()],
        "leaves": [[k.leaf(j).hex() for j in range(n)] for k in (k0, k1)],
    }


def main() -> None:
    out = HERE / "packed_keys.json"
    out.write_text(json.dumps([case(d, x) for d, x in CASES], indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
