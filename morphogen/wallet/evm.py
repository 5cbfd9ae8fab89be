"""`eth_call` and `eth_estimateGas` over private state: revm (pyrevm) reading every account,
code and storage word it touches through private, verified lookups at the served block.

pyrevm's only lazy state is its fork mode, which asks a JSON-RPC URL for each account
(`eth_getBalance`, `eth_getTransactionCount`, `eth_getCode`) and word (`eth_getStorageAt`) as
execution reaches them, at one block number. So each call gets a URL of its own on a loopback
server here (`CallReads` behind `/call/<token>`), answering those four methods from
`PrivateState` and nothing else, every read pinned to the block the call began at; a read that
finds another block served (a publication mid-call) fails the run, which is done again at the
new block. pyrevm holds the interpreter lock while it waits on its HTTP requests, so it runs in
worker processes (`CallWorkers`), never in the process that answers them.

Padding. Within a call each account is read once (one accounts lookup: balance, nonce and code
hash), each contract's code once (one request of CODE_READ_CHUNKS chunks) and each word once;
what a call at the same version already read is not asked again (`PrivateState.call_cache`).
After the run the count of requests of each table is raised to the next of CALL_BUCKETS with
lookups of random keys, asked and verified as real ones: the parties learn the bucket of each
count, not which contract was called nor how many reads it took. A table not asked at all stays
at 0 (a call to an account without code reads none; one whose reads were all made at this
version before reads nothing). The order and timing of the requests are not padded.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import re
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from morphogen.chain.state import (
    EMPTY_CODE_HASH,
    Account,
    address_bytes,
    word_bytes,
)
from morphogen.wallet.methods import InvalidParams, NotServed, block_param, quantity
from morphogen.wallet.state import PrivateState, Served

CALL_BUCKETS = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
SPEC = "PRAGUE"
CALL_GAS = 50_000_000  # a node's default eth_call gas cap (geth RPCGasCap)
TRIES = 3
_TOKEN = re.compile(r"/call/([0-9a-f]{32})")


class CallFailed(RuntimeError):
    """The call ran and did not succeed: reverted (with its data) or halted."""

    def __init__(self, reason: str, data: bytes = b"") -> None:
        super().__init__(reason)
        self.reason, self.data = reason, data


def bucket(n: int) -> int:
    """The padded count of `n` requests of one table."""
    for b in CALL_BUCKETS:
        if n <= b:
            return b
    return -(-n // CALL_BUCKETS[-1]) * CALL_BUCKETS[-1]


class _Moved(RuntimeError):
    """The parties serve another block than the call's."""


class CallReads:
    """The private reads of one call, at one block, each asked once; counted for padding."""

    def __init__(self, state: PrivateState, served: Served) -> None:
        self.state, self.served = state, served
        # shared with the other calls at this version: what one read, the next need not ask
        cache = state.call_cache(served)
        self.accounts, self.code, self.words = cache.accounts, cache.code, cache.words
        self.requests = {"accounts": 0, "storage": 0, "code": 0}
        self.moved = False
        self.failure: Exception | None = None  # a read that failed: the call's answer
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
                if not isinstance(exc, _Moved) and self.failure is None:
                    self.failure = exc
                answers.append({"jsonrpc": "2.0", "id": r.get("id"),
                                "error": {"code": -32002, "message": "no private answer"}})
        return json.dumps(answers if many else answers[0]).encode()

    def _pinned(self, served: Served) -> None:
        if (served.number, served.hash, served.version) != (
                self.served.number, self.served.hash, self.served.version):
            self.moved = True
            raise _Moved(f"block {served.number} served, the call runs at {self.served.number}")

    def account(self, address: bytes) -> Account | None:
        with self._lock:
            if address not in self.accounts:
                self.requests["accounts"] += 1
                (got,), served = self.state.accounts([address])
                self._pinned(served)
                self.accounts[address] = got
            return self.accounts[address]

    def code_of(self, address: bytes) -> bytes:
        account = self.account(address)
        if account is None or account.code_hash == EMPTY_CODE_HASH:
            return b""
        with self._lock:
            if account.code_hash not in self.code:
                self.requests["code"] += 1
                code, served = self.state.code_by_hash(account.code_hash)
                self._pinned(served)
                self.code[account.code_hash] = code
            return self.code[account.code_hash]

    def word(self, address: bytes, slot: bytes) -> int:
        with self._lock:
            if (address, slot) not in self.words:
                self.requests["storage"] += 1
                (got,), served = self.state.storage([(address, slot)])
                self._pinned(served)
                self.words[(address, slot)] = got
            return self.words[(address, slot)]

    def pad(self) -> None:
        """Random-key requests up to each table's bucket (none for a table not asked)."""
        for table, n in self.requests.items():
            for _ in range(bucket(n) - n if n else 0):
                self.state.dummy(table)

    def answer(self, method: str, params: list) -> Any:
        """One of the four methods pyrevm's fork mode asks, at this call's block."""
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
        if method == "eth_getStorageAt":
            slot = word_bytes(params[1], "a storage slot")
            return "0x" + self.word(address, slot).to_bytes(32, "big").hex()
        raise NotServed(f"{method} is not read by a call")


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


