"""The wallet's HTTP endpoint: JSON-RPC over POST, CORS for the origins it is told, an upstream
node for what is not answered privately.

A plain threaded HTTP server (one thread a connection): a wallet's endpoint on the user's own
machine, bound to 127.0.0.1 unless told otherwise. Before a body is read as JSON-RPC, its Host
must be one allowed and its content type JSON, and it must arrive in time
(morphogen/wallet/guard.py: why). Every refusal is answered with a JSON-RPC error object as its
body, whatever the HTTP status. Nothing of a request's body is logged.

While a request is answered its connection is watched: a client that goes away (a wallet's own
timeout, a closed tab) has its request given up, as has one past `request_s`
(`workers.Request`): what is still waiting of it, EVM runs and a batch's requests not begun,
is not done; a request past its deadline is answered "request timed out" for what was not.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import httpx

from morphogen.wallet.guard import (
    ARRIVE_S,
    IDLE_S,
    LOOPBACK_HOSTS,
    Deadlines,
    HostList,
    is_json,
)
from morphogen.wallet.workers import Request, client

if TYPE_CHECKING:
    from morphogen.wallet.jsonrpc import Endpoint

MAX_BODY = 1 << 20  # a batch of MAX_BATCH requests is far smaller
INVALID_REQUEST = -32600  # jsonrpc.py's, for what is refused before JSON-RPC
INTERNAL_ERROR = -32603
# How long a request (a batch: all of it) may take before what is left of it is answered
# "request timed out": a node's HTTP write timeout (geth's 30 s), where clients have mostly
# given up already.
REQUEST_S = 30.0
GONE = "its client went away"
log = logging.getLogger(__name__)


class Upstream:
    """Forwards one JSON-RPC request object to a node and returns its response object."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url
        self._http = httpx.Client(timeout=timeout_s)

    def __call__(self, request: dict) -> dict:
        reply = self._http.post(self.url, json=request)
        return reply.json()

    def header(self, block_hash: str) -> Any:
        """The node's header of the block `block_hash` (unchecked: the caller checks it)."""
        return self({"jsonrpc": "2.0", "id": 1, "method": "eth_getBlockByHash",
                     "params": [block_hash, False]}).get("result")

    def close(self) -> None:
        self._http.close()


