"""What one block changed, and the state after it, read from the node.

The node's trace of a block says which accounts and slots its transactions changed: each
transaction's stateDiff from `trace_replayBlockTransactions` where the node answers it, else
`debug_traceBlockByHash` with `prestateTracer` in diff mode (`Tracer`). The block also changes
state with no transaction, and those keys are added here (see DESIGN.md, "Following a
chain"):

- EIP-2935 (block hashes): the history contract stores the parent's hash in slot
  ``(number - 1) % 8191`` at the start of every block;
- EIP-4788 (beacon roots): the beacon roots contract stores the timestamp and the root in
  slots ``timestamp % 8191`` and ``timestamp % 8191 + 8191``;
- EIP-7002 and EIP-7251 (withdrawal and consolidation requests): their queues are read and
  reset at the end of every block (slots 0..3: excess, count, head, tail);
- EIP-4895 withdrawals credit the recipients from the block body, and the fee recipient
  earns the priority fees.

A system contract that has no code at the block (a chain before its fork) stores nothing: its
slots read zero and change nothing. The node is the oracle: the values after the block are
read from it at the block (by hash, so a reorg cannot swap the block under the reads), and
where the trace also says what a value became, the two must agree. A disagreement is read
again (a dev node answering from the block it is mining, DESIGN.md); one that persists stops
the follower: it never publishes a guess.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from morphogen.chain.rpc import ChainError, EthRpc, MethodMissing, RpcError, to_int
from morphogen.chain.state import (
    EMPTY_CODE_HASH,
    Account,
    address_bytes,
    keccak256,
    word_bytes,
)

HISTORY_CONTRACT = bytes.fromhex("0000f90827f1c53a10cb7a02335b175320002935")
BEACON_ROOTS_CONTRACT = bytes.fromhex("000f3df6d732807ef1319fb7b8bb8522d0beac02")
WITHDRAWAL_REQUESTS_CONTRACT = bytes.fromhex("00000961ef480eb55e80d19ad83579a64c007002")
CONSOLIDATION_REQUESTS_CONTRACT = bytes.fromhex("0000bbddc7ce488642fb579f8b00f3a590007251")
HISTORY_WINDOW = 8191
BEACON_WINDOW = 8191
REQUEST_SLOTS = range(4)
TRACER = {"tracer": "prestateTracer", "tracerConfig": {"diffMode": True}}
BATCH_CALLS = 500
BATCHES_AT_ONCE = 4  # a block's reads go to the node as this many batch requests at a time
READ_AGAIN = 3  # reads of a value that disagrees with the trace, before giving up

log = logging.getLogger(__name__)


class ChainMoved(ChainError):
    """The node's chain changed while a step read it: the step is tried again."""


class ChainMismatch(ChainError):
    """The node's state after a block disagrees with the block's own trace, read after read."""


