"""Synthetic Ethereum-like accounts: 20-byte addresses and a fixed 32-byte account value.

The value packs balance (u128, wei), nonce (u64) and code id (u64, 0 for an externally owned
account), little-endian. Used by the demo and the benchmark; deterministic in the seed.
"""

from __future__ import annotations

import random
import struct
from typing import NamedTuple

ACCOUNT_VALUE_SIZE = 32


class Account(NamedTuple):
    balance: int
    nonce: int
    code_id: int

    def encode(self) -> bytes:
        return (self.balance.to_bytes(16, "little") + struct.pack("<QQ", self.nonce,
                                                                   self.code_id))

    @classmethod
    def decode(cls, value: bytes) -> Account:
        if len(value) != ACCOUNT_VALUE_SIZE:
            raise ValueError(f"an account value is {ACCOUNT_VALUE_SIZE} bytes")
        nonce, code_id = struct.unpack("<QQ", value[16:])
        return cls(int.from_bytes(value[:16], "little"), nonce, code_id)


def synthetic_accounts(count: int, seed: int = 0) -> list[tuple[bytes, bytes]]:
    """`count` distinct (address, value) pairs."""
    rng = random.Random(seed)
    seen: set[bytes] = set()
    out = []
    while len(out) < count:
        address = rng.randbytes(20)
        if address in seen:
            continue
        seen.add(address)
        contract = rng.random() < 0.1
        account = Account(rng.randrange(10**24), rng.randrange(5000),
                          rng.randrange(1, 1 << 40) if contract else 0)
        out.append((address, account.encode()))
    return out
