"""The Ethereum JSON-RPC methods answered from private state, with a node's exact formats.

Each method takes the request's positional params and a `PrivateState`, and returns the JSON
value of the result or raises one of the errors below (jsonrpc.py turns them into JSON-RPC
errors). A block parameter may be `latest` or `pending` (the block the parties serve, whatever
it is), or that block's number or hash (EIP-1898 objects too); any other block is `NotServed`,
which the endpoint hands to the upstream node when there is one. (The endpoint answers
eth_getTransactionCount's `pending` with the transactions sent through it counted too:
sent.py.)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from morphogen.chain.state import Account, address_bytes, word_bytes
from morphogen.wallet.state import PrivateState
from morphogen.wallet.versions import Served

_QUANTITY = re.compile(r"0x(0|[1-9a-fA-F][0-9a-fA-F]*)")
_HASH = re.compile(r"0x[0-9a-fA-F]{64}")
SERVED_TAGS = ("latest", "pending")
CLIENT_VERSION = "morphogen-rpc/1 (private state reads over two PIR parties)"
OTHER_TAGS = ("earliest", "safe", "finalized")


class InvalidParams(ValueError):
    """The params do not fit the method (JSON-RPC -32602)."""


class NotServed(LookupError):
    """Not answerable privately here: another block, or a method this endpoint does not serve
    (the upstream's, where there is one)."""


class Wanted:
    """A block parameter: any served block, or one number or hash."""

    def __init__(self, number: int | None = None, block_hash: str | None = None) -> None:
        self.number, self.hash = number, block_hash

    def check(self, served: Served) -> None:
        if self.number is not None and self.number != served.number:
            raise NotServed(f"block {hex(self.number)} is not the block served here "
                            f"({hex(served.number)})")
        if self.hash is not None and self.hash.lower() != served.hash.lower():
            raise NotServed(f"block {self.hash} is not the block served here ({served.hash})")


def quantity(value: Any, what: str) -> int:
    if not isinstance(value, str) or not _QUANTITY.fullmatch(value):
        raise InvalidParams(f"{what} must be a hex quantity such as 0x1a (no leading zeros)")
    return int(value, 16)


def block_param(value: Any) -> Wanted:
    """`latest`/`pending`, a number, or {"blockNumber"} / {"blockHash"} (EIP-1898)."""
    if value is None or value in SERVED_TAGS:
        return Wanted()
    if value in OTHER_TAGS:
        raise NotServed(f"block {value!r} is not served privately (only the latest block is)")
    if isinstance(value, str):
        if _HASH.fullmatch(value):
            return Wanted(block_hash=value)
        return Wanted(number=quantity(value, "the block"))
    if isinstance(value, dict):
        if set(value) - {"blockHash", "blockNumber", "requireCanonical"}:
            raise InvalidParams("a block object has blockHash or blockNumber")
        if "blockHash" in value and "blockNumber" not in value:
            h = value["blockHash"]
            if not isinstance(h, str) or not _HASH.fullmatch(h):
                raise InvalidParams("blockHash must be 0x and 64 hex digits")
            return Wanted(block_hash=h)
        if "blockNumber" in value and "blockHash" not in value:
            return block_param(value["blockNumber"])
        raise InvalidParams("a block object has one of blockHash and blockNumber")
    raise InvalidParams("the block must be a tag, a hex number or a block object")


def _params(params: list, least: int, most: int, method: str) -> list:
    if not least <= len(params) <= most:
        want = str(least) if least == most else f"{least} to {most}"
        raise InvalidParams(f"{method} takes {want} params, got {len(params)}")
    return params + [None] * (most - len(params))


def _address(value: Any) -> bytes:
    if not isinstance(value, str):
        raise InvalidParams("an address is a 0x-hex string of 20 bytes")
    try:
        return address_bytes(value)
    except ValueError as exc:
        raise InvalidParams(str(exc)) from None


def _slot(value: Any) -> bytes:
    if not isinstance(value, str):
        raise InvalidParams("a storage slot is a 0x-hex string of at most 32 bytes")
    try:
        return word_bytes(value, "a storage slot")
    except ValueError as exc:
        raise InvalidParams(str(exc)) from None


def _account(state: PrivateState, params: list, method: str) -> Account | None:
    """The account of (address, block) params, at the served block."""
    address, block = _params(params, 1, 2, method)
    key, wanted = _address(address), block_param(block)
    state.asked([key])
    if wanted.number is None and wanted.hash is None:
        found = state.cached_account(key)  # read at the block served now: no lookup
        if found is not None:
            return found[0]
    (account,), served = state.accounts([key])
    wanted.check(served)
    return account


def eth_get_balance(state: PrivateState, params: list) -> str:
    account = _account(state, params, "eth_getBalance")
    return hex(0 if account is None else account.balance)


def eth_get_transaction_count(state: PrivateState, params: list) -> str:
    account = _account(state, params, "eth_getTransactionCount")
    return hex(0 if account is None else account.nonce)


def eth_get_storage_at(state: PrivateState, params: list) -> str:
    address, slot, block = _params(params, 2, 3, "eth_getStorageAt")
    key, index, wanted = _address(address), _slot(slot), block_param(block)
    (word,), served = state.storage([(key, index)])
    wanted.check(served)
    return "0x" + word.to_bytes(32, "big").hex()


def eth_get_code(state: PrivateState, params: list) -> str:
    address, block = _params(params, 1, 2, "eth_getCode")
    key, wanted = _address(address), block_param(block)
    code, served = state.code(key)
    wanted.check(served)
    return "0x" + code.hex()


def eth_block_number(state: PrivateState, params: list) -> str:
    _params(params, 0, 0, "eth_blockNumber")
    return hex(state.current().number)


def eth_chain_id(state: PrivateState, params: list) -> str:
    _params(params, 0, 0, "eth_chainId")
    return hex(state.current().chain_id)


def net_version(state: PrivateState, params: list) -> str:
    _params(params, 0, 0, "net_version")
    return str(state.current().chain_id)


def web3_client_version(state: PrivateState, params: list) -> str:
    """This endpoint's own name: libraries ask it to see that an endpoint is up."""
    _params(params, 0, 0, "web3_clientVersion")
    return CLIENT_VERSION


# The methods answered here, from private state; every other method is NotServed.
METHODS: dict[str, Callable[[PrivateState, list], Any]] = {
    "eth_chainId": eth_chain_id,
    "net_version": net_version,
    "web3_clientVersion": web3_client_version,
    "eth_blockNumber": eth_block_number,
    "eth_getBalance": eth_get_balance,
    "eth_getTransactionCount": eth_get_transaction_count,
    "eth_getStorageAt": eth_get_storage_at,
    "eth_getCode": eth_get_code,
}
