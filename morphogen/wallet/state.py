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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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
    """Private, verified state reads at the block the parties serve. Thread-safe: a read
    borrows a set of clients no other read is using (a client keeps the version it read last,
    so a set is reused across requests and connections rather than made for each), all bound
    below by the newest version and block any of them has accepted, so no answer goes back in
    time once another has shown a later block."""

    def __init__(self, pir: Any, public_key: Any, *, max_age: float | None = None,
                 min_block: int = 0) -> None:
        self.pir, self.public_key, self.max_age = pir, public_key, max_age
        self.seen_version, self.seen_block = 0, min_block
        self._free: list[dict[str, KeywordClient]] = []
        self._lock = threading.Lock()
        self._calls: tuple[tuple[int, str], CallCache] | None = None
        with self.clients():  # a bad key fails here, not at the first request
            pass

    @contextmanager
    def clients(self) -> Iterator[dict[str, KeywordClient]]:
        """A set of clients, one a table, for one read."""
        with self._lock:
            mine = self._free.pop() if self._free else None
        if mine is None:
            mine = {t: KeywordClient(self.pir, self.public_key, table=t, max_age=self.max_age,
                                     trusted_version=lambda: self.seen_version,
                                     trusted_block=lambda: self.seen_block) for t in TABLES}
        try:
            yield mine
        finally:
            with self._lock:
                self._free.append(mine)

    def _accepted(self, desc: Descriptor) -> Served:
        served = served_of(desc)
        with self._lock:
            self.seen_version = max(self.seen_version, served.version)
            self.seen_block = max(self.seen_block, served.number)
        return served

    def head(self) -> Served:
        """The block the parties serve now (the accounts table's signed descriptor, read
        again)."""
        with self.clients() as c:
            return self._accepted(c["accounts"].descriptor(refresh=True))

    def accounts(self, addresses: Sequence[bytes | str]) -> tuple[list[Account | None], Served]:
        keys = [address_bytes(a) for a in addresses]
        with self.clients() as c:
            values, desc = c["accounts"].read_at(keys)
        return [None if v is None else decode_account(v) for v in values], self._accepted(desc)

    def storage(self, pairs: Sequence[tuple[bytes | str, int | bytes | str]]
                ) -> tuple[list[int], Served]:
        keys = [storage_key(a, s) for a, s in pairs]
        with self.clients() as c:
            values, desc = c["storage"].read_at(keys)
        return [decode_storage_value(v) for v in values], self._accepted(desc)

    def call_cache(self, served: Served) -> CallCache:
        """What calls at `served`'s version have read, shared by the calls at that version (a
        wallet's calls to twenty tokens read the caller and the common code once)."""
        key = (served.version, served.hash)
        with self._lock:
            if self._calls is None or self._calls[0] != key:
                self._calls = (key, CallCache())
            return self._calls[1]

    def code(self, address: bytes | str) -> tuple[bytes, Served]:
        """The account's code (empty for none), checked against its code hash."""
        key = address_bytes(address)
        with self.clients() as c:
            for _ in range(TRIES):
                (value,), desc = c["accounts"].read_at([key])
                code_hash = (EMPTY_CODE_HASH if value is None
                             else decode_account(value).code_hash)
                chunks, code_desc = self._chunks(c["code"], code_hash)
                if _same_version(desc, code_desc):
                    return self._joined(code_hash, chunks), self._accepted(desc)
        raise TableChangingError(f"a new version was published between the account and its "
                                 f"code at each of {TRIES} tries")

    def code_by_hash(self, code_hash: bytes) -> tuple[bytes, Served]:
        """The code under a hash an account read named (one code request)."""
        with self.clients() as c:
            chunks, desc = self._chunks(c["code"], code_hash)
        return self._joined(code_hash, chunks), self._accepted(desc)

    def dummy(self, table: str) -> None:
        """One request of `table` as a real read of it is shaped, for random keys (padding):
        verified like any other, its values dropped."""
        sizes = {"accounts": (1, ADDRESS_SIZE), "storage": (1, STORAGE_KEY_SIZE),
                 "code": (CODE_READ_CHUNKS, CODE_KEY_SIZE)}
        count, size = sizes[table]
        with self.clients() as c:
            c[table].read_at([secrets.token_bytes(size) for _ in range(count)])

    @staticmethod
    def _chunks(code: KeywordClient, code_hash: bytes) -> tuple[list[bytes | None], Descriptor]:
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


class CallCache:
    """Accounts, code and words read at one version, for the calls at that version."""

    def __init__(self) -> None:
        self.accounts: dict[bytes, Account | None] = {}
        self.code: dict[bytes, bytes] = {}
        self.words: dict[tuple[bytes, bytes], int] = {}


def _same_version(a: Descriptor, b: Descriptor) -> bool:
    return (a.version, a.anchor) == (b.version, b.anchor)
