"""The chain tables' known answers (tests/vectors/chain_tables.json), shared with the
TypeScript client: the project builds the same tables and gives the same answers, with the same
requests to the parties, and the answers are the accounts the tables were built from."""

import json
from pathlib import Path

import numpy as np

from morphogen.chain.state import keccak256
from morphogen.constants import PAGE_SIZE
from morphogen.keyword.descriptor import tables_of
from tests.vectors import chain_tables

VECTORS = json.loads(
    (Path(__file__).resolve().parents[1] / "vectors" / "chain_tables.json").read_text())


def test_the_project_rebuilds_the_same_tables_and_answers():
    assert chain_tables.document() == VECTORS


def test_the_pages_hold_the_three_tables_at_one_block():
    pages = np.zeros((VECTORS["num_pages"], PAGE_SIZE), np.uint8)
    for i, h in VECTORS["pages"].items():
        raw = bytes.fromhex(h)
        pages[int(i), :len(raw)] = np.frombuffer(raw, np.uint8)
    assert tables_of(pages) == VECTORS["tables"]
    assert {t["name"].split(".")[0] for t in VECTORS["tables"]} == {"accounts", "storage", "code"}


def test_the_answers_are_the_accounts_the_tables_hold():
    rpc = VECTORS["rpc"]
    accounts = {a["address"]: a for a in VECTORS["accounts"]}
    lengths = []
    for r in rpc:
        a = accounts.get(r["params"][0]) if r["params"] and isinstance(r["params"][0], str) \
            else None
        if r["method"] == "eth_getBalance":
            assert int(r["result"], 16) == (int(a["balance"]) if a else 0)
        elif r["method"] == "eth_getTransactionCount":
            assert int(r["result"], 16) == (int(a["nonce"]) if a else 0)
        elif r["method"] == "eth_getCode":
            code = bytes.fromhex(r["result"][2:])
            assert "0x" + keccak256(code).hex() == (a["code_hash"] if a else
                                                    "0x" + keccak256(b"").hex())
            lengths.append(len(code))
        elif r["method"] == "eth_getStorageAt":
            word = a["storage"].get(r["params"][1], "0x0") if a else "0x0"
            assert int(r["result"], 16) == int(word, 16) and len(r["result"]) == 66
    # no code, one chunk, three, and past EIP-170's 24,576 bytes (a second code request)
    assert {0, 100, 3000, 25 * 1020 + 100} <= set(lengths)
    longest = next(r for r in rpc if r["method"] == "eth_getCode"
                   and len(r["result"]) == 2 + 2 * (25 * 1020 + 100))
    assert longest["shape"] == [["accounts.data", 1], ["code.data", 1], ["code.data", 32]]


def test_the_calls_answer_what_the_token_holds_and_pad_their_rounds():
    """eth_call and eth_estimateGas of the vector's token (and of a contract calling it), as
    the endpoint's EVM answers them: the storage's words, and each call's rounds of lookups
    raised to a bucket (1, 2, 4, 8...): the JavaScript client's calls are held to the same."""
    token, reader = VECTORS["accounts"][-2:]
    calls = [r for r in VECTORS["rpc"] if r["method"] in ("eth_call", "eth_estimateGas")]
    holder, other = (VECTORS["accounts"][i]["address"] for i in (0, 1))

    def word(address: str) -> int:
        slot = keccak256(bytes(12) + bytes.fromhex(address[2:]) + bytes(32))
        return int(token["storage"][hex(int.from_bytes(slot))], 16)

    balance, supply, twice, reverted, estimate = calls
    assert int(balance["result"], 16) == word(holder)
    assert int(supply["result"], 16) == int(token["storage"]["0x2"], 16) \
        == word(holder) + word(other)
    assert int(twice["result"], 16) == 2 * word(other)
    assert twice["params"][0]["to"] == reader["address"]
    assert reverted["error"] == {"code": 3, "message": "execution reverted", "data": "0x"}
    assert 21_000 < int(estimate["result"], 16) < 30_000
    for r in calls:
        rounds = sum(1 for t, _ in r["shape"] if t == "accounts.data")
        assert rounds in (1, 2, 4, 8) and ["accounts.data", 4] in r["shape"], r
