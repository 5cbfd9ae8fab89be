"""Exports from a node with geth's debug dumps, against a small stand-in node on loopback that
answers in geth's shapes (decimal balances, storage words in bare hex, `next` in base64), and
a node with neither kind of dump."""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from morphogen.chain.export import AccountState, read_accounts, read_header
from morphogen.chain.node_export import ExportMismatch, export_from_node
from morphogen.chain.rpc import ChainError, EthRpc
from tests.web.server import reply_json

CODE = bytes.fromhex("600754600052602060" + "00f3")
STATE = {  # checksummed, as geth's `Address.String()` writes them
    "0x000000000000000000000000000000000000000A": (1, 10**21, b"", {}),
    "0x00000000000000000000000000000000000000bB": (0, 0, CODE, {7: 0x1234, 9: 2**255}),
    "0x00000000000000000000000000000000000000Cc": (5, 3, b"", {}),
}
BLOCK = {"number": "0x4", "hash": "0x" + "ab" * 32, "parentHash": "0x" + "cd" * 32,
         "stateRoot": "0x" + "ef" * 32}


def geth_account(address: str) -> dict[str, Any]:
    nonce, balance, code, storage = STATE[address]
    out: dict[str, Any] = {"balance": str(balance), "nonce": nonce, "root": "0x" + "00" * 32,
                           "codeHash": "0x" + "00" * 32, "address": address}
    if code:
        out["code"] = "0x" + code.hex()
    if storage:
        out["storage"] = {f"0x{s:064x}": f"{w:x}" for s, w in storage.items()}
    return out


class FakeGeth:
    def __init__(self, *, range_method: bool = True, dumps: bool = True,
                 lie_about: str | None = None) -> None:
        self.range_method, self.dumps, self.lie_about = range_method, dumps, lie_about

    def answer(self, method: str, params: list) -> Any:
        addresses = sorted(STATE, key=str.lower)
        if method == "eth_chainId":
            return "0x1"
        if method == "eth_blockNumber":
            return "0x4"
        if method == "eth_getBlockByNumber" and params[0] == "0x4":
            return BLOCK
        if method == "debug_accountRange" and self.range_method and self.dumps:
            assert params[0] == "0x4" and params[2] == 256
            start = bytes.fromhex(params[1][2:])
            rest = [a for a in addresses if bytes.fromhex(a[2:]) >= start]
            page, after = rest[:2], rest[2:3]
            out = {"root": BLOCK["stateRoot"], "accounts": {a: geth_account(a) for a in page}}
            if after:
                out["next"] = base64.b64encode(bytes.fromhex(after[0][2:])).decode()
            return out
        if method == "debug_dumpBlock" and self.dumps:
            return {"root": BLOCK["stateRoot"],
                    "accounts": {a: geth_account(a) for a in addresses}}
        if method.startswith("eth_get") and params[-1] == "0x4":
            nonce, balance, code, storage = next(v for a, v in STATE.items()
                                                 if a.lower() == params[0])
            if method == "eth_getBalance":
                return hex(balance + (params[0] == self.lie_about))
            if method == "eth_getTransactionCount":
                return hex(nonce)
            if method == "eth_getCode":
                return "0x" + code.hex()
            if method == "eth_getStorageAt":
                return f"0x{storage.get(int(params[1], 16), 0):064x}"
        raise LookupError(method)


@pytest.fixture
def fake_geth() -> Iterator[tuple[str, FakeGeth]]:
    node = FakeGeth()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the standard library's name
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            replies = [self.reply(r) for r in (body if isinstance(body, list) else [body])]
            reply_json(self, replies if isinstance(body, list) else replies[0])

        def reply(self, request: dict) -> dict:
            out = {"jsonrpc": "2.0", "id": request["id"]}
            try:
                out["result"] = node.answer(request["method"], request["params"])
            except LookupError:
                out["error"] = {"code": -32601, "message": "the method does not exist"}
            return out

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", node
    server.shutdown()
    server.server_close()


def expected() -> list[AccountState]:
    return sorted((AccountState(bytes.fromhex(a[2:]), n, b, c, s)
                   for a, (n, b, c, s) in STATE.items()), key=lambda a: a.address)


@pytest.mark.parametrize("range_method", [True, False], ids=["accountRange", "dumpBlock"])
def test_an_export_from_geth_dumps(tmp_path, fake_geth, range_method: bool) -> None:
    url, node = fake_geth
    node.range_method = range_method
    path = tmp_path / "state.jsonl"
    with EthRpc(url) as rpc:
        header = export_from_node(rpc, path, sample=None)
    assert header == read_header(path)
    assert (header.chain_id, header.block.number, header.block.hash) == (1, 4, BLOCK["hash"])
    assert list(read_accounts(path)) == expected()


def test_a_node_that_disagrees_with_its_dump_writes_nothing(tmp_path, fake_geth) -> None:
    url, node = fake_geth
    node.lie_about = "0x00000000000000000000000000000000000000cc"
    path = tmp_path / "state.jsonl"
    with EthRpc(url) as rpc, pytest.raises(ExportMismatch) as caught:
        export_from_node(rpc, path, sample=None)
    assert str(caught.value).startswith(
        "0x00000000000000000000000000000000000000cc at block 4: the export's balance is 0x3 "
        "but the node at http://127.0.0.1:")
    assert not path.exists()


def test_a_node_without_a_dump_is_named(tmp_path, fake_geth) -> None:
    url, node = fake_geth
    node.dumps = False
    with EthRpc(url) as rpc, pytest.raises(ChainError, match="has none of debug_accountRange, "
                                                             "debug_dumpBlock and anvil_dumpState"):
        export_from_node(rpc, tmp_path / "state.jsonl")
