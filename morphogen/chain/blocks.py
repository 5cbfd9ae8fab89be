"""One block as the follower reads it from the node: its header, the keys it changed
(`Touched`, found by morphogen.chain.traces), and the state after it.

The node's trace of a block says which accounts and slots its transactions changed
(morphogen.chain.traces). The block also changes state with no transaction, and those keys are
added there, from the constants here (see DESIGN.md, "Following a chain"):

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

from morphogen.chain.rpc import ChainError, EthRpc, to_int
from morphogen.chain.state import (
    EMPTY_CODE_HASH,
    Account,
    address_bytes,
    keccak256,
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
