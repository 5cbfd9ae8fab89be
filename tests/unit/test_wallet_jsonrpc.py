"""The wallet endpoint's JSON-RPC layer over a stand-in state: formats, params, blocks, batches,
errors, the upstream, and the HTTP server (CORS, methods, sizes) on loopback. The state reads
themselves, through two real parties, are tests/integration/test_wallet_rpc.py's."""

from __future__ import annotations

import json
import subprocess
import sys

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
    # (an answer to a send that is no transaction hash asks nothing more: wallet/sent.py)
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
        r = http.post("/", content=b'{"jsonrpc": "2.0", "method": "eth_chainId"}',
                      headers={"Content-Type": "application/json"})
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


def test_only_json_from_an_allowed_host_is_run(state):
    """A web page's CORS-simple POST (text/plain, form data, no type) and a DNS-rebinding
    page's (Host: its own name) are refused before anything runs, each with a JSON-RPC error
    body; JSON naming a loopback host (any port, IPv6 too) is served, and other names only
    where allowed."""
    srv = RpcServer(Endpoint(state), "127.0.0.1", 0)
    srv.start()
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_getBalance",
                       "params": [ALICE, "latest"]}).encode()
    try:
        with httpx.Client(base_url=srv.url) as http:
            for kind in (None, "text/plain", "text/plain;charset=UTF-8",
                         "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
                r = http.post("/", content=body, headers={} if kind is None else
                              {"Content-Type": kind})
                assert r.status_code == 415, kind
                assert r.json()["error"]["code"] == INVALID_REQUEST
            assert state.reads == 0
            for host in ("evil.example", "evil.example:8545", "127.0.0.1.evil.example",
                         "localhost.evil.example", ""):
                r = http.post("/", content=body, headers={
                    "Host": host, "Content-Type": "application/json"})
                assert r.status_code in (400, 403), host  # (400: httpx sends no empty Host)
                if r.status_code == 403:
                    assert "--allowed-hosts" in r.json()["error"]["message"]
            assert http.options("/", headers={"Host": "evil.example"}).status_code == 403
            assert state.reads == 0
            for host in ("localhost", "localhost:8545", "127.0.0.1:1", "[::1]:8545",
                         "LOCALHOST"):
                r = http.post("/", content=body, headers={
                    "Host": host, "Content-Type": "application/json; charset=utf-8"})
                assert r.json()["result"] == hex(10**18 + 1), host
    finally:
        srv.shutdown()
        srv.server_close()
    srv = RpcServer(Endpoint(state), "127.0.0.1", 0, allowed_hosts=["wallet.lan"])
    srv.start()
    try:
        with httpx.Client(base_url=srv.url) as http:
            json_ = {"Content-Type": "application/json"}
            assert http.post("/", content=body, headers={**json_, "Host": "wallet.lan:80"}
                             ).json()["result"] == hex(10**18 + 1)
            assert http.post("/", content=body, headers=json_).status_code == 403
    finally:
        srv.shutdown()
        srv.server_close()


def test_any_body_however_nested_is_a_json_rpc_error(endpoint):
    for depth in (40, 5_000, 100_000):
        for opener, closer in (("[", "]"), ('{"a":', "}")):
            body = (opener * depth + "1" + closer * depth).encode()
            answer = json.loads(endpoint.handle(body))
            assert answer["error"]["code"] in (PARSE_ERROR, INVALID_REQUEST), depth
            assert "deeper" in answer["error"]["message"]
        deep = {"jsonrpc": "2.0", "id": 1, "method": "eth_call", "params": []}
        inner = deep["params"]
        for _ in range(depth if depth < 5_000 else 900):
            inner.append([])
            inner = inner[0]
        answer = json.loads(endpoint.handle(json.dumps(deep).encode()))
        assert answer["error"]["code"] == INVALID_REQUEST
    assert call(endpoint, "eth_chainId")["result"] == "0x7a69"


def test_a_deep_body_is_refused_where_the_recursion_limit_was_raised() -> None:
    """A library in the process may raise the recursion limit; the parser, which recurses in C
    once a level, would then overflow the stack on a deep body (the process dies). The depth
    is judged before parsing. In a process of its own: a failure here is a crash."""
    error = _answered_in_a_process("import sys\nsys.setrecursionlimit(10**7)\n",
                                   "b'[' * 2_000_000 + b']' * 2_000_000")
    assert "nests deeper than" in error["message"]


def _answered_in_a_process(setup: str, body: str) -> dict:
    """The error the endpoint answers `body` (a Python expression) with, in a process of
    its own after `setup`: a crash or a hang there fails the test, not the suite."""
    code = (setup + "import json\nfrom morphogen.wallet import Endpoint\n"
            f"print(json.dumps(json.loads(Endpoint(None).handle({body}))['error']))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)


def test_idle_and_slow_connections_are_closed(state):
    """A connection idle past `idle_s` is closed; a request trickled in past `arrive_s` from
    its first byte is dropped unanswered; a prompt one on a fresh connection is served."""
    import socket
    import time

    srv = RpcServer(Endpoint(state), "127.0.0.1", 0, idle_s=0.5, arrive_s=0.6)
    srv.start()
    host, port = srv.server_address[:2]
    body = b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}'
    head = (f"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    try:
        idle = socket.create_connection((host, port))
        idle.settimeout(5)
        started = time.monotonic()
        assert idle.recv(1) == b""  # closed by the server
        assert time.monotonic() - started < 4
        slow = socket.create_connection((host, port))
        slow.settimeout(5)
        slow.sendall(head + body[:5])
        started = time.monotonic()
        for i in range(5, 9):  # a byte every 0.2 s: each read in time, the whole not
            time.sleep(0.2)
            try:
                slow.sendall(body[i:i + 1])
            except OSError:
                break
        got = b""
        try:
            while chunk := slow.recv(4096):
                got += chunk
        except OSError:
            pass
        assert got == b"" and time.monotonic() - started < 4
        with socket.create_connection((host, port)) as ok:
            ok.settimeout(5)
            ok.sendall(head + body)
            got = b""
            while b"0x7a69" not in got and (chunk := ok.recv(4096)):
                got += chunk
            assert b"0x7a69" in got
    finally:
        srv.shutdown()
        srv.server_close()


def test_pending_counts_the_transactions_sent_through_the_endpoint(state):
    """ethers and viem take the next nonce from `pending`: after a send through here it is
    the one after the sent transaction's, as the node's pool counts it, until the signed
    block's nonce reaches it. The node is asked about the transaction it just took, and
    about nothing else."""
    asked, node = [], {"accepts": True, "knows": True}

    def forward(request):
        asked.append(request["method"])
        if request["method"] == "eth_sendRawTransaction":
            if not node["accepts"]:
                return {"jsonrpc": "2.0", "id": request["id"],
                        "error": {"code": -32000, "message": "nonce too low"}}
            return {"jsonrpc": "2.0", "id": request["id"], "result": "0x" + "cd" * 32}
        assert request == {"jsonrpc": "2.0", "id": 1, "method": "eth_getTransactionByHash",
                           "params": ["0x" + "cd" * 32]}
        tx = {"from": ALICE.upper().replace("0X", "0x"), "nonce": "0x5"}
        return {"jsonrpc": "2.0", "id": 1, "result": tx if node["knows"] else None}

    endpoint = Endpoint(state, forward=forward)
    assert call(endpoint, "eth_getTransactionCount", ALICE, "pending")["result"] == "0x5"
    assert call(endpoint, "eth_sendRawTransaction", "0x02")["result"] == "0x" + "cd" * 32
    assert asked == ["eth_sendRawTransaction", "eth_getTransactionByHash"]
    assert call(endpoint, "eth_getTransactionCount", ALICE, "pending")["result"] == "0x6"
    assert call(endpoint, "eth_getTransactionCount", ALICE, "latest")["result"] == "0x5"
    assert call(endpoint, "eth_getTransactionCount", ALICE)["result"] == "0x5"
    other = "0x" + "22" * 20
    assert call(endpoint, "eth_getTransactionCount", other, "pending")["result"] == "0x0"
    # a refused send, or one the node does not show, changes nothing
    node["accepts"] = False
    assert "error" in call(endpoint, "eth_sendRawTransaction", "0x02")
    node["accepts"], node["knows"] = True, False
    call(endpoint, "eth_sendRawTransaction", "0x02")
    assert call(endpoint, "eth_getTransactionCount", ALICE, "pending")["result"] == "0x6"
    # the block with it signed: the signed nonce again, and the entry gone
    alice = bytes.fromhex(ALICE[2:])
    state.accounts_[alice] = Account(6, 1, keccak256(CODE))
    assert call(endpoint, "eth_getTransactionCount", ALICE, "pending")["result"] == "0x6"
    assert endpoint.sent.pending(alice, 0) == 0


def test_sent_nonces_expire_and_stay_bounded():
    from morphogen.wallet.sent import SentNonces

    now = [0.0]
    sent = SentNonces(keep_s=10, max_senders=2, clock=lambda: now[0])
    a, b, c = b"\x0a" * 20, b"\x0b" * 20, b"\x0c" * 20
    sent.sent(a, 3)
    sent.sent(a, 1)  # an older one resent: the next nonce stays
    assert sent.pending(a, 2) == 4
    now[0] = 11.0  # dropped from the pool, as far as anyone can tell
    assert sent.pending(a, 2) == 2
    for who in (a, b, c):
        sent.sent(who, 9)
    assert [sent.pending(w, 0) for w in (a, b, c)] == [0, 10, 10]  # the oldest went


def test_a_body_of_escaped_quotes_is_judged_in_one_pass() -> None:
    """One quote, then escaped quotes to the endpoint's body limit: the nesting scan searched
    for a closing quote again from each of them (quadratic: 30 s at 80 KB, hours at 1 MiB,
    every other request of the process stalled). In a process of its own, bounded far above
    the milliseconds one pass takes."""
    error = _answered_in_a_process("", "b'\"' + b'\\\\\"' * 500_000")
    assert error["code"] == PARSE_ERROR
