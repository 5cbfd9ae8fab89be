"""A client written from PROTOCOL.md alone: ChaCha8 PRG, DPF key generation, key bytes, JSON;
and packed keys (`packed_keygen`, `packed_leaf`, `packed_bit`) from docs/packed-keys.md alone.

Deliberately imports nothing from the project, so that a server passing with it is wire-
compatible by the spec, not merely consistent with the project's own client, and the packed
known-answer vectors are checked by an evaluator written apart from the engines.
"""

from __future__ import annotations

import json
import os
import struct
import urllib.request

M = 0xFFFFFFFF


def _qr(s: list[int], a: int, b: int, c: int, d: int) -> None:
    def rotl(x: int, n: int) -> int:
        return ((x << n) | (x >> (32 - n))) & M

    s[a] = (s[a] + s[b]) & M
    s[d] = rotl(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & M
    s[b] = rotl(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b]) & M
    s[d] = rotl(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & M
    s[b] = rotl(s[b] ^ s[c], 7)


def _block(w: tuple[int, ...], ctr: int) -> list[int]:
    init = [0x61707865, 0x3320646E, 0x79622D32, 0x6B206574, *w, *w, ctr, 0, 0, 0]
    s = list(init)
    for _ in range(4):
        for q in ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15),
                  (0, 5, 10, 15), (1, 6, 11, 12), (2, 7, 8, 13), (3, 4, 9, 14)):
            _qr(s, *q)
    return [(x + y) & M for x, y in zip(s, init, strict=True)]


def prg(seed: bytes) -> tuple[bytes, bytes, int, int]:
    w = struct.unpack("<4I", seed)
    b0, b1 = _block(w, 0), _block(w, 1)
    return struct.pack("<4I", *b0[:4]), struct.pack("<4I", *b0[4:8]), b1[0] & 1, b1[1] & 1


def _x(a: bytes, b: bytes) -> bytes:
    return bytes(i ^ j for i, j in zip(a, b, strict=True))


def keygen(d: int, x: int) -> tuple[bytes, bytes]:
    roots = [os.urandom(16), os.urandom(16)]
    s, t = list(roots), [0, 1]
    levels = b""
    for i in range(d):
        a = (x >> (d - 1 - i)) & 1
        e = [prg(s[0]), prg(s[1])]
        keep, lose = (1, 0) if a else (0, 1)
        cw = _x(e[0][lose], e[1][lose])
        tk = e[0][2 + keep] ^ e[1][2 + keep] ^ t[0] ^ t[1]
        tl = e[0][2 + lose] ^ e[1][2 + lose] ^ t[0] ^ t[1] ^ 1
        left, right = (tk, tl) if a == 0 else (tl, tk)
        levels += cw + bytes((left, right))
        for b in (0, 1):
            kept = e[b][keep]
            s[b] = _x(kept, cw) if t[b] else kept
            t[b] = e[b][2 + keep] ^ (tk if t[b] else 0)
    final = _x(_x(s[0], s[1]), b"\xff" * 16)
    return (roots[0] + bytes((0, 0, d)) + levels + final,
            roots[1] + bytes((1, 1, d)) + levels + final)


def _tree(d: int, x: int, roots: list[bytes]) -> tuple[bytes, list[bytes]]:
    """PROTOCOL.md section 3's levels for target x: (level bytes, final seeds [s0, s1]),
    with s1 already corrected by its control bit's final step left to the caller."""
    s, t = list(roots), [0, 1]
    levels = b""
    for i in range(d):
        a = (x >> (d - 1 - i)) & 1
        e = [prg(s[0]), prg(s[1])]
        keep, lose = (1, 0) if a else (0, 1)
        cw = _x(e[0][lose], e[1][lose])
        tk = e[0][2 + keep] ^ e[1][2 + keep] ^ t[0] ^ t[1]
        tl = e[0][2 + lose] ^ e[1][2 + lose] ^ t[0] ^ t[1] ^ 1
        left, right = (tk, tl) if a == 0 else (tl, tk)
        levels += cw + bytes((left, right))
        for b in (0, 1):
            kept = e[b][keep]
            s[b] = _x(kept, cw) if t[b] else kept
            t[b] = e[b][2 + keep] ^ (tk if t[b] else 0)
    return levels, s


def packed_keygen(d: int, x: int, roots: tuple[bytes, bytes] | None = None
                  ) -> tuple[bytes, bytes]:
    """docs/packed-keys.md section 2 and 4: the two packed keys for page x of 2^d."""
    r = list(roots) if roots else [os.urandom(16), os.urandom(16)]
    n = max(0, d - 7)
    levels, s = _tree(n, x >> 7, r)
    final = _x(_x(s[0], s[1]), (1 << (x & 127)).to_bytes(16, "little"))
    return (r[0] + bytes((0, 0, d, 2)) + levels + final,
            r[1] + bytes((1, 1, d, 2)) + levels + final)


def packed_leaf(key: bytes, j: int) -> bytes:
    """docs/packed-keys.md section 3: leaf j of a packed key (bytes as on the wire)."""
    d = key[18]
    n = max(0, d - 7)
    assert key[19] == 2 and len(key) == 36 + 18 * n
    s, t = key[:16], key[16]
    for i in range(n):
        lv = key[20 + 18 * i : 38 + 18 * i]
        left, right, tl, tr = prg(s)
        a = (j >> (n - 1 - i)) & 1
        s2, t2 = (right, tr) if a else (left, tl)
        if t:
            s2, t2 = _x(s2, lv[:16]), t2 ^ lv[17 if a else 16]
        s, t = s2, t2
    return _x(s, key[20 + 18 * n :]) if t else s


def packed_bit(key: bytes, p: int) -> int:
    """The selection bit of page p."""
    return (int.from_bytes(packed_leaf(key, p >> 7), "little") >> (p & 127)) & 1


def _post(url: str, obj: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(obj).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def fetch(server_a: str, server_b: str, targets: list[int]) -> list[bytes]:
    """Pages `targets` (a multiple of three) via the batch endpoint of both servers."""
    d = get_json(server_a + "/epoch")["page_pir"]["domain_bits"]
    pairs = [keygen(d, x) for x in targets]
    qa = [{"keys": ["0x" + p[0].hex() for p in pairs[i : i + 3]]} for i in range(0, len(pairs), 3)]
    qb = [{"keys": ["0x" + p[1].hex() for p in pairs[i : i + 3]]} for i in range(0, len(pairs), 3)]
    ra = _post(server_a + "/query/page/gpu/batch", {"queries": qa})
    rb = _post(server_b + "/query/page/gpu/batch", {"queries": qb})
    assert ra["epoch_id"] == rb["epoch_id"]
    pa = [bytes.fromhex(p[2:]) for r in ra["results"] for p in r["pages"]]
    pb = [bytes.fromhex(p[2:]) for r in rb["results"] for p in r["pages"]]
    return [_x(a, b) for a, b in zip(pa, pb, strict=True)]
