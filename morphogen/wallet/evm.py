"""`eth_call` and `eth_estimateGas` over private state: revm (pyrevm) over accounts, code and
storage words read through private, verified lookups at the served block.

pyrevm's only lazy state is its fork mode, which asks a JSON-RPC URL for each account
(`eth_getBalance`, `eth_getTransactionCount`, `eth_getCode`) and word (`eth_getStorageAt`) as
execution reaches them, at one block number, every load in every frame (reverted ones too). So
each run of a call gets a URL of its own on a loopback server here (`CallReads` behind
`/call/<token>`) that answers those four methods from what the calls at that block have read,
and nothing else. pyrevm holds the interpreter lock while it waits on its HTTP requests, so it
runs in worker processes (`CallWorkers`), never in the process that answers them.

Runs and rounds. The loopback never waits on the parties: what a run asks that is not known yet
(an account, a code hash's code, a word) is answered with a placeholder and noted, and the run
is thrown away. What it noted is read in the next round (morphogen/wallet/rounds.py: shared with
the other calls in flight) and the call runs again. A run that asked nothing unknown is the
answer: every value it saw was read at its block and verified. A run takes milliseconds, a round
a private request of each table, so a call costs its rounds: ERC-20 `balanceOf` would be three
(the accounts, the token's code, the balance word). Code is kept across versions (it is checked
against its hash), and `CallMemo` has the same call's first round ask everything it read last
time, so a call repeated at a new version takes one; a run is given the accounts the call read
before that are known at its block (`CallReads.preloaded`), so it asks the loopback only for the
rest. A call starts at the newest version seen here without reading the head: the parties' GET
/epoch, read while it runs, or else its first round, says whether that version is still served
(docs/wallet.md).

The working set. At each new version a read of the head finds (the watcher's, or a request's:
`PrivateState.on_new_version`), what the remembered calls read and the accounts asked by
address are read again in one round (`PrivateCalls.warm`), while state was asked in the last
WARM_IDLE_S: a wallet reopening finds its state read at the served block. A call whose run
then asks nothing unknown is confirmed by both parties' GET /epoch naming the data its version
was read from (`PrivateState.still_served`), not by a round: zero rounds, nothing asked about
any key.

Padding. Every round asks accounts and storage once each (code where new), its lookups padded
to buckets (`PrivateState.read_round`), and a call's count of rounds is raised to the next of
ROUND_BUCKETS with rounds of random keys (which ride along with other calls' rounds when there
are any); a call answered from the working set reads none. The parties learn those buckets and
how many calls were in flight, not which contract was called nor what it read; the working
set's round comes with each publication, whenever the wallet opens. The timing of the rounds
is not padded.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from morphogen.chain.headers import BlockEnvironment, environment
from morphogen.chain.state import EMPTY_CODE_HASH, Account, address_bytes, word_bytes
from morphogen.wallet.methods import InvalidParams, NotServed, block_param, quantity
from morphogen.wallet.rounds import Coming, Rounds, Want, lacking
from morphogen.wallet.state import CallCache, PrivateState, Served
from morphogen.wallet.workers import CallWorkers, RunTimedOut

ROUND_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MAX_ROUNDS = ROUND_BUCKETS[-1]
# What one call may read, all its rounds together: a 50 M-gas loop over fresh slots would
# otherwise ask tens of thousands of lookups in one round.
MAX_CALL_LOOKUPS = 4096
RUN_S = 10.0  # EVM time one call's runs may take together
ENVS_KEPT = 8  # block environments of the last blocks served
MAX_ACCESS_LIST = 256  # addresses in a call's access list, and keys of one address
MEMO_CALLS = 4096
WARM_IDLE_S = 600.0  # the working set is read at each new version while state was asked
CALL_GAS = 50_000_000  # a node's default eth_call gas cap (geth RPCGasCap)
TRIES = 4  # runs at a version: a call may start at one the parties have left
_TOKEN = re.compile(r"/call/([0-9a-f]{32})")
_READS = ("eth_getBalance", "eth_getTransactionCount", "eth_getCode", "eth_getStorageAt")
log = logging.getLogger(__name__)


class CallFailed(RuntimeError):
    """The call ran and did not succeed: reverted (with its data) or halted."""

    def __init__(self, reason: str, data: bytes = b"") -> None:
        super().__init__(reason)
        self.reason, self.data = reason, data


def round_bucket(n: int) -> int:
    """The padded count of a call's `n` rounds (0 where a version change took its round)."""
    if n == 0:
        return 0
    for b in ROUND_BUCKETS:
        if n <= b:
            return b
    raise NotServed(f"the call reads state over more than {MAX_ROUNDS} rounds")


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


