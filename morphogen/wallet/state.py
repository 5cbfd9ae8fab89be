"""Ethereum state read privately: accounts, storage words and code, each read proven against the
owner's signed root and held to one block.

The three tables (morphogen/chain/state.py) are read through one page client with one
`KeywordClient` each. A read that needs two tables (code: the account, then its chunks) takes
both from one version, or reads again: a publication between the two would otherwise pair an
account of one block with code of another. Every read answers with the block it reflects.

What the parties see does not depend on the address, the slot or the contract:
- a balance or a nonce is one accounts lookup; a storage word one storage lookup;
- code is one accounts lookup, then always CODE_READ_CHUNKS code lookups in one request, the
  chunks of the account's code hash (an account without code asks for chunks of the empty
  code's hash, which no table holds). Only code longer than CODE_READ_CHUNKS chunks (past
  EIP-170's 24,576 bytes, which the protocol refuses to deploy) costs a further request.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from morphogen.chain.state import (
    ADDRESS_SIZE,
    CODE_KEY_SIZE,
    EMPTY_CODE_HASH,
    STORAGE_KEY_SIZE,
    Account,
    address_bytes,
    code_chunks,
    code_key,
    code_length,
    decode_account,
    decode_storage_value,
    join_code,
    storage_key,
)
from morphogen.chain.tables import TABLES
from morphogen.keyword import KeywordClient, KeywordIntegrityError, TableChangingError
from morphogen.keyword.descriptor import Descriptor

# EIP-170's code size cap over the code table's 1,020-byte chunks.
MAX_DEPLOYED_CODE = 24_576
CODE_READ_CHUNKS = code_chunks(MAX_DEPLOYED_CODE)
# Reads of several tables that find a new version between them: read again this many times.
TRIES = 4


@dataclass(frozen=True)
class Served:
    """The block a read reflects, as the owner signed it, and the owner's version."""

    chain_id: int
    number: int
    hash: str  # 0x-hex, as the node names it
    version: int
    time: int  # when the owner made the version, Unix seconds


def served_of(desc: Descriptor) -> Served:
    if desc.anchor is None:
        raise KeywordIntegrityError(
            f"keyword table {desc.name!r} names no block: it is not a chain's table "
            "(build it with morphogen chain build)")
    a = desc.anchor
    return Served(a.chain_id, a.number, a.hash, desc.version, desc.time)


class PrivateState:
    """Private, verified state reads at the block the parties serve. Thread-safe (one read at
    a time: the clients keep the version they read last)."""

    def __init__(self, pir: Any, public_key: Any, *, max_age: float | None = None,
                 min_block: int = 0) -> None:
        self.clients = {t: KeywordClient(pir, public_key, table=t, max_age=max_age,
                                         min_block=min_block) for t in TABLES}
        self._lock = threading.Lock()

    def head(self) -> Served:
        """The block the parties serve now (the accounts table's signed descriptor, read
        again)."""
        with self._lock:
            return served_of(self.clients["accounts"].descriptor(refresh=True))

    def accounts(self, addresses: Sequence[bytes | str]) -> tuple[list[Account | None], Served]:
        keys = [address_bytes(a) for a in addresses]
        with self._lock:
            values, desc = self.clients["accounts"].read_at(keys)
        return [None if v is None else decode_account(v) for v in values], served_of(desc)

    def storage(self, pairs: Sequence[tuple[bytes | str, int | bytes | str]]
                ) -> tuple[list[int], Served]:
        keys = [storage_key(a, s) for a, s in pairs]
        with self._lock:
            values, desc = self.clients["storage"].read_at(keys)
        return [decode_storage_value(v) for v in values], served_of(desc)

    def code(self, address: bytes | str) -> tuple[bytes, Served]:
        """The account's code (empty for none), checked against its code hash."""
        key = address_bytes(address)
        with self._lock:
            for _ in range(TRIES):
                (value,), desc = self.clients["accounts"].read_at([key])
                code_hash = EMPTY_CODE_HASH if value is None else decode_account(value).code_hash
                chunks, code_desc = self._chunks(code_hash)
                if _same_version(desc, code_desc):
                    return self._joined(code_hash, chunks), served_of(desc)
        raise TableChangingError(f"a new version was published between the account and its "
                                 f"code at each of {TRIES} tries")

    def code_by_hash(self, code_hash: bytes) -> tuple[bytes, Served]:
        """The code under a hash an account read named (one code request)."""
        with self._lock:
            chunks, desc = self._chunks(code_hash)
        return self._joined(code_hash, chunks), served_of(desc)

    def dummy(self, table: str) -> None:
        """One request of `table` as a real read of it is shaped, for random keys (padding):
        verified like any other, its values dropped."""
        sizes = {"accounts": (1, ADDRESS_SIZE), "storage": (1, STORAGE_KEY_SIZE),
                 "code": (CODE_READ_CHUNKS, CODE_KEY_SIZE)}
        count, size = sizes[table]
        with self._lock:
            self.clients[table].read_at([secrets.token_bytes(size) for _ in range(count)])

    def _chunks(self, code_hash: bytes) -> tuple[list[bytes | None], Descriptor]:
        code = self.clients["code"]
        values, desc = code.read_at([code_key(code_hash, i) for i in range(CODE_READ_CHUNKS)])
        if code_hash == EMPTY_CODE_HASH or values[0] is None:
            return values, desc
        need = code_chunks(code_length(values[0]))
        if need > CODE_READ_CHUNKS:  # past EIP-170: the rest in one more request
            more, more_desc = code.read_at([code_key(code_hash, i)
                                            for i in range(CODE_READ_CHUNKS, need)])
            if not _same_version(desc, more_desc):
                return values, more_desc  # the caller reads again
            values += more
        return values, desc

    @staticmethod
    def _joined(code_hash: bytes, values: list[bytes | None]) -> bytes:
        if code_hash == EMPTY_CODE_HASH:
            return b""
        if values[0] is None:
            raise KeywordIntegrityError("the account names code that the code table lacks")
        need = code_chunks(code_length(values[0]))
        chunks = values[:need]
        if any(c is None for c in chunks) or any(v is not None for v in values[need:]):
            raise KeywordIntegrityError("the code table's chunks of a code hash do not match "
                                        "the length they state")
        try:
            return join_code(code_hash, [c for c in chunks if c is not None])
        except ValueError as exc:
            raise KeywordIntegrityError(f"code read from the table: {exc}") from None


def _same_version(a: Descriptor, b: Descriptor) -> bool:
    return (a.version, a.anchor) == (b.version, b.anchor)
