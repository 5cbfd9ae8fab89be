"""Writes dpf_keys.json, the known answers of the reference's (v1) key format (PROTOCOL.md
sections 2-4), from fixed seeds with the project's key generation:

    PYTHONPATH=. python tests/vectors/dpf_keys.py

`prg`: G(seed) for a few seeds (the two of PROTOCOL.md section 2 first). `keys`: per case the
domain bits, target, both root seeds, both keys' bytes and both parties' masks at a few pages
(0, the target, its neighbours, the last page of the domain). tests/unit/test_dpf_vectors.py
checks every field with the spec client (tests/integration/spec_client.py) and the project's
code; the TypeScript client (clients/js) reads the same file, so both clients make the same
keys from the same seeds.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from morphogen.protocol import prg
from morphogen.protocol.dpf import generate_keys

HERE = Path(__file__).resolve().parent
# (domain bits, target): the smallest domain, PROTOCOL.md's worked example, the test parties'
# domain (d = 10, 640 pages), the reference's d = 25, the largest domain at both ends
CASES = [(1, 0), (1, 1), (4, 5), (7, 0), (7, 127), (10, 639), (13, 4242), (25, 12_345_678),
         (32, 0), (32, (1 << 32) - 1)]
PRG_SEEDS = [bytes(16), bytes(range(16)), bytes(range(16, 32)), b"\xff" * 16]


def seeds(d: int, x: int) -> tuple[bytes, bytes]:
    """Fixed, distinct root seeds per case (a hash of the case, not a secret); the worked
    example keeps PROTOCOL.md's seeds."""
    if (d, x) == (4, 5):
        return bytes(range(16)), bytes(range(16, 32))
    h = hashlib.sha256(f"morphogen dpf vector {d} {x}".encode()).digest()
    return h[:16], h[16:]


def pages(d: int, x: int) -> list[int]:
    last = (1 << d) - 1
    return sorted({0, x, max(0, x - 1), min(last, x + 1), last, last // 3})


def case(d: int, x: int) -> dict:
    s0, s1 = seeds(d, x)
    k0, k1 = generate_keys(d, x, seeds=(s0, s1))
    return {
        "domain_bits": d,
        "target": x,
        "seeds": [s0.hex(), s1.hex()],
        "keys": [k0.to_bytes().hex(), k1.to_bytes().hex()],
        "evals": [{"page": p, "masks": [k0.eval(p).hex(), k1.eval(p).hex()]}
                  for p in pages(d, x)],
    }


def prg_case(seed: bytes) -> dict:
    left, right, tl, tr = prg.expand(seed)
    return {"seed": seed.hex(), "left": left.hex(), "right": right.hex(), "t_left": tl,
            "t_right": tr}


def main() -> None:
    out = HERE / "dpf_keys.json"
    doc = {"prg": [prg_case(s) for s in PRG_SEEDS], "keys": [case(d, x) for d, x in CASES]}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