# -- the methods -------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    sender: str
    to: str
    data: bytes
    value: int
    gas: int
    # EIP-2930: (address, slots) warm from the start, each paid for in the intrinsic gas
    access_list: tuple[tuple[str, tuple[int, ...]], ...] = ()


def call_param(tx: Any) -> Call:
    if not isinstance(tx, dict):
        raise InvalidParams("a call is a transaction object")
    known = {"from", "to", "data", "input", "value", "gas", "gasPrice", "maxFeePerGas",
             "maxPriorityFeePerGas", "nonce", "type", "chainId", "accessList"}
    if "authorizationList" in tx:
        raise NotServed("a call with an EIP-7702 authorization list is not run privately "
                        "(this EVM predates Prague's delegations)")
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
    if value >= 1 << 256:
        raise InvalidParams("value is a 256-bit quantity")
    if gas >= 1 << 64:
        raise InvalidParams("gas is a 64-bit quantity")
    for fee in ("gasPrice", "maxFeePerGas", "maxPriorityFeePerGas"):
        if tx.get(fee) not in (None, "0x0"):
            raise NotServed("a call that pays for gas is not run privately (fees are "
                            "computed against balances here as gas price 0)")
    return Call(sender, to, bytes.fromhex(data[2:]), value, min(gas, CALL_GAS),
                access_list(tx.get("accessList")))


