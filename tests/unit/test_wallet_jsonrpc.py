"""The wallet endpoint's JSON-RPC layer over a stand-in state: formats, params, blocks, batches,
errors, the upstream, and the HTTP server (CORS, methods, sizes) on loopback. The state reads
themselves, through two real parties, are tests/integration/test_wallet_rpc.py's."""

from __future__ import annotations

import json

import httpx
import pytest

from morphogen.chain.state import Account, keccak256
from morphogen.client import PirUnavailable
from morphogen.keyword import KeywordIntegrityError, StaleTableError
from morphogen.wallet import Endpoint, RpcServer, Served
from morphogen.wallet.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    LIMIT_EXCEEDED,
    METHOD_NOT_FOUND,
    NOT_SERVED,
    PARSE_ERROR,
    UNAVAILABLE,
)

HEAD = Served(31337, 0x1F, "0x" + "ab" * 32, 7, 1_700_000_000)
ALICE = "0x" + "11" * 20
CODE = bytes.fromhex("6001600055")


class FakeState:
    """What PrivateState answers, from a dict; `fail` raises instead."""

    def __init__(self) -> None:
        self.accounts_ = {bytes.fromhex(ALICE[2:]): Account(5, 10**18 + 1, keccak256(CODE))}
        self.words = {(bytes.fromhex(ALICE[2:]), (3).to_bytes(32, "big")): 0x2A}
        self.fail: Exception | None = None
        self.reads = 0

    def _check(self) -> None:
        self.reads += 1
        if self.fail is not None:
            raise self.fail

    def head(self) -> Served:
        self._check()
        return HEAD

    def accounts(self, addresses):
        self._check()
        return [self.accounts_.get(bytes(a)) for a in addresses], HEAD

    def storage(self, pairs):
        self._check()
        return [self.words.get((bytes(a), bytes(s)), 0) for a, s in pairs], HEAD

    def code(self, address):
        self._check()
        return (CODE if bytes(address) in self.accounts_ else b""), HEAD

    def current(self) -> Served:
        return self.head()

    def asked(self, addresses=()) -> None:
        pass

    def cached_account(self, address):
        return None  # nothing read before: every read is a lookup here


def call(endpoint: Endpoint, method: str, *params, rid=1):
    body = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": list(params)})
    return json.loads(endpoint.handle(body.encode()))


@pytest.fixture
def state():
    return FakeState()


@pytest.fixture
def endpoint(state):
    return Endpoint(state)


def test_answers_have_a_nodes_formats(endpoint):
    assert call(endpoint, "eth_chainId")["result"] == "0x7a69"
    assert call(endpoint, "net_version")["result"] == "31337"
    assert call(endpoint, "eth_blockNumber")["result"] == "0x1f"
    assert call(endpoint, "eth_getBalance", ALICE, "latest")["result"] == hex(10**18 + 1)
    assert call(endpoint, "eth_getTransactionCount", ALICE, "pending")["result"] == "0x5"
    assert call(endpoint, "eth_getCode", ALICE, "latest")["result"] == "0x6001600055"
    word = call(endpoint, "eth_getStorageAt", ALICE, "0x3", "latest")["result"]
    assert word == "0x" + "00" * 31 + "2a"
    nobody = "0x" + "22" * 20
    assert call(endpoint, "eth_getBalance", nobody, "latest")["result"] == "0x0"
    assert call(endpoint, "eth_getTransactionCount", nobody)["result"] == "0x0"
    assert call(endpoint, "eth_getCode", nobody, "latest")["result"] == "0x"
    assert call(endpoint, "eth_getStorageAt", nobody, "0x0", "latest")["result"] == "0x" + "00" * 32
    # checksummed or upper-case addresses, slots as full words, the id echoed
    upper = "0x" + ALICE[2:].upper()
    assert call(endpoint, "eth_getBalance", upper, "latest", rid="x")["id"] == "x"
    assert call(endpoint, "eth_getStorageAt", ALICE, "0x" + "00" * 31 + "03", "latest")[
        "result"] == word


