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
        a = accounts.get(r["params"][0]) if r["params"] else None
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
