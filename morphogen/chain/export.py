"""The state export file: a chain's whole state at one block, as JSON lines.

Line 1, the header::

    {"format": "morphogen-state/1", "chain_id": 31337,
     "block": {"number": 5, "hash": "0x..", "parent_hash": "0x..", "state_root": "0x.."}}

then one line per account, in ascending order of address, each address once::

    {"address": "0x<40 hex>", "nonce": 3, "balance": "0x<hex quantity>", "code": "0x<hex>",
     "storage": {"0x<64 hex slot>": "0x<64 hex word>", ...}}

Numbers that can pass 2**53 (balance, slots, words) are 0x-hex strings; the nonce and the
block number are JSON integers. A storage slot whose word is zero is left out (the reader
drops one it meets): the chain has no such slot either. Written lower-case, read in any case.

`state_records` turns a file into the three record streams of `morphogen.chain.state`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from morphogen.chain.rpc import ChainError
from morphogen.chain.state import (
    Account,
    account_record,
    code_records,
    keccak256,
    storage_records,
)
from morphogen.storage.durable import write_atomic

FORMAT = "morphogen-state/1"
_HASH = re.compile(r"0x[0-9a-fA-F]{64}")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_HEX_BYTES = re.compile(r"0x(?:[0-9a-fA-F]{2})*")
_QUANTITY = re.compile(r"0x[0-9a-fA-F]{1,64}")


class ExportError(ChainError):
    """A state export file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class BlockRef:
    number: int
    hash: str  # 0x + 64 hex, as are the two below
    parent_hash: str
    state_root: str

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "hash": self.hash, "parent_hash": self.parent_hash,
                "state_root": self.state_root}


@dataclass(frozen=True)
class ExportHeader:
    chain_id: int
    block: BlockRef


@dataclass
class AccountState:
    """One account as the export holds it: `storage` maps slot to word, both ints, and never
    holds a zero word."""

    address: bytes
    nonce: int
    balance: int
    code: bytes = b""
    storage: dict[int, int] = field(default_factory=dict)

    def account(self) -> Account:
        return Account(self.nonce, self.balance, keccak256(self.code))


# -- writing -----------------------------------------------------------------------------------

def header_line(header: ExportHeader) -> str:
    return json.dumps({"format": FORMAT, "chain_id": header.chain_id,
                       "block": header.block.to_dict()})


def account_line(account: AccountState) -> str:
    storage = {f"0x{slot:064x}": f"0x{word:064x}"
               for slot, word in sorted(account.storage.items()) if word}
    return json.dumps({"address": "0x" + account.address.hex(), "nonce": account.nonce,
                       "balance": hex(account.balance), "code": "0x" + account.code.hex(),
                       "storage": storage}, separators=(",", ":"))


def write_export(path: str | os.PathLike[str], header: ExportHeader,
                 accounts: Iterable[AccountState]) -> int:
    """Write the file whole or not at all (a temporary beside it, renamed over it); returns
    the number of accounts. `accounts` must come in ascending order of address, so that a
    state far larger than memory streams through: ValueError otherwise, and no file."""
    count = 0

    def lines() -> Iterator[bytes]:
        nonlocal count
        yield (header_line(header) + "\n").encode()
        last = b""
        for account in accounts:
            if len(account.address) != 20:
                raise ValueError(f"an address is 20 bytes, got {len(account.address)}")
            if count and account.address <= last:
                raise ValueError(f"accounts out of order: 0x{account.address.hex()} after "
                                 f"0x{last.hex()} (the export is sorted by address)")
            last = account.address
            count += 1
            yield (account_line(account) + "\n").encode()

    write_atomic(path, lines())
    return count


# -- reading -----------------------------------------------------------------------------------

def _check(ok: bool, where: str, message: str) -> None:
    if not ok:
        raise ExportError(f"{where}: {message}")


def _shown(value: object) -> str:
    return repr(value)[:48]


def _parse_header(obj: Any, where: str) -> ExportHeader:
    _check(isinstance(obj, dict) and obj.get("format") == FORMAT, where,
           f'not a state export: the first line must have "format": "{FORMAT}"')
    chain_id, block = obj.get("chain_id"), obj.get("block")
    _check(isinstance(chain_id, int) and chain_id >= 1, where,
           f"chain_id {_shown(chain_id)} is not a positive integer")
    _check(isinstance(block, dict), where, '"block" is not an object')
    number = block.get("number")
    _check(isinstance(number, int) and number >= 0, where,
           f"block number {_shown(number)} is not a non-negative integer")
    hashes = {}
    for name in ("hash", "parent_hash", "state_root"):
        value = block.get(name)
        _check(isinstance(value, str) and bool(_HASH.fullmatch(value)), where,
               f"block {name} {_shown(value)} is not 0x and 64 hex digits")
        hashes[name] = value.lower()
    return ExportHeader(chain_id, BlockRef(number, **hashes))


