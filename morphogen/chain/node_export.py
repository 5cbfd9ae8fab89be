"""A state export taken from a node, and checked against it before it is written.

Two ways to read a whole state, whichever the node has: geth's `debug_accountRange` (paged)
or `debug_dumpBlock`, which need the node's preimages of addresses and slots (geth
`--cache.preimages`: accounts and slots without one are left out of geth's dumps); or anvil's
`anvil_dumpState`, gzip'd JSON of its state at its head block. Either way the node is then
asked again, at that block, for a sample of the accounts (balance, nonce, code and every slot,
in batches) and a disagreement raises `ExportMismatch` naming the account and field: the dump
is the node's own view, the standard calls are what wallets see.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import random
from collections.abc import Iterator, Sequence
from typing import Any

from morphogen.chain.export import (
    AccountState,
    BlockRef,
    ExportHeader,
    read_accounts,
    read_header,
    write_export,
)
from morphogen.chain.rpc import ChainError, EthRpc, MethodMissing, quantity, to_int
from morphogen.chain.state import address_bytes, keccak256

DEFAULT_SAMPLE = 64
BATCH_CALLS = 100  # calls per HTTP request: under the 1,000 that geth allows by default
GETH_PAGE = 256  # geth's most accounts per debug_accountRange answer


class ExportMismatch(ChainError):
    """The node's answers disagree with what the export holds."""


def export_from_node(rpc: EthRpc, out_path: str | os.PathLike[str], *,
                     sample: int | None = DEFAULT_SAMPLE, seed: int = 0) -> ExportHeader:
    """Write the node's whole state at one block to `out_path` (see `morphogen.chain.export`)
    once `sample` of its accounts (None: all) agree with the node; returns the header."""
    chain_id = rpc.chain_id()
    number, accounts = _dump(rpc)
    block = rpc.block(number)
    ref = BlockRef(number, block["hash"], block["parentHash"], block["stateRoot"])
    header = ExportHeader(chain_id, ref)
    accounts.sort(key=lambda a: a.address)
    verify_accounts(rpc, number, accounts, sample=sample, seed=seed)
    write_export(out_path, header, accounts)
    return header


def verify_export(rpc: EthRpc, path: str | os.PathLike[str], *,
                  sample: int | None = DEFAULT_SAMPLE, seed: int = 0) -> int:
    """Check a written export against the node at its block; returns the accounts checked."""
    header = read_header(path)
    got = rpc.chain_id()
    if got != header.chain_id:
        raise ExportMismatch(f"the export is of chain {header.chain_id}, the node at "
                             f"{rpc.shown} is on chain {got}")
    return verify_accounts(rpc, header.block.number, list(read_accounts(path)), sample=sample,
                           seed=seed)


def verify_accounts(rpc: EthRpc, number: int, accounts: Sequence[AccountState], *,
                    sample: int | None = DEFAULT_SAMPLE, seed: int = 0) -> int:
    """Ask the node at block `number` for `sample` of `accounts` (None: all of them) and
    raise ExportMismatch at the first field that differs; returns how many were asked."""
    chosen = list(accounts)
    if sample is not None and sample < len(chosen):
        chosen = random.Random(seed).sample(chosen, sample)
    at = quantity(number)
    checks: list[tuple[str, list[Any], AccountState, str, Any]] = []
    for a in chosen:
        address = "0x" + a.address.hex()
        checks += [("eth_getBalance", [address, at], a, "balance", a.balance),
                   ("eth_getTransactionCount", [address, at], a, "nonce", a.nonce),
                   ("eth_getCode", [address, at], a, "code", a.code)]
        checks += [("eth_getStorageAt", [address, f"0x{slot:064x}", at], a,
                    f"storage slot 0x{slot:x}", word) for slot, word in a.storage.items()]
    for i in range(0, len(checks), BATCH_CALLS):
        part = checks[i:i + BATCH_CALLS]
        answers = rpc.batch_values([(method, params) for method, params, *_ in part])
        for (_, _, account, name, expected), answer in zip(part, answers, strict=True):
            got = _decode(answer, name)
            if got != expected:
                raise ExportMismatch(
                    f"0x{account.address.hex()} at block {number}: the export's {name} is "
                    f"{_brief(expected)} but the node at {rpc.shown} answers {_brief(got)}")
    return len(chosen)


