"""The params of eth_call and eth_estimateGas: the transaction object as a `Call`, checked
before anything is read, and refused (`NotServed`) where it asks for what is not run privately
(contract creation, fees, EIP-7702 authorizations).

A `Call` is hashable: the memo of what each call read (memo.py) is keyed by it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from morphogen.chain.state import address_bytes, word_bytes
from morphogen.wallet.methods import InvalidParams, NotServed, quantity

MAX_ACCESS_LIST = 256  # addresses in a call's access list, and keys of one address
CALL_GAS = 50_000_000  # a node's default eth_call gas cap (geth RPCGasCap)


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