# -- the worker processes ----------------------------------------------------------------

def _run(url: str, block: dict, tx: dict, estimate: bool) -> dict:
    """In a worker: one call (or a gas estimate, as a node's binary search) at `block`."""
    import pyrevm

    def attempt(gas: int) -> tuple[bool, bytes, str, int]:
        # a fresh EVM each time: message_call commits to its state (the reads are cached by
        # the call's CallReads, so a second run asks the parties nothing new)
        evm = pyrevm.EVM(fork_url=url, fork_block=hex(block["number"]), spec_id=SPEC)
        evm.set_block_env(pyrevm.BlockEnv(number=block["number"], timestamp=block["timestamp"],
                                          basefee=0, gas_limit=CALL_GAS))
        try:
            out = evm.message_call(tx["from"], tx["to"], tx["data"], tx["value"], gas, 0)
        except Exception as exc:  # pyrevm raises on revert and halt, naming which
            text = str(exc)
            data = re.search(r"0x((?:[0-9a-fA-F]{2})*)", text) if "Revert" in text else None
            return False, bytes.fromhex(data.group(1)) if data else b"", text[:300], 0
        res = evm.result
        return True, bytes(out), "", res.gas_used if res is not None else 0

    ok, out, reason, used = attempt(tx["gas"])
    if not estimate or not ok:
        return {"ok": ok, "out": out, "reason": reason, "gas": used}
    lo, hi = max(used - 1, 20_999), tx["gas"]
    while hi - lo > 1:  # the least gas that succeeds (refunds and the 63/64 rule)
        mid = (lo + hi) // 2
        if attempt(mid)[0]:
            hi = mid
        else:
            lo = mid
    return {"ok": True, "out": out, "reason": "", "gas": hi}


def _warm() -> bool:
    import pyrevm  # noqa: F401

    return True


class CallWorkers:
    """Processes that run pyrevm (spawned: no thread of this process is copied)."""

    def __init__(self, processes: int = 2) -> None:
        self._pool = concurrent.futures.ProcessPoolExecutor(
            processes, mp_context=multiprocessing.get_context("spawn"))
        for f in [self._pool.submit(_warm) for _ in range(processes)]:
            f.result(timeout=120)

    def run(self, url: str, block: dict, tx: dict, estimate: bool, timeout_s: float) -> dict:
        return self._pool.submit(_run, url, block, tx, estimate).result(timeout=timeout_s)

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)


# -- the methods -------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    sender: str
    to: str
    data: bytes
    value: int
    gas: int