def test_the_served_block_by_number_hash_or_object_and_no_other(endpoint):
    for block in ("0x1f", HEAD.hash, {"blockNumber": "0x1f"}, {"blockHash": HEAD.hash}):
        assert call(endpoint, "eth_getBalance", ALICE, block)["result"] == hex(10**18 + 1)
    for block in ("0x1e", "earliest", "safe", "finalized", {"blockHash": "0x" + "cd" * 32}):
        err = call(endpoint, "eth_getBalance", ALICE, block)["error"]
        assert err["code"] == NOT_SERVED and "no --upstream" in err["message"]


@pytest.mark.parametrize("method, params, says", [
    ("eth_getBalance", [], "takes 1 to 2 params"),
    ("eth_getBalance", [ALICE, "latest", 3], "takes 1 to 2 params"),
    ("eth_getBalance", [123, "latest"], "address"),
    ("eth_getBalance", ["0x1234", "latest"], "20 bytes"),
    ("eth_getBalance", ["0x" + "zz" * 20, "latest"], "hex"),
    ("eth_getBalance", [ALICE, "0x01"], "leading zeros"),
    ("eth_getBalance", [ALICE, 31], "tag, a hex number"),
    ("eth_getBalance", [ALICE, {"blockHash": "0x12"}], "64 hex"),
    ("eth_getStorageAt", [ALICE, "0x" + "1" * 65, "latest"], "at most 32 bytes"),
    ("eth_getStorageAt", [ALICE, 5, "latest"], "slot"),
    ("eth_getCode", [{"a": 1}], "address"),
    ("eth_blockNumber", ["latest"], "takes 0 params"),
])
def test_bad_params_are_invalid_params_naming_the_method(endpoint, state, method, params, says):
    err = call(endpoint, method, *params)["error"]
    assert err["code"] == INVALID_PARAMS
    assert err["message"].startswith(method) and says in err["message"]
    assert state.reads == 0  # refused before anything is asked


