"""The JSON-RPC client against real endpoints on loopback: each way a node can fail comes back
as its own one-line ChainError, and a batch keeps each call's error in its place."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
from collections.abc import Iterator

import pytest
from chain_node import free_port, running_anvil

from morphogen.chain.rpc import (
    BadHex,
    ChainError,
    EthRpc,
    MethodMissing,
    NodeUnreachable,
    NotJsonRpc,
    RpcError,
    WrongChain,
    display_url,
    quantity,
    to_int,
)

PAGES = {
    "/html": (200, "text/html", b"<!doctype html><html><body>Welcome to nginx!</body></html>"),
    "/missing": (404, "text/html", b"<html><body>404 Not Found</body></html>"),
    "/json": (200, "application/json", b'{"status": "ok"}'),
    # a provider that refuses batches answers a batch with one error
    "/no-batches": (200, "application/json", b'{"jsonrpc": "2.0", "id": null, "error": '
                    b'{"code": -32600, "message": "batch requests are\\nnot supported"}}'),
}


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - the standard library's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        status, kind, body = PAGES[self.path]
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def web() -> Iterator[str]:
    """A plain web server on loopback that is no Ethereum node."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def anvil() -> Iterator[str]:
    with running_anvil(chain_id=31337) as url:
        yield url


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and text
    return text


# -- hex quantities ----------------------------------------------------------------------------

def test_quantities() -> None:
    assert [quantity(n) for n in (0, 1, 255, 2**256 - 1)] == ["0x0", "0x1", "0xff",
                                                             "0x" + "f" * 64]
    assert [to_int(q) for q in ("0x0", "0x1", "0xFF", "0x00ff")] == [0, 1, 255, 255]
    for bad in ("0x", "12", "0xg", "", None, 12, " 0x1"):
        with pytest.raises(BadHex, match="not a 0x-hex quantity"):
            to_int(bad, "balance")
    with pytest.raises(ValueError):
        quantity(-1)
    with pytest.raises(TypeError):
        quantity(True)


def test_urls_in_errors_leave_keys_out() -> None:
    assert display_url("https://user:pw@eth.example:8545/v2/AbCdEfGhIjKlMnOpQrStUvWx?k=1") == (
        "https://eth.example:8545/v2/***")
    assert display_url("http://127.0.0.1:8545") == "http://127.0.0.1:8545"


# -- endpoints that fail -----------------------------------------------------------------------

def test_a_closed_port_is_unreachable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with EthRpc(url, timeout_s=5) as rpc, pytest.raises(NodeUnreachable) as caught:
        rpc.chain_id()
    text = one_line(caught.value)
    assert url in text and "check that the node is running" in text


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    # accepts connections and never answers: a node that hangs
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def test_a_node_that_never_answers_times_out() -> None:
    with silent_port() as port, EthRpc(f"http://127.0.0.1:{port}", timeout_s=0.3) as rpc:
        with pytest.raises(NodeUnreachable, match="did not answer eth_blockNumber within 0.3 s"):
            rpc.block_number()


@pytest.mark.parametrize(("path", "said"), [
    ("/html", "HTTP 200 and text/html, not JSON"),
    ("/missing", "HTTP 404 and text/html, not JSON"),
    ("/json", 'JSON without "jsonrpc"'),
])
def test_a_web_server_is_not_a_json_rpc_endpoint(web: str, path: str, said: str) -> None:
    with EthRpc(web + path, timeout_s=5) as rpc, pytest.raises(NotJsonRpc) as caught:
        rpc.chain_id()
    text = one_line(caught.value)
    assert said in text and "not an Ethereum JSON-RPC endpoint" in text and web in text
    with EthRpc(web + path, timeout_s=5) as rpc, pytest.raises(NotJsonRpc):
        rpc.batch([("eth_chainId", [])])


def test_a_batch_refused_whole_raises(web: str) -> None:
    with EthRpc(web + "/no-batches", timeout_s=5) as rpc, pytest.raises(RpcError) as caught:
        rpc.batch([("eth_chainId", []), ("eth_blockNumber", [])])
    assert one_line(caught.value).endswith(
        "error -32600: batch requests are not supported")
    assert "a batch of 2 calls (eth_chainId, ...)" in str(caught.value)


def test_every_failure_is_a_chain_error() -> None:
    for kind in (NodeUnreachable, NotJsonRpc, RpcError, MethodMissing, WrongChain, BadHex):
        assert issubclass(kind, ChainError) and issubclass(ChainError, RuntimeError)


# -- a real node -------------------------------------------------------------------------------

def test_the_usual_questions(anvil: str) -> None:
    with EthRpc(anvil) as rpc:
        assert rpc.chain_id() == 31337 == rpc.check_chain_id(31337)
        assert rpc.block_number() == 0
        genesis = rpc.block(0)
        assert genesis["number"] == "0x0" and genesis == rpc.block("latest")
        assert genesis["hash"].startswith("0x") and len(genesis["hash"]) == 66
        with pytest.raises(ChainError, match="has no block 99"):
            rpc.block(99)


def test_a_method_the_node_lacks(anvil: str) -> None:
    with EthRpc(anvil) as rpc, pytest.raises(MethodMissing) as caught:
        rpc.call("debug_accountRange", "latest", "0x", 10, False, False, False)
    text = one_line(caught.value)
    assert "has no method debug_accountRange" in text and anvil in text
    assert caught.value.code == -32601 and caught.value.method == "debug_accountRange"


def test_another_rpc_error_names_method_code_and_message(anvil: str) -> None:
    with EthRpc(anvil) as rpc, pytest.raises(RpcError) as caught:
        rpc.call("eth_getBalance", "not an address", "latest")
    text = one_line(caught.value)
    assert not isinstance(caught.value, MethodMissing)
    assert text.startswith(f"eth_getBalance failed on {anvil}: error {caught.value.code}: ")


def test_the_wrong_chain_names_both_ids(anvil: str) -> None:
    with EthRpc(anvil) as rpc, pytest.raises(WrongChain) as caught:
        rpc.check_chain_id(1)
    assert "is on chain 31337, not chain 1" in one_line(caught.value)


# anvil (1.7.1) has debug_traceBlockByNumber but none of geth's state dumps
MISSING = ("debug_accountRange", ["0x0", "0x", 1, False, False, False])


def test_a_batch_keeps_each_error_in_its_place(anvil: str) -> None:
    address = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266"
    with EthRpc(anvil) as rpc:
        results = rpc.batch([("eth_chainId", []), MISSING,
                             ("eth_getBalance", [address, "0x0"]),
                             ("eth_getBalance", ["0x12", "0x0"]),
                             ("eth_blockNumber", [])])
        assert results[0] == "0x7a69" and to_int(results[2]) == 10_000 * 10**18
        assert isinstance(results[1], MethodMissing) and "debug_accountRange" in str(
            results[1])
        assert type(results[3]) is RpcError and results[4] == "0x0"
        assert rpc.batch([]) == []
        with pytest.raises(MethodMissing):
            rpc.batch_values([("eth_chainId", []), MISSING])
        # ids keep counting across calls and batches
        assert rpc.call("eth_chainId") == "0x7a69"