def call_param(tx: Any) -> Call:
    if not isinstance(tx, dict):
        raise InvalidParams("a call is a transaction object")
    known = {"from", "to", "data", "input", "value", "gas", "gasPrice", "maxFeePerGas",
             "maxPriorityFeePerGas", "nonce", "type", "chainId", "accessList"}
    if set(tx) - known:
        raise InvalidParams(f"unknown fields {sorted(set(tx) - known)[:3]}")
    if tx.get("to") is None:
        raise NotServed("a call without `to` (contract creation) is not run privately")
    try:
        to = "0x" + address_bytes(tx["to"]).hex()
        sender = "0x" + address_bytes(tx.get("from") or "0x" + "00" * 20).hex()
    except (ValueError, TypeError) as exc:
        raise InvalidParams(str(exc)) from None
    data = tx.get("input", tx.get("data")) or "0x"
    if not isinstance(data, str) or not re.fullmatch(r"0x([0-9a-fA-F]{2})*", data):
        raise InvalidParams("data is 0x-hex of whole bytes")
    value = quantity(tx["value"], "value") if tx.get("value") is not None else 0
    gas = quantity(tx["gas"], "gas") if tx.get("gas") is not None else CALL_GAS
    for fee in ("gasPrice", "maxFeePerGas", "maxPriorityFeePerGas"):
        if tx.get(fee) not in (None, "0x0"):
            raise NotServed("a call that pays for gas is not run privately (fees are "
                            "computed against balances here as gas price 0)")
    return Call(sender, to, bytes.fromhex(data[2:]), value, min(gas, CALL_GAS))


class PrivateCalls:
    """eth_call and eth_estimateGas: revm in `workers`, its reads served by `routes` on the
    loopback server at `url`."""

    def __init__(self, state: PrivateState, workers: CallWorkers, routes: CallRoutes,
                 url: Callable[[], str], *, timeout_s: float = 60.0) -> None:
        self.state, self.workers, self.routes, self.url = state, workers, routes, url
        self.timeout_s = timeout_s

    def _execute(self, params: list, method: str, estimate: bool) -> tuple[dict, CallReads]:
        if not 1 <= len(params) <= 3:
            raise InvalidParams(f"{method} takes 1 to 3 params, got {len(params)}")
        call = call_param(params[0])
        wanted = block_param(params[1] if len(params) > 1 else None)
        if len(params) > 2 and params[2] not in (None, {}):
            raise NotServed("state overrides are not run privately")
        for _ in range(TRIES):
            served = self.state.head()
            wanted.check(served)
            reads = CallReads(self.state, served)
            token = self.routes.open(reads)
            try:
                result = self.workers.run(
                    f"{self.url()}/call/{token}", {"number": served.number,
                                                   "timestamp": served.time},
                    {"from": call.sender, "to": call.to, "data": call.data, "value": call.value,
                     "gas": call.gas}, estimate, self.timeout_s)
            finally:
                self.routes.close(token)
            if reads.moved:
                continue
            if reads.failure is not None:  # unverifiable or stale: never a guessed result
                raise reads.failure
            reads.pad()
            return result, reads
        raise NotServed(f"the served block moved during each of {TRIES} runs of the call")

    def eth_call(self, params: list) -> str:
        result, _ = self._execute(params, "eth_call", estimate=False)
        if not result["ok"]:
            raise CallFailed(result["reason"], result["out"])
        return "0x" + result["out"].hex()

    def eth_estimate_gas(self, params: list) -> str:
        result, _ = self._execute(params, "eth_estimateGas", estimate=True)
        if not result["ok"]:
            raise CallFailed(result["reason"], result["out"])
        return hex(result["gas"])


class CallService:
    """eth_call and eth_estimateGas for one endpoint: the worker processes, the loopback
    server their reads go to, and `calls` (a `PrivateCalls`) for the Endpoint."""

    def __init__(self, state: PrivateState, *, processes: int = 2,
                 timeout_s: float = 60.0) -> None:
        from morphogen.wallet.server import RpcServer

        self.routes = CallRoutes()
        self.server = RpcServer(None, "127.0.0.1", 0, route=self.routes.reads)
        self.server.start()
        try:
            self.workers = CallWorkers(processes)
        except BaseException:
            self.server.shutdown()
            self.server.server_close()
            raise
        self.calls = PrivateCalls(state, self.workers, self.routes, lambda: self.server.url,
                                  timeout_s=timeout_s)

    def close(self) -> None:
        self.workers.close()
        self.server.shutdown()
        self.server.server_close()