def test_envelopes_batches_and_notifications(endpoint):
    assert json.loads(endpoint.handle(b"{nope"))["error"]["code"] == PARSE_ERROR
    assert json.loads(endpoint.handle(b"\xff\xfe"))["error"]["code"] == PARSE_ERROR
    for bad in ([1], "x", {"jsonrpc": "1.0", "id": 1, "method": "eth_chainId"},
                {"jsonrpc": "2.0", "id": 1}, {"jsonrpc": "2.0", "id": [], "method": "m"}):
        answer = json.loads(endpoint.handle(json.dumps(bad).encode()))
        answer = answer[0] if isinstance(answer, list) else answer
        assert answer["error"]["code"] == INVALID_REQUEST
    assert json.loads(endpoint.handle(b"[]"))["error"]["code"] == INVALID_REQUEST
    params = {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": {"a": 1}}
    assert json.loads(endpoint.handle(json.dumps(params).encode()))["error"]["code"] == \
        INVALID_PARAMS
    batch = [{"jsonrpc": "2.0", "id": i, "method": "eth_getBalance", "params": [ALICE, "latest"]}
             for i in range(3)] + [{"jsonrpc": "2.0", "method": "eth_chainId"}, 7]
    answers = json.loads(endpoint.handle(json.dumps(batch).encode()))
    assert [a.get("id") for a in answers] == [0, 1, 2, None]  # the notification has none
    assert answers[-1]["error"]["code"] == INVALID_REQUEST
    assert endpoint.handle(b'{"jsonrpc": "2.0", "method": "eth_chainId"}') is None
    big = json.dumps([{"jsonrpc": "2.0", "id": i, "method": "eth_chainId"}
                      for i in range(1000)]).encode()
    err = json.loads(endpoint.handle(big))["error"]
    assert err["code"] == LIMIT_EXCEEDED and "1000" in err["message"]
    assert call(endpoint, "eth_chainId")["result"] == "0x7a69"  # still serving


def test_unserved_methods_are_named_or_forwarded(state):
    err = call(Endpoint(state), "eth_sendRawTransaction", "0x00")["error"]
    assert err["code"] == METHOD_NOT_FOUND and "eth_sendRawTransaction" in err["message"]
    seen = []

    def forward(request):
        seen.append(request)
        return {"jsonrpc": "2.0", "id": request["id"], "result": "0xfeed"}

    up = Endpoint(state, forward=forward)
    assert call(up, "eth_sendRawTransaction", "0x00", rid=9) == {
        "jsonrpc": "2.0", "id": 9, "result": "0xfeed"}
    assert call(up, "eth_getBalance", ALICE, "0x3")["result"] == "0xfeed"  # another block
    assert [r["method"] for r in seen] == ["eth_sendRawTransaction", "eth_getBalance"]
    assert call(up, "eth_getBalance", ALICE, "latest")["result"] == hex(10**18 + 1)  # private
    assert len(seen) == 2

    def down(request):
        raise httpx.ConnectError("refused")

    err = call(Endpoint(state, forward=down), "eth_gasPrice")["error"]
    assert err["code"] == UNAVAILABLE and "upstream" in err["message"]


@pytest.mark.parametrize("failure, says", [
    (StaleTableError("version 3 is older than 5"), "stale"),
    (KeywordIntegrityError("a page does not hash to its path"), "no verified answer"),
    (PirUnavailable("party B: connection refused"), "did not answer"),
])
def test_no_verified_fresh_answer_is_an_error_never_a_number(endpoint, state, failure, says):
    state.fail = failure
    for method, params in (("eth_getBalance", [ALICE, "latest"]), ("eth_blockNumber", []),
                           ("eth_getCode", [ALICE])):
        answer = call(endpoint, method, *params)
        assert "result" not in answer
        assert answer["error"]["code"] == UNAVAILABLE and says in answer["error"]["message"]


def test_a_bug_is_an_internal_error_without_the_request(endpoint, state, caplog):
    state.fail = ZeroDivisionError("secret 0x1111")
    err = call(endpoint, "eth_getBalance", ALICE, "latest")["error"]
    assert err["code"] == INTERNAL_ERROR and "ZeroDivisionError" in err["message"]
    assert "1111" not in err["message"] and "1111" not in caplog.text


@pytest.fixture
def server(state):
    srv = RpcServer(Endpoint(state), "127.0.0.1", 0, cors_origins=["https://dapp.example"])
    srv.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_http_post_cors_and_limits(server):
    with httpx.Client(base_url=server.url) as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "eth_getBalance", "params": [ALICE, "latest"]}
        r = http.post("/", json=body, headers={"Origin": "https://dapp.example"})
        assert r.status_code == 200 and r.json()["result"] == hex(10**18 + 1)
        assert r.headers["access-control-allow-origin"] == "https://dapp.example"
        r = http.post("/", json=body, headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in r.headers
        pre = http.options("/", headers={"Origin": "https://dapp.example",
                                         "Access-Control-Request-Method": "POST",
                                         "Access-Control-Request-Headers": "content-type"})
        assert pre.status_code == 204
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert pre.headers["access-control-allow-headers"] == "content-type"
        assert http.get("/").status_code == 405
        assert http.post("/", content=b"x" * ((1 << 20) + 1)).status_code == 413
        r = http.post("/", content=b'{"jsonrpc": "2.0", "method": "eth_chainId"}')
        assert r.status_code == 204 and r.content == b""
        assert http.post("/", json=body).json()["result"] == hex(10**18 + 1)  # still serving


def test_answers_leave_without_waiting_on_the_clients_acknowledgement(state):
    """The endpoint's connections send at once (TCP_NODELAY): a response is two writes, and
    with Nagle's algorithm the second waits for the client's delayed acknowledgement of the
    first (up to 40 ms a request on a kept-alive connection)."""
    import socket

    accepted: list[socket.socket] = []

    class Watched(RpcServer):
        def finish_request(self, request, client_address):
            accepted.append(request)
            super().finish_request(request, client_address)

    srv = Watched(Endpoint(state), "127.0.0.1", 0)
    srv.start()
    try:
        with httpx.Client(base_url=srv.url) as http:
            body = {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}
            assert "result" in http.post("/", json=body).json()
            assert accepted[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        srv.shutdown()
        srv.server_close()
