"""A token's runtime code, small enough to read: what `morphogen demo --web` and the chain's
known-answer vectors (tests/vectors/chain_tables.py) give eth_call to run.

The code answers ERC-20's reads: `balanceOf(address)` (the word at keccak(holder . 0), as
Solidity lays out a `mapping(address => uint256)` in slot 0), `totalSupply()` (slot 2),
`symbol()` and `decimals()` (18); anything else reverts with no data. It has no writes: a
state built with `token_storage` is the token's whole state.
"""

from __future__ import annotations

from collections.abc import Mapping

from morphogen.chain.state import keccak256

_OPS = {"STOP": 0x00, "MUL": 0x02, "EQ": 0x14, "ISZERO": 0x15, "SHL": 0x1B, "SHR": 0x1C,
        "SHA3": 0x20, "CALLDATALOAD": 0x35, "MLOAD": 0x51, "MSTORE": 0x52, "SLOAD": 0x54,
        "JUMPI": 0x57, "GAS": 0x5A, "JUMPDEST": 0x5B, "DUP1": 0x80, "RETURN": 0xF3,
        "STATICCALL": 0xFA, "REVERT": 0xFD}

TOTAL_SUPPLY_SLOT = 2


def asm(*parts: str | bytes | tuple[str, str]) -> bytes:
    """EVM code from opcode names, pushed bytes (PUSHn of a bytes part), labels ("@name": a
    JUMPDEST) and jumps to them (("jump", name): PUSH1 of the label's offset)."""
    labels: dict[str, int] = {}
    code = bytearray()
    for resolve in (False, True):  # the second pass knows every label's offset
        code = bytearray()
        for part in parts:
            if isinstance(part, bytes):
                if not 1 <= len(part) <= 32:
                    raise ValueError("a push is 1 to 32 bytes")
                code += bytes([0x5F + len(part)]) + part
            elif isinstance(part, tuple):
                code += bytes([0x60, labels.get(part[1], 0) if resolve else 0])
            elif part.startswith("@"):
                labels[part[1:]] = len(code)
                code.append(_OPS["JUMPDEST"])
            else:
                code.append(_OPS[part])
    if max(labels.values(), default=0) > 0xFF:
        raise ValueError("labels past byte 255 need a longer push")
    return bytes(code)


def _returned_word() -> tuple[str | bytes, ...]:
    return (b"\0", "MSTORE", b"\x20", b"\0", "RETURN")


def token_code(symbol: str = "DEMO") -> bytes:
    """The token's runtime code (the module docstring's reads)."""
    name = symbol.encode()
    if not 1 <= len(name) <= 32:
        raise ValueError("a symbol is 1 to 32 bytes")
    selectors = {"balance": "70a08231", "supply": "18160ddd", "symbol": "95d89b41",
                 "decimals": "313ce567"}
    dispatch: list[str | bytes | tuple[str, str]] = [b"\0", "CALLDATALOAD", b"\xe0", "SHR"]
    for label, selector in selectors.items():
        dispatch += ["DUP1", bytes.fromhex(selector), "EQ", ("jump", label), "JUMPI"]
    return asm(
        *dispatch, b"\0", "DUP1", "REVERT",
        "@balance", b"\4", "CALLDATALOAD", b"\0", "MSTORE", b"\0", b"\x20", "MSTORE",
        b"\x40", b"\0", "SHA3", "SLOAD", *_returned_word(),
        "@supply", bytes([TOTAL_SUPPLY_SLOT]), "SLOAD", *_returned_word(),
        # an ABI string: its offset, its length, its bytes
        "@symbol", b"\x20", b"\0", "MSTORE", bytes([len(name)]), b"\x20", "MSTORE",
        name.ljust(32, b"\0"), b"\x40", "MSTORE", b"\x60", b"\0", "RETURN",
        "@decimals", b"\x12", *_returned_word())


def balance_slot(holder: bytes) -> int:
    """The storage slot of `holder`'s balance."""
    return int.from_bytes(keccak256(bytes(12) + holder + bytes(32)))


def token_storage(balances: Mapping[bytes, int]) -> dict[int, int]:
    """The token's storage for these balances (holder -> amount), its total supply with them."""
    storage = {balance_slot(h): amount for h, amount in balances.items() if amount}
    storage[TOTAL_SUPPLY_SLOT] = sum(balances.values())
    return storage
