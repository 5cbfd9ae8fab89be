"""Ethereum state read privately: accounts, storage words and code, each read proven against the
owner's signed root and held to one block.

The three tables (morphogen/chain/state.py) are read through one page client with one
`KeywordClient` each. A read that needs two tables (code: the account, then its chunks) takes
both from one version, or reads again: a publication between the two would otherwise pair an
account of one block with code of another. Every read answers with the block it reflects.

What the parties see does not depend on the address, the slot or the contract:
- a balance or a nonce is one accounts lookup (none where the account was read at the version
  the parties still serve: `cached_account`); a storage word one storage lookup;
- code is one accounts lookup, then always CODE_READ_CHUNKS code lookups in one request, the
  chunks of the account's code hash (an account without code asks for chunks of the empty
  code's hash, which no table holds). Only code longer than CODE_READ_CHUNKS chunks (past
  EIP-170's 24,576 bytes, which the protocol refuses to deploy) costs a further request.
- a call's round (`read_round`) asks accounts and storage at once whatever it needs, each
  padded to the next of CALL_BUCKETS lookups, and code where it needs code it has not read
  before, padded to the next power of two of code hashes; the padding is random keys asked and
  verified like real ones.

Which version the reads are held to, and whether the parties still serve it, is
versions.py's (`ServedVersions`, which `PrivateState` extends).
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from morphogen.chain.state import (
    ADDRESS_SIZE,
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
from morphogen.keyword.lookup import SharedVersion
from morphogen.wallet.versions import Served, ServedVersions

# EIP-170's code size cap over the code table's 1,020-byte chunks.
MAX_DEPLOYED_CODE = 24_576
CODE_READ_CHUNKS = code_chunks(MAX_DEPLOYED_CODE)
# Reads of several tables that find a new version between them: read again this many times.
TRIES = 4
# The lookups of each of accounts and storage in a call's round: the next of these.
CALL_BUCKETS = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
# Code verified against its hash is the same at every version: kept across versions.
CODE_CACHE = 512
RECENT_ACCOUNTS = 256  # accounts asked by address (balance, nonce): part of the working set
_ROUND_POOL = ThreadPoolExecutor(6, thread_name_prefix="morphogen-round")


def bucket(n: int) -> int:
    """The padded count of `n` lookups of accounts or storage in one round."""
    for b in CALL_BUCKETS:
        if n <= b:
            return b
    return -(-n // CALL_BUCKETS[-1]) * CALL_BUCKETS[-1]


def code_bucket(n: int) -> int:
    """The padded count of `n` code hashes in one round: a power of two, at least 1."""
    return 1 << max(0, n - 1).bit_length()


class PrivateState(ServedVersions):
    """Private, verified state reads at the block the parties serve. Thread-safe: a read
    borrows a set of clients no other read is using (a client keeps the version it read last,
    so a set is reused across requests and connections rather than made for each), all bound
    below by the newest version any of them has accepted, so no answer goes back to an older
    version once another has shown a newer one. Blocks are not such a bound: after a reorg
    to a shorter branch the owner's newer version names a lower block, and that is the chain."""

    def __init__(self, pir: Any, public_key: Any, *, max_age: float | None = None,
                 min_block: int = 0, watch_s: float | None = None,
                 chain_id: int | None = None) -> None:
        """`watch_s`: every so many seconds, ask the parties (GET /epoch, no lookup) whether
        they serve a new version, and read its descriptors then, before a request needs them
        (a request's first lookup at a new version otherwise pays three round trips, not
        one). None: no watching; `close()` stops it."""
        super().__init__(pir, max_age=max_age, min_block=min_block, chain_id=chain_id)
        self.public_key = public_key
        self._free: list[dict[str, KeywordClient]] = []
        # a new version's descriptors read once for every set of clients, not once a set
        self._versions = {t: SharedVersion() for t in TABLES}
        self._calls: tuple[tuple[int, str], CallCache] | None = None
        self.codes: OrderedDict[bytes, bytes] = OrderedDict()  # code hash -> code, verified
        self._recent: OrderedDict[bytes, None] = OrderedDict()  # accounts asked, newest last
        self.last_asked = float("-inf")  # monotonic time of the last request for state
        with self.clients():  # a bad key fails here, not at the first request
            pass
        self._start_watching(watch_s)

    def refresh(self) -> None:
        """Every table's descriptor read again, in parallel, for all the sets of clients."""
        with self.clients() as c:
            jobs = [_ROUND_POOL.submit(c[t].descriptor, True) for t in TABLES]
            descs = [j.result() for j in jobs]
        for d in descs:
            self._accepted(d)
        latest = self.latest
        if latest is not None:
            self._head_read(latest)

    @contextmanager
    def clients(self) -> Iterator[dict[str, KeywordClient]]:
        """A set of clients, one a table, for one read."""
        with self._lock:
            mine = self._free.pop() if self._free else None
        if mine is None:
            mine = {t: KeywordClient(self.pir, self.public_key, table=t, max_age=self.max_age,
                                     trusted_version=lambda: self.seen_version,
                                     min_block=self.min_block,
                                     shared=self._versions[t]) for t in TABLES}
        try:
            yield mine
        finally:
            with self._lock:
                self._free.append(mine)

    def head(self) -> Served:
        """The block the parties serve now (the accounts table's signed descriptor, read
        again)."""
        with self.clients() as c:
            desc = c["accounts"].descriptor(refresh=True)
            return self._head_read(self._accepted(desc, c["accounts"].last_view))

    def current(self) -> Served:
        """The block the parties serve now: the newest version read here where both parties
        still serve its data (`still_served`), else the head read again."""
        latest = self.latest
        if latest is not None and self.still_served(latest):
            return latest
        return self.head()

    def asked(self, addresses: Iterable[bytes] = ()) -> None:
        """A request for state came (for these accounts): the working set is kept read."""
        self.last_asked = time.monotonic()
        with self._lock:
            for a in addresses:
                self._recent[a] = None
                self._recent.move_to_end(a)
            while len(self._recent) > RECENT_ACCOUNTS:
                self._recent.popitem(last=False)

    def recent_accounts(self) -> list[bytes]:
        with self._lock:
            return list(self._recent)

    def cached_account(self, address: bytes) -> tuple[Account | None, Served] | None:
        """The account as read at the served block already (by a call, the working set or
        a lookup), where both parties still serve that data; None otherwise."""
        latest = self.latest
        if latest is None:
            return None
        cache = self.call_cache(latest)
        if address not in cache.accounts or not self.still_served(latest):
            return None
        return cache.accounts[address], latest

    def accounts(self, addresses: Sequence[bytes | str]) -> tuple[list[Account | None], Served]:
        keys = [address_bytes(a) for a in addresses]
        with self.clients() as c:
            values, desc = c["accounts"].read_at(keys)
            view = c["accounts"].last_view
        out = [None if v is None else decode_account(v) for v in values]
        served = self._accepted(desc, view)
        if served == self.latest:  # kept for the calls and reads at that version
            cache = self.call_cache(served)
            for k, account in zip(keys, out, strict=True):
                cache.accounts[k] = account
        return out, served

    def storage(self, pairs: Sequence[tuple[bytes | str, int | bytes | str]]
                ) -> tuple[list[int], Served]:
        keys = [storage_key(a, s) for a, s in pairs]
        with self.clients() as c:
            values, desc = c["storage"].read_at(keys)
            view = c["storage"].last_view
        return [decode_storage_value(v) for v in values], self._accepted(desc, view)

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

    def known_code(self, code_hash: bytes) -> bytes | None:
        if code_hash == EMPTY_CODE_HASH:
            return b""
        with self._lock:
            code = self.codes.get(code_hash)
            if code is not None:
                self.codes.move_to_end(code_hash)
            return code

    def read_round(self, served: Served, cache: CallCache, accounts: Iterable[bytes],
                   code_hashes: Iterable[bytes], words: Iterable[tuple[bytes, bytes]]
                   ) -> Served | None:
        """One round of calls' reads (module docstring: its shape), every answer proven
        against one version; the version they were read at, None when the tables answered
        from different versions (a publication mid-round: nothing kept, read again). Read at
        `served`, they go into `cache`; at a newer version, into that version's cache (the
        calls run again there, the round not lost). Code goes into `codes`."""
        addrs = sorted(set(accounts))
        pairs = sorted(set(words))
        hashes = sorted(h for h in set(code_hashes) if self.known_code(h) is None)
        keys = {
            "accounts": addrs + [secrets.token_bytes(ADDRESS_SIZE)
                                 for _ in range(bucket(len(addrs)) - len(addrs))],
            "storage": [storage_key(a, s) for a, s in pairs] + [
                secrets.token_bytes(STORAGE_KEY_SIZE)
                for _ in range(bucket(len(pairs)) - len(pairs))],
        }
        # code only in a round that needs some: code once read is kept across versions, so
        # this is a contract the endpoint had not seen (the parties learn that, not which)
        asked = hashes + [secrets.token_bytes(32)
                          for _ in range(code_bucket(len(hashes)) - len(hashes))]
        with self.clients() as c:
            jobs = {t: _ROUND_POOL.submit(c[t].read_at, k) for t, k in keys.items()}
            if hashes:
                jobs["code"] = _ROUND_POOL.submit(self._chunks_of, c["code"], asked)
            got = {t: j.result() for t, j in jobs.items()}
            views = {c[t].last_view for t in keys}
        descs = [v[1] for v in got.values()]
        if not all(_same_version(descs[0], d) for d in descs[1:]):
            return None
        # one matrix: every table's answers came from the same data, else no view kept
        now = self._accepted(descs[0], next(iter(views)) if len(views) == 1 else None)
        if (now.version, now.hash) != (served.version, served.hash):
            cache = self.call_cache(now)
        for a, v in zip(addrs, got["accounts"][0], strict=False):
            cache.accounts[a] = None if v is None else decode_account(v)
        for pair, v in zip(pairs, got["storage"][0], strict=False):
            cache.words[pair] = decode_storage_value(v)
        for h, chunks in zip(hashes, got["code"][0] if hashes else [], strict=False):
            code = self._joined(h, chunks)
            with self._lock:
                self.codes[h] = code
                while len(self.codes) > CODE_CACHE:
                    self.codes.popitem(last=False)
        return now

    @staticmethod
    def _chunks_of(code: KeywordClient, hashes: list[bytes]
                   ) -> tuple[list[list[bytes | None]], Descriptor]:
        """The chunks of each code hash: CODE_READ_CHUNKS each in one read, then the rest of
        any code past EIP-170 in one more (a new version between the two: the second's
        descriptor, and the caller reads again)."""
        n = CODE_READ_CHUNKS
        values, desc = code.read_at([code_key(h, i) for h in hashes for i in range(n)])
        out = [values[k * n:(k + 1) * n] for k in range(len(hashes))]
        longer = {k: code_chunks(code_length(v[0])) for k, v in enumerate(out)
                  if v[0] is not None and code_chunks(code_length(v[0])) > n}
        if longer:
            more, more_desc = code.read_at([code_key(hashes[k], i)
                                            for k, need in longer.items()
                                            for i in range(n, need)])
            if not _same_version(desc, more_desc):
                return out, more_desc  # the round is read again
            at = 0
            for k, need in longer.items():
                out[k] = out[k] + more[at:at + need - n]
                at += need - n
        return out, desc

    @staticmethod
    def _chunks(code: KeywordClient, code_hash: bytes) -> tuple[list[bytes | None], Descriptor]:
        (values,), desc = PrivateState._chunks_of(code, [code_hash])
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
    """Accounts and words read at one version, for the calls at that version (code, the same
    at every version, is `PrivateState.codes`)."""

    def __init__(self) -> None:
        self.accounts: dict[bytes, Account | None] = {}
        self.words: dict[tuple[bytes, bytes], int] = {}


def _same_version(a: Descriptor, b: Descriptor) -> bool:
    return (a.version, a.anchor) == (b.version, b.anchor)
