"""State exports from a real anvil agree with the node, and keyword tables built from them
answer lookups with the node's nonces, balances, code and storage."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from _kw import lookup
from chain_node import DEV_ACCOUNTS, DEV_BALANCE, running_anvil
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from morphogen.chain.export import AccountState, read_accounts, read_header, state_records
from morphogen.chain.node_export import ExportMismatch, export_from_node, verify_export
from morphogen.chain.rpc import EthRpc, quantity, to_int
from morphogen.chain.state import (
    CODE_VALUE_SIZE,
    EMPTY_CODE_HASH,
    code_chunks,
    code_key,
    code_length,
    decode_account,
    decode_storage_value,
    join_code,
    keccak256,
    storage_key,
)
from morphogen.keyword import build_table

# EIP-2935: the history contract that stores each parent block hash, predeployed by anvil
HISTORY = bytes.fromhex("0000f90827f1c53a10cb7a02335b175320002935")
SLOT, WORD = 7, int.from_bytes(bytes(range(1, 33)), "big")
# Runtime: return the word in slot 7 (PUSH1 7, SLOAD, PUSH1 0, MSTORE, PUSH1 32, PUSH1 0,
# RETURN), then bytes that are never executed, to 1,500 in all: two code chunks.
RUNTIME = (bytes.fromhex("600754" "600052" "6020" "6000" "f3") + bytes(range(256)) * 6)[:1500]
# Init code, 48 bytes, run once at deployment: PUSH32 WORD, PUSH1 7, SSTORE (slot 7 = WORD);
# then copy the runtime, which follows the init code at offset 48 = 0x30, to memory 0 and
# return it as the contract's code: PUSH2 len, DUP1, PUSH1 0x30, PUSH1 0, CODECOPY (memory 0
# <- code[0x30 : 0x30 + len]; the DUP1 leaves len for RETURN), PUSH1 0, RETURN (memory[0:len]).
INIT = (b"\x7f" + WORD.to_bytes(32, "big") + bytes.fromhex("600755")
        + b"\x61" + len(RUNTIME).to_bytes(2, "big") + bytes.fromhex("80" "6030" "6000" "39"
                                                                    "6000" "f3"))
assert len(INIT) == 0x30


def wait_receipt(rpc: EthRpc, tx: str) -> dict:
    deadline = time.monotonic() + 30
    while (receipt := rpc.call("eth_getTransactionReceipt", tx)) is None:
        assert time.monotonic() < deadline, f"{tx} not mined"
        time.sleep(0.05)
    assert receipt["status"] == "0x1", receipt
    return receipt


def node_view(rpc: EthRpc, number: int, a: AccountState) -> AccountState:
    """The account as the node answers for it at block `number`, slot by slot of the
    export's."""
    address, at = "0x" + a.address.hex(), quantity(number)
    slots = sorted(a.storage)
    answers = rpc.batch_values(
        [("eth_getTransactionCount", [address, at]), ("eth_getBalance", [address, at]),
         ("eth_getCode", [address, at])]
        + [("eth_getStorageAt", [address, f"0x{s:064x}", at]) for s in slots])
    storage = {s: to_int(w) for s, w in zip(slots, answers[3:], strict=True)}
    return AccountState(a.address, to_int(answers[0]), to_int(answers[1]),
                        bytes.fromhex(answers[2][2:]), storage)


def test_an_export_at_genesis_is_what_the_node_answers(tmp_path: Path) -> None:
    with running_anvil(chain_id=31337) as url, EthRpc(url) as rpc:
        path = tmp_path / "genesis.jsonl"
        header = export_from_node(rpc, path, sample=None)
        genesis = rpc.block(0)
        assert (header.chain_id, header.block.number) == (31337, 0)
        assert header == read_header(path)
        assert (header.block.hash, header.block.parent_hash, header.block.state_root) == (
            genesis["hash"], genesis["parentHash"], genesis["stateRoot"])
        accounts = {"0x" + a.address.hex(): a for a in read_accounts(path)}
        for address in DEV_ACCOUNTS:
            assert accounts[address] == AccountState(bytes.fromhex(address[2:]), 0, DEV_BALANCE)
        history = accounts["0x" + HISTORY.hex()]
        assert history.code and history.nonce == 0
        for account in accounts.values():
            assert node_view(rpc, 0, account) == account