@dataclass(frozen=True)
class Header:
    number: int
    hash: str
    parent_hash: str
    timestamp: int
    miner: bytes
    withdrawals: tuple[bytes, ...]
    transactions: tuple[str, ...] | None = None  # their hashes, lower case (None: not known)
    # A SELFDESTRUCT may delete an account made before its transaction: a block before
    # Cancun (EIP-6780), known by its header's lack of the beacon root (EIP-4788)
    deletes: bool = False

    @classmethod
    def of(cls, raw: dict) -> Header:
        try:
            return cls(to_int(raw["number"], "number"), str(raw["hash"]).lower(),
                       str(raw["parentHash"]).lower(), to_int(raw["timestamp"], "timestamp"),
                       address_bytes(raw.get("miner") or "0x" + "00" * 20),
                       tuple(address_bytes(w["address"]) for w in raw.get("withdrawals") or ()),
                       _hashes(raw.get("transactions")), "parentBeaconBlockRoot" not in raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise ChainError(f"a block header without a usable field ({exc})") from None


def _hashes(transactions: Any) -> tuple[str, ...] | None:
    if transactions is None:
        return None
    return tuple(str(t["hash"] if isinstance(t, dict) else t).lower() for t in transactions)


def header(rpc: EthRpc, number: int) -> Header:
    return Header.of(rpc.block(number))


Slot = tuple[bytes, bytes]  # (address, 32-byte slot)


@dataclass
class Touched:
    """The accounts and slots a block (or several) changed, and what its trace says they
    became (`expected`: ("balance"|"nonce"|"code", address) or ("slot", address, slot) ->
    value; ("gone", address) -> True for an account the trace deleted)."""

    accounts: set[bytes] = field(default_factory=set)
    slots: set[Slot] = field(default_factory=set)
    expected: dict[tuple, Any] = field(default_factory=dict)

    def merge(self, other: Touched) -> None:
        """Add the keys of `other`; expectations no longer hold (a later block speaks)."""
        self.accounts |= other.accounts
        self.slots |= other.slots
        self.expected = {}

    def to_json(self) -> dict:
        return {"accounts": sorted("0x" + a.hex() for a in self.accounts),
                "slots": sorted("0x" + a.hex() + s.hex() for a, s in self.slots)}

    @classmethod
    def from_json(cls, d: dict) -> Touched:
        out = cls({address_bytes(a) for a in d.get("accounts", ())})
        for key in d.get("slots", ()):
            raw = bytes.fromhex(key[2:])
            out.slots.add((raw[:20], raw[20:]))
        return out


PRESTATE = "prestate"  # debug_traceBlockByHash, prestateTracer in diff mode: geth's way
REPLAY = "replay"  # trace_replayBlockTransactions with stateDiff, the block named by hash
REPLAY_BY_NUMBER = "replay-by-number"  # the same, by number (anvil), checked to be the block
SOURCES = (REPLAY, REPLAY_BY_NUMBER, PRESTATE)  # the cheapest first


class Tracer:
    """Reads what blocks changed from one node, by the cheapest source it answers.

    `trace_replayBlockTransactions` (reth, erigon, nethermind, anvil; not geth) returns every
    transaction's state diff from one replay of the block. A debug trace of the block costs
    more on the nodes that have both: on anvil 6x at 200 transactions, 10x at 300, whatever
    the tracer, and per-transaction traces, even sent at once, no less (bench/chain_trace.py).
    The first block probes the sources in `SOURCES` order; the first one the node answers is
    used from then on. A node that refuses one (no such method, or not that form of the block
    parameter) falls to the next; one that answers malformed traces is an error, as it always
    was. Every source gives the same `Touched`, but for a block before Cancun: a replay's
    stateDiff may show a self-destructed account's balance going to zero, not the account
    dying (anvil does), so those blocks take the prestate tracer, whatever the node offers."""

    def __init__(self, rpc: EthRpc, source: str | None = None) -> None:
        if source is not None and source not in SOURCES:
            raise ValueError(f"a trace source is one of {', '.join(SOURCES)}, not {source!r}")
        self.rpc, self.source = rpc, source

    def touched(self, head: Header) -> Touched:
        """Every account and slot block `head` changed: its transactions' and its own."""
        if head.deletes:
            out = _prestate(self.rpc, head)
        elif self.source is not None:
            out = _READERS[self.source](self.rpc, head)
        else:
            out = self._probe(head)
        _block_changes(out, head)
        return out

    def _probe(self, head: Header) -> Touched:
        for source in SOURCES[:-1]:
            try:
                out = _READERS[source](self.rpc, head)
            except MethodMissing:
                break  # no trace_ namespace: neither form of the block is answered
            except RpcError as exc:
                log.info("the node at %s refused %s (%s): trying the next source",
                         self.rpc.shown, source, exc.rpc_message or exc.code)
                continue
            self.source = source
            return out
        out = _READERS[PRESTATE](self.rpc, head)
        self.source = PRESTATE
        return out


def touched_by(rpc: EthRpc, head: Header, source: str | None = None) -> Touched:
    """Every account and slot block `head` changed, by `source` (None: the cheapest the node
    answers, probed anew: a follower keeps a `Tracer` instead)."""
    return Tracer(rpc, source).touched(head)


def _prestate(rpc: EthRpc, head: Header) -> Touched:
    try:
        traces = rpc.call("debug_traceBlockByHash", head.hash, TRACER)
    except MethodMissing:
        raise ChainError(f"the node at {rpc.shown} has no debug_traceBlockByHash: follow a "
                         "node with the debug API on (geth --http.api eth,debug; reth, erigon "
                         "and anvil answer it)") from None
    _check_count(traces, head, "debug_traceBlockByHash")
    out = Touched()
    for i, item in enumerate(traces):
        result = item.get("result") if isinstance(item, dict) else None
        if not isinstance(result, dict) or "pre" not in result or "post" not in result:
            raise ChainError(f"block {head.number}, transaction {i}: the trace has no pre/post "
                             "diff (the node's prestateTracer does not take diffMode)")
        try:
            _diff(out, result["pre"] or {}, result["post"] or {})
        except (AttributeError, TypeError, ValueError) as exc:
            raise ChainError(f"block {head.number}, transaction {i}: a malformed prestate "
                             f"diff ({exc})") from None
    return out


def _replay(rpc: EthRpc, head: Header) -> Touched:
    return _state_diffs(rpc.call("trace_replayBlockTransactions", head.hash, ["stateDiff"]),
                        head)


def _replay_by_number(rpc: EthRpc, head: Header) -> Touched:
    traces = rpc.call("trace_replayBlockTransactions", hex(head.number), ["stateDiff"])
    # A number names whatever block the node holds at that height now: the traces are the
    # block's only if the node still holds it after answering (and it held it before: the
    # header was read by number). Each trace also names its transaction, checked below.
    now = rpc.call("eth_getBlockByNumber", hex(head.number), False)
    if not isinstance(now, dict) or str(now.get("hash")).lower() != head.hash:
        raise ChainMoved(f"block {head.number} changed on the node while it was traced")
    return _state_diffs(traces, head, named=True)


_READERS = {PRESTATE: _prestate, REPLAY: _replay, REPLAY_BY_NUMBER: _replay_by_number}


def _check_count(traces: Any, head: Header, method: str) -> None:
    if not isinstance(traces, list):
        raise ChainError(f"{method} of block {head.number} answered "
                         f"{type(traces).__name__}, not a list of traces")
    if head.transactions is not None and len(traces) != len(head.transactions):
        raise ChainError(f"{method} of block {head.number} answered {len(traces)} traces for "
                         f"its {len(head.transactions)} transactions")


def _state_diffs(traces: Any, head: Header, *, named: bool = False) -> Touched:
    """`Touched` of a block's `trace_replayBlockTransactions` answer: the same keys and
    expectations as its prestate diff gives. `named`: every trace must name its transaction
    (the block was asked for by number)."""
    _check_count(traces, head, "trace_replayBlockTransactions")
    out = Touched()
    for i, item in enumerate(traces):
        diff = item.get("stateDiff") if isinstance(item, dict) else None
        if not isinstance(diff, dict):
            raise ChainError(f"block {head.number}, transaction {i}: the trace has no "
                             "stateDiff")
        tx = item.get("transactionHash")
        if (tx is not None or named) and head.transactions is not None and (
                not isinstance(tx, str) or tx.lower() != head.transactions[i]):
            raise ChainError(f"block {head.number}, transaction {i}: the trace names "
                             f"transaction {str(tx)[:66]}, not {head.transactions[i]}")
        try:
            _state_diff(out, diff)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ChainError(f"block {head.number}, transaction {i}: a malformed stateDiff "
                             f"({exc})") from None
    return out


def _state_diff(out: Touched, diff: dict) -> None:
    """One transaction's stateDiff into `out`. Each field is "=" (unchanged), {"*": {"from",
    "to"}} (changed), {"+": value} (the account was born) or {"-": value} (it died). The
    prestate tracer leaves out what did not change and a born account's zero fields, and so
    does this: the expectations are the same."""
    for raw_address, change in diff.items():
        address = address_bytes(raw_address)
        out.accounts.add(address)
        fields = {name: _delta(change.get(name, "="), name)
                  for name in ("balance", "nonce", "code")}
        if any(kind == "-" for kind, _ in fields.values()):
            out.expected[("gone", address)] = True
            for name in ("balance", "nonce", "code"):
                out.expected.pop((name, address), None)
        else:
            out.expected.pop(("gone", address), None)
            for name, (kind, value) in fields.items():
                if kind == "*" or (kind == "+" and value not in ("0x", "0x0")):
                    out.expected[(name, address)] = (
                        _hex_bytes(value, "code") if name == "code" else to_int(value, name))
        storage = change.get("storage") or {}
        if not isinstance(storage, dict):
            raise TypeError(f"storage of 0x{address.hex()} is {type(storage).__name__}")
        for slot, word in storage.items():
            s = word_bytes(slot, "a slot")
            kind, value = _delta(word, "a storage word")
            if kind == "=":
                continue
            out.slots.add((address, s))
            out.expected[("slot", address, s)] = 0 if kind == "-" else to_int(
                value, "a storage word")


def _delta(field: Any, what: str) -> tuple[str, Any]:
    """("=", None), ("+" | "-", value) or ("*", the value after)."""
    if field == "=":
        return "=", None
    if isinstance(field, dict) and len(field) == 1:
        (kind, value), = field.items()
        if kind in ("+", "-"):
            return kind, value
        if kind == "*" and isinstance(value, dict) and "to" in value:
            return kind, value["to"]
    raise ValueError(f"{what} changes as {repr(field)[:60]}, not =, +, - or *")


def _diff(out: Touched, pre: dict, post: dict) -> None:
    for raw_address, before in pre.items():
        address = address_bytes(raw_address)
        out.accounts.add(address)
        after = post.get(raw_address)
        if after is None:
            # in pre, not in post: the transaction deleted the account
            out.expected[("gone", address)] = True
            for key in list(out.expected):
                if key[0] in ("balance", "nonce", "code") and key[1] == address:
                    del out.expected[key]
        for slot in (before or {}).get("storage") or {}:
            s = word_bytes(slot, "a slot")
            out.slots.add((address, s))
            if after is not None and slot not in (after.get("storage") or {}):
                out.expected[("slot", address, s)] = 0  # zeroed: absent from post
            elif after is None:
                out.expected[("slot", address, s)] = 0
    for raw_address, after in post.items():
        address = address_bytes(raw_address)
        out.accounts.add(address)
        out.expected.pop(("gone", address), None)
        for name in ("balance", "nonce"):
            if name in after:
                out.expected[(name, address)] = _number(after[name], name)
        if "code" in after:
            out.expected[("code", address)] = _hex_bytes(after["code"], "code")
        for slot, word in (after.get("storage") or {}).items():
            s = word_bytes(slot, "a slot")
            out.slots.add((address, s))
            out.expected[("slot", address, s)] = to_int(word, "a storage word")


def _block_changes(out: Touched, head: Header) -> None:
    out.accounts.add(head.miner)
    for address in head.withdrawals:
        out.accounts.add(address)
        # credited after the transactions: the trace's balance is not the block's
        out.expected.pop(("balance", address), None)
    if head.number > 0:
        out.slots.add((HISTORY_CONTRACT, word_bytes((head.number - 1) % HISTORY_WINDOW)))
    at = head.timestamp % BEACON_WINDOW
    out.slots.add((BEACON_ROOTS_CONTRACT, word_bytes(at)))
    out.slots.add((BEACON_ROOTS_CONTRACT, word_bytes(at + BEACON_WINDOW)))
    for contract in (WITHDRAWAL_REQUESTS_CONTRACT, CONSOLIDATION_REQUESTS_CONTRACT):
        for slot in REQUEST_SLOTS:
            out.slots.add((contract, word_bytes(slot)))
    for contract, _ in list(out.slots):
        out.accounts.add(contract)
    for key in [k for k in out.expected if k[0] == "slot" and k[1] in (
            HISTORY_CONTRACT, BEACON_ROOTS_CONTRACT, WITHDRAWAL_REQUESTS_CONTRACT,
            CONSOLIDATION_REQUESTS_CONTRACT)]:
        del out.expected[key]  # written by the block's system calls as well


def _number(value: Any, what: str) -> int:
    # the tracer writes nonces as JSON numbers and balances as hex quantities
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return to_int(value, what)


def _hex_bytes(value: Any, what: str) -> bytes:
    if not isinstance(value, str) or not value.startswith("0x"):
        raise ChainError(f"{what} {repr(value)[:40]} is not 0x-hex")
    try:
        return bytes.fromhex(value[2:])
    except ValueError:
        raise ChainError(f"{what} {value[:40]!r} is not valid hex") from None


@dataclass
class State:
    """The values after a block of the keys a `Touched` names."""

    accounts: dict[bytes, tuple[Account, bytes]]  # address -> (account, code)
    slots: dict[Slot, int]

    def exists(self, address: bytes) -> bool:
        account, _ = self.accounts[address]
        return account.nonce > 0 or account.balance > 0 or account.has_code


def read_state(rpc: EthRpc, head: Header, touched: Touched, *,
               pause_s: float = 0.2) -> State:
    """The values of every key of `touched` at block `head`, checked against the trace's
    `expected`: ChainMismatch when they disagree after `READ_AGAIN` reads."""
    at = {"blockHash": head.hash}
    accounts = sorted(touched.accounts)
    slots = sorted(touched.slots)
    state = State(_accounts(rpc, accounts, at), _slots(rpc, slots, at))
    for attempt in range(READ_AGAIN + 1):
        wrong = _disagreements(state, touched.expected)
        if not wrong:
            return state
        if attempt == READ_AGAIN:
            break
        time.sleep(pause_s)
        again_accounts = sorted({k[1] for k in wrong if k[0] != "slot"})
        again_slots = sorted({(k[1], k[2]) for k in wrong if k[0] == "slot"})
        state.accounts.update(_accounts(rpc, again_accounts, at))
        state.slots.update(_slots(rpc, again_slots, at))
    key = wrong[0]
    what = (f"storage slot 0x{key[2].hex()}" if key[0] == "slot"
            else "existence" if key[0] == "gone" else key[0])
    raise ChainMismatch(
        f"block {head.number} ({head.hash}): 0x{key[1].hex()}'s {what} read from the node "
        f"({_shown(_value(state, key))}) disagrees with the block's trace "
        f"({_shown(touched.expected[key])}) after {READ_AGAIN + 1} reads; stopping without "
        "publishing the block (is the node synced and consistent?)")


def _shown(value: Any) -> str:
    if isinstance(value, bytes):
        return f"{len(value)} bytes of code"
    return hex(value) if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _value(state: State, key: tuple) -> Any:
    if key[0] == "slot":
        return state.slots[(key[1], key[2])]
    account, code = state.accounts[key[1]]
    if key[0] == "gone":
        return not state.exists(key[1])
    return {"balance": account.balance, "nonce": account.nonce, "code": code}[key[0]]


def _disagreements(state: State, expected: dict[tuple, Any]) -> list[tuple]:
    return [key for key, want in expected.items() if _value(state, key) != want]


def _accounts(rpc: EthRpc, addresses: list[bytes], at: dict
              ) -> dict[bytes, tuple[Account, bytes]]:
    calls: list[tuple[str, list[Any]]] = []
    for a in addresses:
        shown = "0x" + a.hex()
        calls += [("eth_getBalance", [shown, at]), ("eth_getTransactionCount", [shown, at]),
                  ("eth_getCode", [shown, at])]
    answers = _batched(rpc, calls)
    out = {}
    for i, a in enumerate(addresses):
        balance, nonce, code = answers[3 * i:3 * i + 3]
        code = _hex_bytes(code, "eth_getCode's answer")
        out[a] = (Account(to_int(nonce, "nonce"), to_int(balance, "balance"),
                          keccak256(code) if code else EMPTY_CODE_HASH), code)
    return out


def _slots(rpc: EthRpc, slots: list[Slot], at: dict) -> dict[Slot, int]:
    answers = _batched(rpc, [("eth_getStorageAt", ["0x" + a.hex(), "0x" + s.hex(), at])
                             for a, s in slots])
    return {key: to_int(word, "a storage word") for key, word in zip(slots, answers,
                                                                       strict=True)}


def _batched(rpc: EthRpc, calls: Iterable[tuple[str, list[Any]]]) -> list[Any]:
    calls = list(calls)
    chunks = [calls[i:i + BATCH_CALLS] for i in range(0, len(calls), BATCH_CALLS)]
    if len(chunks) <= 1:
        return rpc.batch_values(chunks[0]) if chunks else []
    # The node answers a batch while the next is encoded and sent: a block's thousands of
    # reads take the time of the node's work, not of every round trip one after another.
    with ThreadPoolExecutor(min(BATCHES_AT_ONCE, len(chunks)),
                            thread_name_prefix="chain-read") as pool:
        return [r for part in pool.map(rpc.batch_values, chunks) for r in part]
