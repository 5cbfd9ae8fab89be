"""Writes chain_tables.json, the known answers of a chain's state tables (morphogen/chain/
state.py): accounts, storage and code of a few made-up accounts at one block, built and joined
as the follower builds them, with a fixed owner key, fixed random choices and a fixed time, and
the answers the wallet's endpoint gives from them:

    PYTHONPATH=. python tests/vectors/chain_tables.py

The file holds the owner's public key, the block, the matrix's page count and its pages that
are not all zero (index -> hex without the page's trailing zero bytes), the party tables a
snapshot of it names, the accounts (their code's hash and storage; the code is in the answers
to eth_getCode), and `rpc`: JSON-RPC requests
with the result morphogen/wallet's endpoint answers and the requests it sends the parties for
them once every descriptor is read (`shape`: [party table, queries of three keys] of each,
sorted: what a party sees). The code
covers no code, code of one chunk and of three, two accounts sharing code, and code past
EIP-170's cap, which costs a second request. tests/unit/test_chain_vectors.py checks every
field with the project's code; the TypeScript client (clients/js) answers the same requests
from the same pages with the same shapes.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from morphogen.chain.export import StateRecords
from morphogen.chain.state import (
    Account,
    account_record,
    code_records,
    keccak256,
    storage_records,
)
from morphogen.chain.tables import build_chain_tables
from morphogen.chain.token_code import asm, token_code, token_storage
from morphogen.keyword.build import KeywordTable
from morphogen.keyword.descriptor import Anchor, tables_of
from morphogen.keyword.signing import public_bytes

HERE = Path(__file__).resolve().parent
OWNER = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"morphogen chain vector owner")
                                             .digest())
ANCHOR = Anchor(31337, 1234, "0x" + "cd" * 32)
CREATED = 1_800_000_000
SEED = 47


def accounts() -> list[dict]:
    """The accounts: address, nonce, balance, code, storage {slot: word}."""
    rng = random.Random("morphogen chain vector accounts")
    shared = rng.randbytes(100)
    out = []
    for nonce, balance, code, words in [
        (7, 10**21 + 12345, b"", 0),                 # a wallet
        (0, 2**255 + 1, b"", 0),                     # a balance past 2**53 and 2**64
        (2**64 - 1, 0, b"", 0),                      # the largest nonce
        (1, 5, shared, 3),                           # code of one chunk
        (1, 0, shared, 2),                           # the same code, other storage
        (1, 10**18, rng.randbytes(3000), 4),         # three chunks
        (1, 0, rng.randbytes(25 * 1020 + 100), 1),   # past EIP-170: 26 chunks
    ]:
        storage = {0: rng.randrange(1, 2**256)} if words else {}
        for _ in range(words - 1):
            storage[int.from_bytes(keccak256(rng.randbytes(32)))] = rng.randrange(1, 2**64)
        out.append({"address": rng.randbytes(20), "nonce": nonce, "balance": balance,
                    "code": code, "storage": storage})
    # what eth_call runs: a token (balanceOf, totalSupply) and a contract that calls it
    token, reader = rng.randbytes(20), rng.randbytes(20)
    balances = {out[i]["address"]: rng.randrange(1, 2**96) for i in (0, 1)}
    out.append({"address": token, "nonce": 1, "balance": 0, "code": token_code(),
                "storage": token_storage(balances)})
    out.append({"address": reader, "nonce": 1, "balance": 0, "code": reader_code(token),
                "storage": {}})
    return out


def reader_code(token: bytes) -> bytes:
    """Any call with a holder's address at byte 4: twice the token's balanceOf(holder), read
    with STATICCALL (reverts where the token does)."""
    return asm(bytes.fromhex("70a08231"), b"\xe0", "SHL", b"\0", "MSTORE",
                b"\4", "CALLDATALOAD", b"\4", "MSTORE",
                b"\x20", b"\0", b"\x24", b"\0", token, "GAS", "STATICCALL",
                "ISZERO", ("jump", "failed"), "JUMPI",
                b"\0", "MLOAD", b"\2", "MUL", b"\0", "MSTORE", b"\x20", b"\0", "RETURN",
                "@failed", b"\0", "DUP1", "REVERT")


def built() -> tuple[KeywordTable, list[dict]]:
    """The joined tables as the owner built them, and the accounts they hold."""
    accs = accounts()
    codes = {a["code"] for a in accs if a["code"]}
    records = StateRecords(
        [account_record(a["address"], Account(a["nonce"], a["balance"], keccak256(a["code"])))
         for a in accs],
        [r for a in accs for r in storage_records(a["address"], a["storage"])],
        [r for code in sorted(codes) for r in code_records(code)])
    table = build_chain_tables(records, OWNER, ANCHOR, room=1.0, min_records=16, seed=SEED,
                               created=CREATED)
    return table, accs


def questions(accs: list[dict]) -> list[tuple[str, list]]:
    rng = random.Random("morphogen chain vector questions")
    absent = "0x" + rng.randbytes(20).hex()
    out: list[tuple[str, list]] = [("eth_chainId", []), ("eth_blockNumber", [])]
    for a in [*accs, {"address": bytes.fromhex(absent[2:]), "storage": {}}]:
        addr = "0x" + a["address"].hex()
        out += [("eth_getBalance", [addr, "latest"]), ("eth_getTransactionCount", [addr]),
                ("eth_getCode", [addr, "latest"])]
        for slot in [*a["storage"], 5]:
            out.append(("eth_getStorageAt", [addr, hex(slot), "latest"]))
    out.append(("eth_getBalance", ["0x" + accs[0]["address"].hex(), hex(ANCHOR.number)]))
    out.append(("eth_getBalance", ["0x" + accs[0]["address"].hex(), {"blockHash": ANCHOR.hash}]))
    holder, other = ("0x" + accs[i]["address"].hex() for i in (0, 1))
    token, reader = ("0x" + a["address"].hex() for a in accs[-2:])
    word = "000000000000000000000000"
    out += [
        ("eth_call", [{"to": token, "data": "0x70a08231" + word + holder[2:]}, "latest"]),
        ("eth_call", [{"to": token, "data": "0x18160ddd"}, hex(ANCHOR.number)]),
        ("eth_call", [{"from": holder, "to": reader, "data": "0x12345678" + word + other[2:]}]),
        ("eth_call", [{"to": token, "data": "0xdeadbeef"}, "latest"]),  # reverts
        ("eth_estimateGas", [{"from": holder, "to": token,
                              "data": "0x70a08231" + word + other[2:]}]),
    ]
    return out


def answers(table: KeywordTable, accs: list[dict]) -> list[dict]:
    """What the wallet's endpoint answers, and what it asks the parties, question by question."""
    from morphogen.wallet.evm import CallService
    from morphogen.wallet.jsonrpc import Endpoint
    from morphogen.wallet.state import PrivateState
    from tests.unit._kw import TablePir

    out = []
    service = None
    try:
        for method, params in questions(accs):
            pir = TablePir(table.pages)
            state = PrivateState(pir, public_bytes(OWNER.public_key()))
            state.refresh()  # every descriptor read: what is left is the question's own
            pir.requests.clear()
            calls = None
            if method in ("eth_call", "eth_estimateGas"):  # a fresh call service: nothing read
                if service is not None:
                    service.close()
                service = CallService(state, processes=1)
                calls = service.calls
            reply = json.loads(Endpoint(state, calls=calls).handle(json.dumps(
                {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()))
            assert "result" in reply or method == "eth_call", reply
            shape = sorted([t, -(-len(p) // 3)] for t, p, _ in pir.requests)
            answer = {"result": reply["result"]} if "result" in reply else {
                "error": reply["error"]}
            out.append({"method": method, "params": params, **answer, "shape": shape})
    finally:
        if service is not None:
            service.close()
    return out


def document() -> dict:
    table, accs = built()
    pages = table.pages
    nonzero = {i: pages[i].tobytes().rstrip(b"\0").hex() for i in np.flatnonzero(pages.any(axis=1))}
    return {
        "public_key": public_bytes(OWNER.public_key()).hex(),
        "anchor": ANCHOR.to_dict(),
        "num_pages": len(pages),
        "pages": {str(i): h for i, h in nonzero.items()},
        "tables": tables_of(pages),
        "accounts": [{"address": "0x" + a["address"].hex(), "nonce": str(a["nonce"]),
                      "balance": str(a["balance"]), "code_hash": "0x" + keccak256(a["code"]).hex(),
                      "storage": {hex(s): hex(w) for s, w in a["storage"].items()}}
                     for a in accs],
        "rpc": answers(table, accs),
    }


def main() -> None:
    out = HERE / "chain_tables.json"
    out.write_text(json.dumps(document(), indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