def test_after_a_transfer_and_a_deployment_tables_answer_as_the_node(tmp_path: Path) -> None:
    sender, receiver = DEV_ACCOUNTS[0], DEV_ACCOUNTS[1]
    with running_anvil(chain_id=31337) as url, EthRpc(url) as rpc:
        wait_receipt(rpc, rpc.call("eth_sendTransaction",
                                   {"from": sender, "to": receiver, "value": quantity(12345)}))
        deployed = wait_receipt(rpc, rpc.call("eth_sendTransaction", {
            "from": sender, "data": "0x" + (INIT + RUNTIME).hex(), "gas": quantity(2_000_000)}))
        contract = bytes.fromhex(deployed["contractAddress"][2:])
        assert to_int(rpc.call("eth_call", {"to": deployed["contractAddress"]}, "latest")) == WORD

        path = tmp_path / "state.jsonl"
        header = export_from_node(rpc, path, sample=None)
        number = header.block.number
        assert number == rpc.block_number() == 2
        assert verify_export(rpc, path, sample=None) == len(list(read_accounts(path)))
        accounts = {a.address: a for a in read_accounts(path)}
        for account in accounts.values():
            assert node_view(rpc, number, account) == account
        assert accounts[contract].code == RUNTIME and accounts[contract].storage == {SLOT: WORD}
        assert accounts[bytes.fromhex(receiver[2:])].balance == DEV_BALANCE + 12345
        assert accounts[bytes.fromhex(sender[2:])].nonce == 2
        assert accounts[HISTORY].storage  # the parent hashes of blocks 1 and 2

        key = Ed25519PrivateKey.generate()
        records = state_records(path)
        tables = {name: build_table(stream, value_size=size, signing_key=key)
                  for name, stream, size in (("accounts", records.accounts, 72),
                                             ("storage", records.storage, 32),
                                             ("code", records.code, CODE_VALUE_SIZE))}

        def get(name: str, keys: list[bytes]) -> list[bytes | None]:
            return lookup(tables[name].pages, tables[name].descriptor, keys)

        addresses = sorted(accounts) + [b"\xee" * 20]
        found = get("accounts", addresses)
        assert found[-1] is None  # an address the chain has never seen
        at = quantity(number)
        for address, value in zip(addresses[:-1], found[:-1], strict=True):
            assert value is not None
            a = decode_account(value)
            node = node_view(rpc, number, AccountState(address, 0, 0))
            assert (a.nonce, a.balance) == (node.nonce, node.balance)
            assert a.code_hash == keccak256(node.code)
            if a.code_hash == EMPTY_CODE_HASH:
                continue
            first = get("code", [code_key(a.code_hash, 0)])[0]
            assert first is not None
            rest = get("code", [code_key(a.code_hash, i)
                                for i in range(1, code_chunks(code_length(first)))])
            assert join_code(a.code_hash, [first, *rest]) == node.code
            slots = sorted(accounts[address].storage) + [2**255]
            words = get("storage", [storage_key(address, s) for s in slots])
            for slot, word in zip(slots, words, strict=True):
                said = rpc.call("eth_getStorageAt", "0x" + address.hex(), hex(slot), at)
                assert decode_storage_value(word) == to_int(said)
        assert len(get("code", [code_key(keccak256(RUNTIME), 1)])[0] or b"") == CODE_VALUE_SIZE


def test_an_export_that_disagrees_with_the_node_is_named(tmp_path: Path) -> None:
    with running_anvil(chain_id=31337) as url, EthRpc(url) as rpc:
        path = tmp_path / "state.jsonl"
        export_from_node(rpc, path)
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines[1:], 1):
            account = json.loads(line)
            if account["address"] == DEV_ACCOUNTS[3]:
                account["balance"] = hex(DEV_BALANCE + 1)
                lines[i] = json.dumps(account)
        path.write_text("\n".join(lines) + "\n")
        with pytest.raises(ExportMismatch) as caught:
            verify_export(rpc, path, sample=None)
        text = str(caught.value)
        assert "\n" not in text and text.startswith(f"{DEV_ACCOUNTS[3]} at block 0: the "
                                                    "export's balance is ")