class RpcServer(ThreadingHTTPServer):
    daemon_threads = True
    # connections waiting to be accepted: the standard library's 5 resets clients when many
    # open at once (a wallet and its dapps, a reconnect burst)
    request_queue_size = socket.SOMAXCONN

    def __init__(self, endpoint: Endpoint | None, host: str = "127.0.0.1", port: int = 8545, *,
                 cors_origins: Sequence[str] = (),
                 allowed_hosts: Sequence[str] = LOOPBACK_HOSTS,
                 route: Callable[[str], Any] | None = None,
                 idle_s: float = IDLE_S, arrive_s: float = ARRIVE_S,
                 request_s: float | None = REQUEST_S, watch: bool = True) -> None:
        """Serves `endpoint` on every path, or with `route` the handler it gives for the
        request's path (404 where it gives none). `allowed_hosts`: the Host names served
        (`*`: any); `idle_s`: how long a connection may wait for its next request;
        `arrive_s`: how long a request may take to arrive once begun; `request_s`: how long
        it may take to answer (None: no limit); `watch`: a request whose client goes away
        is given up (off for a loopback whose only client is this process)."""
        self.endpoint = endpoint
        self.route = route or (lambda path: endpoint)
        self.cors_origins = tuple(cors_origins)
        self.hosts = HostList(allowed_hosts)
        self.idle_s, self.arrive_s = idle_s, arrive_s
        self.request_s, self.watch = request_s, watch
        self.deadlines = Deadlines()
        super().__init__((host, port), _Handler)

    def server_close(self) -> None:
        self.deadlines.close()
        super().server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client gone mid-request (reset, or cut by a deadline): no traceback on stderr
        import sys

        log.debug("a connection ended: %s", type(sys.exc_info()[1]).__name__)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def allowed_origin(self, origin: str | None) -> str | None:
        if origin is None or not self.cors_origins:
            return None
        if "*" in self.cors_origins:
            return "*"
        return origin if origin in self.cors_origins else None

    def start(self) -> threading.Thread:
        """Serves on a daemon thread (for tests and embedding); `shutdown()` stops it."""
        thread = threading.Thread(target=self.serve_forever, name="morphogen-rpc", daemon=True)
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: RpcServer
    protocol_version = "HTTP/1.1"
    # A response goes out as two writes (head, then body). With Nagle's algorithm the body
    # waits for the client to acknowledge the head, which a client delays up to 40 ms: on
    # every keep-alive request, longer than the answer took.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # the default writes the request line: no request is logged here

    def handle_one_request(self) -> None:
        """Wait `idle_s` for a request to begin; from its first byte it must arrive whole
        within `arrive_s` (its body read: the deadline is lifted before it is answered)."""
        srv = self.server
        try:
            self.connection.settimeout(srv.idle_s)
            if not self.rfile.peek(1):
                self.close_connection = True  # the client closed it
                return
        except OSError:  # idle past the limit (TimeoutError), or reset
            self.close_connection = True
            return
        self.connection.settimeout(srv.arrive_s)
        srv.deadlines.arm(self.connection, srv.arrive_s)
        try:
            super().handle_one_request()
        finally:
            srv.deadlines.disarm(self.connection)

    def _arrived(self) -> None:
        """The request is in: what follows is answering it, which no arrival limit cuts."""
        self.server.deadlines.disarm(self.connection)
        self.connection.settimeout(self.server.idle_s)  # a client that never reads: cut

    def _cors(self) -> None:
        origin = self.server.allowed_origin(self.headers.get("Origin"))
        if origin is not None:
            self.send_header("Access-Control-Allow-Origin", origin)
            self.send_header("Vary", "Origin")

    def _send(self, status: int, body: bytes = b"", content_type: str = "application/json"
              ) -> None:
        self.send_response(status)
        self._cors()
        if body:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _refuse(self, status: int, text: str, code: int = INVALID_REQUEST) -> None:
        """An HTTP refusal with a JSON-RPC error as its body; the connection closed where
        its body was not read."""
        self.close_connection = True
        self._send(status, _error(code, text))

    def _host_allowed(self) -> bool:
        if self.server.hosts.allows(self.headers.get("Host")):
            return True
        self._refuse(403, "this Host is not served here (a DNS-rebinding page?): start the "
                     "endpoint with --allowed-hosts naming it")
        return False

    def do_OPTIONS(self) -> None:  # noqa: N802 (the stdlib's naming)
        self._arrived()
        if not self._host_allowed():
            return
        self.send_response(204)
        self._cors()
        if self.server.allowed_origin(self.headers.get("Origin")) is not None:
            self.send_header("Access-Control-Allow-Methods", "POST, OPTIONS")
            self.send_header("Access-Control-Allow-Headers",
                             self.headers.get("Access-Control-Request-Headers", "Content-Type"))
            self.send_header("Access-Control-Max-Age", "600")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        self._arrived()
        if self._host_allowed():
            self._refuse(405, "POST a JSON-RPC request")

    def do_POST(self) -> None:  # noqa: N802
        if not self._host_allowed():
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._refuse(411, "a request needs a Content-Length")
            return
        if not 0 <= length <= MAX_BODY:
            self._refuse(413, f"a request body is at most {MAX_BODY} bytes")
            return
        if not is_json(self.headers.get("Content-Type")):
            self._refuse(415, "a JSON-RPC request is sent as Content-Type: application/json")
            return
        target = self.server.route(self.path)
        if target is None:
            self._refuse(404, "no such path")
            return
        body = self.rfile.read(length)
        if len(body) < length:  # the client went away, or took too long (the deadline)
            self.close_connection = True
            return
        self._arrived()
        srv = self.server
        request = Request(srv.request_s)
        if srv.watch:
            srv.deadlines.watch(self.connection, lambda: request.cancel(GONE))
        try:
            # its runs queued as this connection's, given up with the request
            with client(id(self.connection), request):
                answer = target.handle(body)
        except Exception as exc:  # Endpoint.handle answers every request; this is a bug
            log.error("a request failed: %s", type(exc).__name__)
            self._send(500, _error(INTERNAL_ERROR, f"internal error ({type(exc).__name__})"))
            return
        finally:
            if srv.watch:
                srv.deadlines.unwatch(self.connection)
        if request.given_up() == GONE:  # no one to answer
            self.close_connection = True
            return
        if answer is None:
            self._send(204)
        else:
            self._send(200, answer)


def _error(code: int, text: str) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": None,
                       "error": {"code": code, "message": text}}).encode()