def access_list(value: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """An EIP-2930 access list: [{"address", "storageKeys": [32-byte words]}]."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_ACCESS_LIST:
        raise InvalidParams(f"accessList is a list of at most {MAX_ACCESS_LIST} entries")
    out = []
    for entry in value:
        if not isinstance(entry, dict) or set(entry) - {"address", "storageKeys"}:
            raise InvalidParams("an accessList entry is {address, storageKeys}")
        keys = entry.get("storageKeys") or []
        if not isinstance(keys, list) or len(keys) > MAX_ACCESS_LIST:
            raise InvalidParams("storageKeys is a list of 32-byte words")
        try:
            address = "0x" + address_bytes(entry.get("address")).hex()
            slots = tuple(int.from_bytes(word_bytes(k, "a storage key"), "big") for k in keys)
        except (ValueError, TypeError) as exc:
            raise InvalidParams(f"accessList: {exc}") from None
        out.append((address, slots))
    return tuple(out)


class CallMemo:
    """What each recent call read (the reads of the run that answered it), by the call: at
    the next version the same call's first round asks all of it at once, where the reads
    would otherwise come a round after another (the account, then its code, then its words).
    A prediction only: every value a run sees is still read at its block."""

    def __init__(self, size: int = MEMO_CALLS) -> None:
        self._size = size
        self._calls: OrderedDict[Call, Want] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, call: Call, read: Want) -> None:
        with self._lock:
            self._calls[call] = read
            self._calls.move_to_end(call)
            while len(self._calls) > self._size:
                self._calls.popitem(last=False)

    def last(self, call: Call) -> Want:
        """All the call read last time (empty for a call not seen)."""
        with self._lock:
            last = self._calls.get(call)
        return Want() if last is None else Want(set(last.accounts), set(last.code),
                                                set(last.words))

    def union(self) -> Want:
        """Everything the remembered calls read: the working set."""
        out = Want()
        with self._lock:
            for read in self._calls.values():
                out.merge(read)
        return out


class CallLimit(RuntimeError):
    """A call past this endpoint's limits on what one call may read (JSON-RPC -32005)."""


class Tally:
    """One call's costs so far: the rounds it read (for the padding), its own reads (for the
    lookup limit), and its runs' EVM time (for the time limit)."""

    def __init__(self) -> None:
        self.rounds = 0
        self.reads = Want()
        self.seconds = 0.0
        self.served: Served | None = None  # where its padding rounds go
        self.cache: CallCache | None = None

    def lookups(self) -> int:
        return len(self.reads.accounts) + len(self.reads.words) + len(self.reads.code)


class PrivateCalls:
    """eth_call and eth_estimateGas: revm in `workers`, its reads served by `routes` on the
    loopback server at `url`, read privately in `rounds` shared by the calls in flight."""

    def __init__(self, state: PrivateState, workers: CallWorkers, routes: CallRoutes,
                 url: Callable[[], str], *, run_s: float = RUN_S,
                 headers: Callable[[str], Any] | None = None) -> None:
        """`run_s`: the EVM time one call's runs may take together (rounds not counted).
        `headers(block_hash)`: a node's header of that block (the upstream's
        `eth_getBlockByHash`), checked against the signed hash, for what a call sees of its
        block; without it, or where it does not check, the block's number and the owner's
        version time, the gas cap as gas limit, COINBASE and PREVRANDAO 0."""
        self.state, self.workers, self.routes, self.url = state, workers, routes, url
        self.run_s = run_s
        self.rounds = Rounds(state)
        self._memo = CallMemo()
        self._headers = headers
        self._envs: OrderedDict[str, BlockEnvironment | None] = OrderedDict()
        self._envs_lock = threading.Lock()
        state.on_new_version(self.warm)
        if headers is not None:
            # one header request a publication, when it is seen, whatever the wallet does
            state.on_new_version(self._environment)

    def _environment(self, served: Served) -> BlockEnvironment | None:
        """`served`'s block environment from its checked header, read once a block."""
        if self._headers is None:
            return None
        with self._envs_lock:
            if served.hash in self._envs:
                return self._envs[served.hash]
        try:
            env: BlockEnvironment | None = environment(self._headers(served.hash), served.hash)
        except Exception as exc:  # noqa: BLE001 - no header, or one that does not check
            log.warning("the served block's header: %s", type(exc).__name__)
            env = None
        with self._envs_lock:
            self._envs[served.hash] = env
            while len(self._envs) > ENVS_KEPT:
                self._envs.popitem(last=False)
        return env

    def block(self, served: Served) -> dict:
        """What a run at `served` sees of its block."""
        env = self._environment(served)
        if env is None:
            return {"number": served.number, "timestamp": served.time,
                    "chain_id": served.chain_id, "gas_limit": CALL_GAS}
        return {"number": env.number, "timestamp": env.timestamp, "chain_id": served.chain_id,
                "gas_limit": env.gas_limit, "coinbase": env.coinbase,
                "prevrandao": env.prevrandao}

    def warm(self, served: Served) -> None:
        """Read the working set (what the remembered calls read, the accounts asked by
        address) at `served`, when state was asked in the last WARM_IDLE_S: one round, padded
        as any, that the requests then find read."""
        if time.monotonic() - self.state.last_asked > WARM_IDLE_S:
            return
        latest = self.state.latest
        if latest is not None and latest.version > served.version:
            return  # a newer one came meanwhile (the head read that finds it warms it)
        cache = self.state.call_cache(served)
        want = lacking(self._working_set(), self.state, cache)
        if want:
            self.rounds.fetch(served, cache, want)

    def _working_set(self) -> Want:
        want = self._memo.union()
        want.accounts.update(self.state.recent_accounts())
        return want

    def _naming(self, want: Want, served: Served) -> Want:
        """A round at a version not confirmed, reading `want`: it is read at the version
        served now. Where the parties are known to have left `served`, that is a newer one
        whose reads start empty, so the round reads the working set too (what `warm` would
        read there): the calls coming after it find their reads done, where each wave of
        requests would otherwise take a round of its own. `want` itself is not changed (it
        may be what the run read, which the memo keeps)."""
        if not self.state.left(served):
            return want
        out = self._working_set()
        out.merge(want)
        return out

    def _run(self, call: Call, served: Served, cache: CallCache, estimate: bool,
             tally: Tally, accounts: set[bytes] = frozenset()) -> tuple[dict, Want, Want]:
        """One run, within what is left of the call's run time; the `accounts` known at
        `served` go with it (read, not asked for)."""
        left = self.run_s - tally.seconds
        if left <= 0:
            raise RunTimedOut(f"the call's runs took {self.run_s:g} s of EVM time")
        reads = CallReads(self.state, served, cache)
        token = self.routes.open(reads)
        try:
            block = self.block(served)
            # no more gas than the block holds (revm refuses more; anvil gives a call the
            # block's gas limit by default)
            result = self.workers.run(
                f"{self.url()}/call/{token}", block,
                {"from": call.sender, "to": call.to, "data": call.data, "value": call.value,
                 "gas": min(call.gas, block["gas_limit"]),
                 "access_list": [list(e) for e in call.access_list]},
                estimate, left, reads.preloaded(accounts))
        finally:
            self.routes.close(token)
        tally.seconds += result.get("seconds", 0.0)
        # a read refused (a block hash, another block) is the call's answer, unless the run
        # saw placeholders: a path that real values may not take, thrown away anyway
        if reads.failure is not None and not reads.want:
            raise reads.failure
        return result, reads.want, reads.touched

    def _execute(self, params: list, method: str, estimate: bool) -> dict:
        # coming from the start: a batch announced this call (`Rounds.expecting`), and a call
        # refused here arrives at once rather than keep a round waiting for it
        with self.rounds.coming() as coming:
            if not 1 <= len(params) <= 3:
                raise InvalidParams(f"{method} takes 1 to 3 params, got {len(params)}")
            call = call_param(params[0])
            wanted = block_param(params[1] if len(params) > 1 else None)
            if len(params) > 2 and params[2] not in (None, {}):
                raise NotServed("state overrides are not run privately")
            self.state.asked()
            tally = Tally()
            try:
                return self._execute_coming(call, wanted, estimate, coming, tally)
            finally:
                # Whatever the call ended on (an answer, a revert, a read refused such as
                # BLOCKHASH, a limit, a timeout, an error of the parties, a version change on
                # the way), its rounds are raised to the same buckets: the parties cannot
                # tell the contract's path from their count.
                self._pad(tally)

    def _pad(self, tally: Tally) -> None:
        if tally.served is None or tally.cache is None:
            return
        for _ in range(round_bucket(tally.rounds) - tally.rounds):
            try:
                self.rounds.fetch(tally.served, tally.cache, Want())
            except Exception as exc:  # noqa: BLE001 - the call's own outcome stands
                log.debug("a padding round: %s", type(exc).__name__)
                return

    def _round(self, tally: Tally, want: Want, served: Served, cache: CallCache,
               reading: Want, coming: Coming | None, *, held: bool = False
               ) -> tuple[Served | None, bool]:
        """One of the call's rounds, within its limits: `want` its own reads, `reading`
        what the round asks for it (the working set may ride along)."""
        if tally.rounds >= MAX_ROUNDS:
            raise CallLimit(f"the call reads state over more than {MAX_ROUNDS} rounds")
        tally.reads.merge(want)
        if tally.lookups() > MAX_CALL_LOOKUPS:
            raise CallLimit(f"the call reads more than {MAX_CALL_LOOKUPS} accounts, storage "
                            "words and codes")
        at, read = self.rounds.fetch(served, cache, reading, coming, held=held)
        if read:
            tally.rounds += 1
            tally.served, tally.cache = served, cache
        return at, read

    def _execute_coming(self, call: Call, wanted: Any, estimate: bool, coming: Coming,
                        tally: Tally) -> dict:
        # A call for the served block starts at the newest version seen here, unconfirmed:
        # a run on that version's reads stands where both parties still serve its data
        # (GET /epoch); else its first round is read at the version served now, and names it
        # where it is newer (the round then counts for that version, not lost). No call
        # reads the head on its own (a head read costs more).
        served = self.state.latest if wanted.number is None and wanted.hash is None else None
        confirmed = False
        for _ in range(TRIES):
            if served is None:
                served, confirmed = self.rounds.head(), True
            wanted.check(served)
            cache = self.state.call_cache(served)
            if tally.served is None:
                tally.served, tally.cache = served, cache
            rounds, at = 0, served
            # Both parties' /epoch naming the very data the version was read from confirms
            # it (no round); read while the call runs, where it can confirm at all.
            confirming = None if confirmed else self.state.confirming(served)
            # what the same call read last time: its first round, before any run (only what
            # this version's reads lack, where /epoch may confirm the version; all of it
            # otherwise, the round then saying which version the parties serve)
            last = self._memo.last(call)
            want = (lacking(last, self.state, cache)
                    if confirmed or confirming is not None else last)
            accounts = set(last.accounts)
            while True:
                if want:
                    rounds += 1
                    at, read = self._round(
                        tally, want, served, cache,
                        want if confirmed else self._naming(want, served), coming,
                        held=confirmed or confirming is not None)
                    if at != served:
                        break
                    confirmed = confirmed or read
                # the accounts the call read last time, and in this call's runs so far
                result, want, touched = self._run(call, served, cache, estimate, tally,
                                                  accounts)
                accounts |= touched.accounts
                if confirming is not None:
                    confirmed = confirmed or confirming.result()
                    confirming = None
                if not want and not confirmed:
                    # Nothing unknown, at a version not yet confirmed: what the run read,
                    # read again. At that version, the run's answer stands; at a newer
                    # one, that version's cache has what the call needs there.
                    rounds += 1
                    at, _ = self._round(tally, touched, served, cache,
                                        self._naming(touched, served), coming)
                    confirmed = at == served
                    break
                if not want:
                    break
                if rounds == 0:  # and whatever the run will ask next, in the same round
                    want.merge(lacking(last, self.state, cache))
            if at != served:  # a newer version (or a publication mid-round: the head)
                served, confirmed = at, at is not None
                continue
            self._memo.put(call, touched)
            return result
        raise NotServed(f"the served block moved during each of {TRIES} runs of the call")

    def eth_call(self, params: list) -> str:
        result = _succeeded(self._execute(params, "eth_call", estimate=False))
        return "0x" + result["out"].hex()

    def eth_estimate_gas(self, params: list) -> str:
        result = _succeeded(self._execute(params, "eth_estimateGas", estimate=True))
        return hex(result["gas"])


def _succeeded(result: dict) -> dict:
    if result["ok"]:
        return result
    if "RejectCallerWithCode" in result["reason"]:
        # Nodes skip EIP-3607 for eth_call and eth_estimateGas; this EVM (pyrevm 0.3.7, revm
        # 8) cannot, and hiding the sender's code would answer wrongly where the call reads
        # it or calls back. So not answered here: upstream, or refused saying why.
        raise NotServed("a call from an address with code (a Safe, a 4337 account, any "
                        "contract) is not run privately: this EVM applies EIP-3607 to calls")
    raise CallFailed(result["reason"], result["out"])


class CallService:
    """eth_call and eth_estimateGas for one endpoint: the worker processes, the loopback
    server their reads go to, and `calls` (a `PrivateCalls`) for the Endpoint."""

    def __init__(self, state: PrivateState, *, processes: int = 2,
                 run_s: float = RUN_S, headers: Callable[[str], Any] | None = None) -> None:
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
                                  run_s=run_s, headers=headers)

    def close(self) -> None:
        self.workers.close()
        self.server.shutdown()
        self.server.server_close()
