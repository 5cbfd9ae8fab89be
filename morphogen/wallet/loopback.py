"""Each run's reads served to it: pyrevm's fork mode asks a JSON-RPC URL for every account and
storage word as execution reaches them, and a loopback server here answers those requests from
what the calls at the run's block have read privately, and nothing else.

Each run gets a URL of its own (`CallRoutes`: /call/<token>) and a `CallReads` behind it. The
loopback never waits on the parties: what a run asks that is not known yet (an account, a code
hash's code, a word) is answered with a placeholder and noted in `want`, and the run is thrown
away; evm.py reads what it noted in the next round and runs the call again.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from collections.abc import Iterable
from typing import Any

from morphogen.chain.state import EMPTY_CODE_HASH, Account, address_bytes, word_bytes
from morphogen.wallet.methods import InvalidParams, NotServed, block_param
from morphogen.wallet.rounds import Want
from morphogen.wallet.state import CallCache, PrivateState
from morphogen.wallet.versions import Served

_TOKEN = re.compile(r"/call/([0-9a-f]{32})")
_READS = ("eth_getBalance", "eth_getTransactionCount", "eth_getCode", "eth_getStorageAt")


class CallReads:
    """One run's reads at one block, answered from what calls at that block have read; what
    is not known yet is answered with a placeholder and noted in `want` (the run is then
    thrown away)."""

    def __init__(self, state: PrivateState, served: Served, cache: CallCache) -> None:
        self.state, self.served, self.cache = state, served, cache
        self.want = Want()
        self.touched = Want()  # everything the run read, known or not
        self.failure: Exception | None = None  # a bad read request: the call's answer
        self._lock = threading.Lock()

    def handle(self, body: bytes) -> bytes:
        """The loopback server's JSON-RPC (pyrevm's fork reads), one request or a batch."""
        request = json.loads(body)
        many = isinstance(request, list)
        answers = []
        for r in request if many else [request]:
            try:
                answers.append({"jsonrpc": "2.0", "id": r.get("id"),
                                "result": self.answer(r.get("method"), r.get("params") or [])})
            except Exception as exc:  # recorded: the run's failure is this, not pyrevm's
                with self._lock:
                    if self.failure is None:
                        self.failure = exc
                answers.append({"jsonrpc": "2.0", "id": r.get("id"),
                                "error": {"code": -32002, "message": "no private answer"}})
        return json.dumps(answers if many else answers[0]).encode()

    def account(self, address: bytes) -> Account | None:
        self.touched.accounts.add(address)
        if address in self.cache.accounts:
            return self.cache.accounts[address]
        with self._lock:
            self.want.accounts.add(address)
        return None  # a placeholder: no account

    def preloaded(self, addresses: Iterable[bytes]) -> list[tuple[str, int, int, bytes, bytes]]:
        """The accounts of `addresses` whose account and code are known at this block, as
        the run is given them up front (address, balance, nonce, code hash, code): counted
        as read, they cost the run no request to the loopback (three an account)."""
        out = []
        for address in sorted(addresses):
            if address not in self.cache.accounts:
                continue
            a = self.cache.accounts[address]
            if a is None:  # what the loopback answers for no account: all zero, no code
                out.append(("0x" + address.hex(), 0, 0, EMPTY_CODE_HASH, b""))
                self.touched.accounts.add(address)
                continue
            code = self.state.known_code(a.code_hash)
            if code is None:
                continue
            self.touched.accounts.add(address)
            if a.code_hash != EMPTY_CODE_HASH:
                self.touched.code.add(a.code_hash)
            out.append(("0x" + address.hex(), a.balance, a.nonce, a.code_hash, code))
        return out

    def code_of(self, address: bytes) -> bytes:
        account = self.account(address)
        if account is None or account.code_hash == EMPTY_CODE_HASH:
            return b""
        self.touched.code.add(account.code_hash)
        code = self.state.known_code(account.code_hash)
        if code is None:
            with self._lock:
                self.want.code.add(account.code_hash)
            return b""
        return code

    def word(self, address: bytes, slot: bytes) -> int:
        self.touched.words.add((address, slot))
        if (address, slot) in self.cache.words:
            return self.cache.words[(address, slot)]
        if address in self.cache.accounts and self.cache.accounts[address] is None:
            return 0  # no account has no storage
        with self._lock:
            self.want.words.add((address, slot))
        return 0

    def answer(self, method: str, params: list) -> Any:
        """One of the four methods pyrevm's fork mode asks, at this call's block."""
        if method not in _READS:  # a block hash (BLOCKHASH) above all
            raise NotServed(f"the call reads what is not read privately ({str(method)[:40]})")
        if len(params) != 2 + (method == "eth_getStorageAt"):
            raise InvalidParams(f"{method}: unexpected params")
        block_param(params[-1]).check(self.served)
        address = address_bytes(params[0])
        if method == "eth_getBalance":
            a = self.account(address)
            return hex(0 if a is None else a.balance)
        if method == "eth_getTransactionCount":
            a = self.account(address)
            return hex(0 if a is None else a.nonce)
        if method == "eth_getCode":
            return "0x" + self.code_of(address).hex()
        slot = word_bytes(params[1], "a storage slot")
        return "0x" + self.word(address, slot).to_bytes(32, "big").hex()


class CallRoutes:
    """The loopback server's requests, by path: /call/<token> -> that call's `CallReads`."""

    def __init__(self) -> None:
        self._calls: dict[str, CallReads] = {}
        self._lock = threading.Lock()

    def open(self, reads: CallReads) -> str:
        token = secrets.token_hex(16)
        with self._lock:
            self._calls[token] = reads
        return token

    def close(self, token: str) -> None:
        with self._lock:
            self._calls.pop(token, None)

    def reads(self, path: str) -> CallReads | None:
        m = _TOKEN.fullmatch(path)
        with self._lock:
            return self._calls.get(m.group(1)) if m else None
