"""eth_call's pieces without an EVM: the call object's params, the buckets, a call's reads
(each asked once, pinned to its block, padded per table, shared with the calls at the same
version) and the loopback routes. The EVM over real parties is tests/integration's."""

from __future__ import annotations

import json

import pytest

from morphogen.chain.state import Account, keccak256
from morphogen.wallet.evm import CALL_GAS, CallReads, CallRoutes, bucket, call_param
from morphogen.wallet.methods import InvalidParams, NotServed
from morphogen.wallet.state import CallCache, Served

HEAD = Served(1, 9, "0x" + "ab" * 32, 4, 0)
TOKEN = bytes.fromhex("22" * 20)
CODE = bytes.fromhex("6000")


class FakeState:
    def __init__(self) -> None:
        self.asked: list[str] = []
        self.served = HEAD
        self.cache = CallCache()

    def call_cache(self, served):
        return self.cache

    def accounts(self, addresses):
        self.asked.append("accounts")
        return [Account(1, 5, keccak256(CODE)) if bytes(a) == TOKEN else None
                for a in addresses], self.served

    def storage(self, pairs):
        self.asked.append("storage")
        return [7 for _ in pairs], self.served

    def code_by_hash(self, code_hash):
        self.asked.append("code")
        return CODE, self.served

    def dummy(self, table):
        self.asked.append(f"pad {table}")


def test_buckets():
    assert [bucket(n) for n in (1, 4, 5, 8, 9, 1024, 1025)] == [4, 4, 8, 8, 16, 1024, 2048]


def test_call_params():
    c = call_param({"to": "0x" + "22" * 20, "data": "0xabcd", "value": "0x10"})
    assert (c.sender, c.data, c.value, c.gas) == ("0x" + "00" * 20, b"\xab\xcd", 16, CALL_GAS)
    assert call_param({"to": "0x" + "22" * 20, "input": "0x01", "gas": "0x5208"}).gas == 21000
    with pytest.raises(NotServed, match="without `to`"):
        call_param({"data": "0x00"})
    with pytest.raises(NotServed, match="pays for gas"):
        call_param({"to": "0x" + "22" * 20, "gasPrice": "0x1"})
    for bad in ("x", {"to": "0x12"}, {"to": "0x" + "22" * 20, "data": "0x1"},
                {"to": "0x" + "22" * 20, "value": "12"}, {"to": "0x" + "22" * 20, "bogus": 1}):
        with pytest.raises(InvalidParams):
            call_param(bad)


def _ask(reads, method, *params):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)})
    return json.loads(reads.handle(body.encode()))


def test_a_calls_reads_are_asked_once_pinned_and_padded():
    state = FakeState()
    reads = CallReads(state, HEAD)
    t = "0x" + TOKEN.hex()
    for _ in range(2):  # pyrevm asks balance, nonce and code of each account it loads
        assert _ask(reads, "eth_getBalance", t, "0x9")["result"] == "0x5"
        assert _ask(reads, "eth_getTransactionCount", t, "0x9")["result"] == "0x1"
        assert _ask(reads, "eth_getCode", t, "0x9")["result"] == "0x6000"
        assert _ask(reads, "eth_getStorageAt", t, "0x0", "0x9")["result"] == "0x" + "00" * 31 + "07"
    assert _ask(reads, "eth_getCode", "0x" + "33" * 20, "0x9")["result"] == "0x"  # no code
    assert state.asked == ["accounts", "code", "storage", "accounts"]
    reads.pad()
    assert state.asked.count("pad accounts") == 2 and state.asked.count("pad storage") == 3
    assert state.asked.count("pad code") == 3
    # the next call at this version asks nothing it already has
    state.asked.clear()
    again = CallReads(state, HEAD)
    assert _ask(again, "eth_getBalance", t, "0x9")["result"] == "0x5"
    again.pad()
    assert state.asked == []
    # another block: the run is failed, to be done again, and nothing of it kept as a failure
    state.served = Served(1, 10, "0x" + "cd" * 32, 5, 0)
    moved = CallReads(state, HEAD)
    assert "error" in _ask(moved, "eth_getStorageAt", t, "0x5", "0x9")
    assert moved.moved and moved.failure is None
    # a read at another block than the call's, or another method, is refused
    assert "error" in _ask(CallReads(state, HEAD), "eth_getBalance", t, "0x8")
    assert "error" in _ask(CallReads(state, HEAD), "eth_sendTransaction", {})


def test_routes():
    routes = CallRoutes()
    reads = object()
    token = routes.open(reads)
    assert routes.reads(f"/call/{token}") is reads
    assert routes.reads("/call/" + "0" * 32) is None and routes.reads("/") is None
    routes.close(token)
    assert routes.reads(f"/call/{token}") is None
