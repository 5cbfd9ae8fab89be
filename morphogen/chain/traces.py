"""What a block changed, from the node's traces: the cheapest source the node offers.

Each transaction's stateDiff from `trace_replayBlockTransactions` where the node answers it
(by hash; by number, checked to still be the block, where the node takes only numbers), else
`debug_traceBlockByHash` with `prestateTracer` in diff mode. `Tracer` probes them once, the
cheapest first, and keeps the one that answers. Every trace is counted against the block's
transactions, and a malformed one is a ChainError naming block and transaction. The keys a
block changes with no transaction (system contracts, withdrawals, the fee recipient) are added
here too (`_block_changes`; morphogen.chain.blocks says which).
"""

from __future__ import annotations

import logging
from typing import Any

from morphogen.chain.blocks import (
    BEACON_ROOTS_CONTRACT,
    BEACON_WINDOW,
    CONSOLIDATION_REQUESTS_CONTRACT,
    HISTORY_CONTRACT,
    HISTORY_WINDOW,
    REQUEST_SLOTS,
    TRACER,
    WITHDRAWAL_REQUESTS_CONTRACT,
    ChainMoved,
    Header,
    Touched,
    _hex_bytes,
    _number,
)
from morphogen.chain.rpc import ChainError, EthRpc, MethodMissing, RpcError, to_int
from morphogen.chain.state import address_bytes, word_bytes

log = logging.getLogger(__name__)

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