def _parse_account(obj: Any, where: str) -> AccountState:
    _check(isinstance(obj, dict), where, "an account line is a JSON object")
    address, nonce = obj.get("address"), obj.get("nonce")
    balance, code, storage = obj.get("balance"), obj.get("code", "0x"), obj.get("storage", {})
    _check(isinstance(address, str) and bool(_ADDRESS.fullmatch(address)), where,
           f"address {_shown(address)} is not 0x and 40 hex digits")
    _check(isinstance(nonce, int) and not isinstance(nonce, bool) and 0 <= nonce < 2**64,
           where, f"nonce {_shown(nonce)} is not an integer in [0, 2**64)")
    _check(isinstance(balance, str) and bool(_QUANTITY.fullmatch(balance)), where,
           f"balance {_shown(balance)} is not a 0x-hex quantity below 2**256")
    _check(isinstance(code, str) and bool(_HEX_BYTES.fullmatch(code)), where,
           f"code {_shown(code)} is not 0x-hex bytes")
    _check(isinstance(storage, dict), where, '"storage" is not an object')
    words = {}
    for slot, word in storage.items():
        _check(bool(_QUANTITY.fullmatch(slot)), where,
               f"storage slot {_shown(slot)} is not 0x-hex of at most 32 bytes")
        _check(isinstance(word, str) and bool(_QUANTITY.fullmatch(word)), where,
               f"storage word {_shown(word)} of slot {slot[:20]} is not 0x-hex of at most "
               "32 bytes")
        key = int(slot, 16)
        _check(key not in words, where, f"storage slot {slot[:20]}... twice")
        if int(word, 16):
            words[key] = int(word, 16)
    return AccountState(bytes.fromhex(address[2:]), nonce, int(balance, 16),
                        bytes.fromhex(code[2:]), words)


def _lines(path: Path) -> Iterator[tuple[str, Any]]:
    if not path.is_file():
        raise ExportError(f"{path}: no such file")
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            where = f"{path.name}:{n}"
            if not line.strip():
                _check(n > 1, where, "empty; a state export starts with its header")
                continue
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                raise ExportError(f"{where}: not JSON ({exc.msg})") from None


def read_header(path: str | os.PathLike[str]) -> ExportHeader:
    """The chain and block a state export is of."""
    for where, obj in _lines(Path(path)):
        return _parse_header(obj, where)
    raise ExportError(f"{Path(path).name}:1: empty file; a state export starts with its header")


def read_accounts(path: str | os.PathLike[str]) -> Iterator[AccountState]:
    """The accounts of a state export, read one line at a time, the header and the order
    checked on the way."""
    path = Path(path)
    lines = _lines(path)
    first = next(lines, None)
    if first is None:
        raise ExportError(f"{path.name}:1: empty file; a state export starts with its header")
    _parse_header(first[1], first[0])
    last = b""
    for where, obj in lines:
        account = _parse_account(obj, where)
        _check(account.address > last, where,
               f"address 0x{account.address.hex()} is not after 0x{last.hex()} (the accounts "
               "are sorted by address, each once)")
        last = account.address
        yield account


# -- as keyword records ------------------------------------------------------------------------

class _Stream:
    # re-reads the file on every iteration, so that each table's build streams it afresh
    def __init__(self, path: Path, kind: str) -> None:
        self.path, self.kind = path, kind

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        seen_code: set[bytes] = set()
        for account in read_accounts(self.path):
            if self.kind == "accounts":
                yield account_record(account.address, account.account())
            elif self.kind == "storage":
                yield from storage_records(account.address, account.storage)
            elif account.code:
                # contracts that share code share its records: each once
                code_hash = keccak256(account.code)
                if code_hash not in seen_code:
                    seen_code.add(code_hash)
                    yield from code_records(account.code)


class StateRecords(NamedTuple):
    """The three record streams of a state export, each a re-iterable of (key, value) pairs
    for `morphogen.keyword.build_table` (value sizes 72, 32 and 1024)."""

    accounts: Iterable[tuple[bytes, bytes]]
    storage: Iterable[tuple[bytes, bytes]]
    code: Iterable[tuple[bytes, bytes]]


def state_records(path: str | os.PathLike[str]) -> StateRecords:
    path = Path(path)
    return StateRecords(_Stream(path, "accounts"), _Stream(path, "storage"),
                        _Stream(path, "code"))