def _decode(answer: Any, name: str) -> Any:
    if name == "code":
        if not isinstance(answer, str) or not answer.startswith("0x"):
            raise ChainError(f"eth_getCode answered {repr(answer)[:40]}, not 0x-hex")
        return bytes.fromhex(answer[2:])
    return to_int(answer, name)


def _brief(value: Any) -> str:
    if isinstance(value, bytes):
        return f"{len(value)} bytes of code hashing to 0x{keccak256(value).hex()[:16]}..."
    return hex(value)


# -- dumps -------------------------------------------------------------------------------------

def _dump(rpc: EthRpc) -> tuple[int, list[AccountState]]:
    number = rpc.block_number()
    at = quantity(number)
    try:
        return number, list(_geth_range(rpc, at))
    except MethodMissing:
        pass
    try:
        dump = rpc.call("debug_dumpBlock", at)
        return number, [_geth_account(k, v) for k, v in _accounts_of(dump, "debug_dumpBlock")]
    except MethodMissing:
        pass
    try:
        return _anvil(rpc.call("anvil_dumpState"))
    except MethodMissing:
        raise ChainError(f"the node at {rpc.shown} has none of debug_accountRange, "
                         "debug_dumpBlock and anvil_dumpState: export from a geth node with "
                         "the debug API on, or from anvil") from None


def _accounts_of(dump: Any, method: str) -> Iterator[tuple[str, dict]]:
    accounts = dump.get("accounts") if isinstance(dump, dict) else None
    if not isinstance(accounts, dict):
        raise ChainError(f"{method} answered without an \"accounts\" object")
    for key, value in accounts.items():
        if not isinstance(value, dict):
            raise ChainError(f"{method}: account {key[:44]} is not an object")
        yield value.get("address", key), value


def _geth_range(rpc: EthRpc, at: str) -> Iterator[AccountState]:
    start = "0x"
    while True:
        page = rpc.call("debug_accountRange", at, start, GETH_PAGE, False, False, False)
        yield from (_geth_account(k, v) for k, v in _accounts_of(page, "debug_accountRange"))
        following = page.get("next")
        if not following:
            return
        # geth sends `next` as Go's []byte, which JSON carries in base64
        start = "0x" + base64.b64decode(following).hex()


def _number(value: Any, what: str) -> int:
    # geth's dumps give balances in decimal and storage words as hex without 0x
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.startswith(("0x", "0X")):
        return to_int(value, what)
    if isinstance(value, str) and value.isdigit() and what == "balance":
        return int(value)
    if isinstance(value, str) and value and all(c in "0123456789abcdefABCDEF" for c in value):
        return int(value, 16)
    raise ChainError(f"the dump's {what} {repr(value)[:40]} is not a number")


def _code(value: Any) -> bytes:
    if value in (None, "", "0x"):
        return b""
    if not isinstance(value, str):
        raise ChainError(f"the dump's code {repr(value)[:40]} is not hex")
    try:
        return bytes.fromhex(value[2:] if value.startswith("0x") else value)
    except ValueError:
        raise ChainError(f"the dump's code {value[:40]!r} is not hex") from None


def _geth_account(address: str, obj: dict) -> AccountState:
    try:
        raw = address_bytes(address)
    except ValueError:
        raise ChainError(f"the dump names account {address[:44]!r}, not an address (the node "
                         "lacks its preimage?)") from None
    storage = {_number(k, "storage slot"): _number(v, "storage word")
               for k, v in (obj.get("storage") or {}).items()}
    return AccountState(raw, _number(obj.get("nonce", 0), "nonce"),
                        _number(obj.get("balance", 0), "balance"), _code(obj.get("code")),
                        {k: v for k, v in storage.items() if v})


def _anvil(result: Any) -> tuple[int, list[AccountState]]:
    if not isinstance(result, str) or not result.startswith("0x"):
        raise ChainError("anvil_dumpState answered something other than 0x-hex")
    try:
        state = json.loads(gzip.decompress(bytes.fromhex(result[2:])))
    except (ValueError, OSError) as exc:
        raise ChainError(f"anvil_dumpState's answer is not gzip'd JSON ({exc})") from None
    # the number of the head block whose state this is; the dump's "block" is anvil's block
    # environment, not the header, whose hashes come from eth_getBlockByNumber
    number = _number(state.get("best_block_number"), "best_block_number")
    return number, [_geth_account(k, v) for k, v in _accounts_of(state, "anvil_dumpState")]
