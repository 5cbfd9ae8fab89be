"""A block header from anyone, checked against the block hash the owner signed: keccak256 of
the header's RLP is the hash, so fields that hash to it are the block's, whoever sent them.

The owner's signed anchor names a block by number and hash only. What a call sees of its block
(GASLIMIT, COINBASE, PREVRANDAO, TIMESTAMP) is in the header, which any node serves
(`eth_getBlockByHash`): taken from one and checked here, it is as trustworthy as the anchor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from morphogen.chain.state import keccak256


class HeaderMismatch(ValueError):
    """The header's fields do not hash to the block hash asked for."""


def _rlp(item: bytes | list) -> bytes:
    if isinstance(item, list):
        body = b"".join(_rlp(i) for i in item)
        return _length(len(body), 0xC0) + body
    if len(item) == 1 and item[0] < 0x80:
        return item
    return _length(len(item), 0x80) + item


def _length(n: int, offset: int) -> bytes:
    if n < 56:
        return bytes([offset + n])
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([offset + 55 + len(size)]) + size


def _int(value: Any) -> bytes:
    n = int(str(value), 16)
    return n.to_bytes((n.bit_length() + 7) // 8, "big")


def _raw(value: Any) -> bytes:
    return bytes.fromhex(str(value)[2:])


# the header's fields in RLP order; from baseFeePerGas on, each fork adds one (London,
# Shanghai, Cancun twice over, Cancun's beacon root, Prague's requests), present from its fork
_FIELDS = (("parentHash", _raw), ("sha3Uncles", _raw), ("miner", _raw), ("stateRoot", _raw),
           ("transactionsRoot", _raw), ("receiptsRoot", _raw), ("logsBloom", _raw),
           ("difficulty", _int), ("number", _int), ("gasLimit", _int), ("gasUsed", _int),
           ("timestamp", _int), ("extraData", _raw), ("mixHash", _raw), ("nonce", _raw))
_LATER = (("baseFeePerGas", _int), ("withdrawalsRoot", _raw), ("blobGasUsed", _int),
          ("excessBlobGas", _int), ("parentBeaconBlockRoot", _raw), ("requestsHash", _raw))


def header_hash(raw: dict) -> str:
    """The block hash of a header as a node's JSON-RPC shows it."""
    try:
        items = [conv(raw[k]) for k, conv in _FIELDS]
        for k, conv in _LATER:
            if raw.get(k) is None:
                break
            items.append(conv(raw[k]))
    except (KeyError, TypeError, ValueError) as exc:
        raise HeaderMismatch(f"a header without a usable field ({exc})") from None
    return "0x" + keccak256(_rlp(items)).hex()


@dataclass(frozen=True)
class BlockEnvironment:
    """What a call sees of its block."""

    number: int
    timestamp: int
    gas_limit: int
    coinbase: str  # 0x-hex
    prevrandao: bytes  # 32 bytes (the mixHash field since the merge)
    base_fee: int


def environment(raw: Any, block_hash: str) -> BlockEnvironment:
    """The environment of block `block_hash` from `raw`, a header a node answered:
    HeaderMismatch unless its fields hash to `block_hash`."""
    if not isinstance(raw, dict):
        raise HeaderMismatch("no header")
    if header_hash(raw).lower() != block_hash.lower():
        raise HeaderMismatch("the header's fields do not hash to the signed block hash")
    return BlockEnvironment(int(raw["number"], 16), int(raw["timestamp"], 16),
                            int(raw["gasLimit"], 16), "0x" + _raw(raw["miner"]).hex(),
                            _raw(raw["mixHash"]), int(raw.get("baseFeePerGas") or "0x0", 16))
