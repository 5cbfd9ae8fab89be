"""A small state dump in geth's shapes, for the import's tests."""

from __future__ import annotations

import json
import random
from pathlib import Path

from morphogen.chain.export import AccountState


def geth_dump(path: Path, accounts: int, seed: int = 1) -> list[AccountState]:
    """A dump in geth's shapes (checksum-cased addresses, decimal balances, storage words in
    bare hex with leading zeros trimmed, zero words, codes shared by several accounts), its
    accounts in no address order (geth's is by hashed address); returns the state."""
    r = random.Random(seed)
    pool = [r.randbytes(n) for n in (1, 1020, 1021, 2500)]
    state, lines = [], [json.dumps({"root": "0x" + "11" * 32})]
    for i in range(accounts):
        address = r.randbytes(20)
        code = pool[i % 4] if i % 3 == 0 else b""
        storage = {r.choice([r.randrange(40), r.randrange(2**256)]): r.choice(
            [0, r.randrange(256), r.randrange(2**256)]) for _ in range(r.randrange(6))} \
            if code else {}
        acct = AccountState(address, r.randrange(2**64) if i == 7 else r.randrange(9),
                            2**256 - 1 if i == 3 else r.randrange(10**24), code,
                            {s: w for s, w in storage.items() if w})
        state.append(acct)
        obj = {"balance": str(acct.balance), "nonce": acct.nonce, "root": "0x" + "00" * 32,
               "codeHash": "0x" + "00" * 32,
               "address": "0x" + (address.hex().upper() if i % 2 else address.hex())}
        if code:
            obj["code"] = "0x" + code.hex()
            obj["storage"] = {f"0x{s:064x}": f"{w:x}" for s, w in storage.items()}
        lines.append(json.dumps(obj))
    path.write_text("\n".join(lines) + "\n")
    return state
