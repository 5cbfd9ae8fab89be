"""The wallet's HTTP endpoint: JSON-RPC over POST, CORS for the origins it is told, an upstream
node for what is not answered privately.

A plain threaded HTTP server (one thread a connection): a wallet's endpoint on the user's own
machine, bound to 127.0.0.1 unless told otherwise. Nothing of a request's body is logged.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from morphogen.wallet.jsonrpc import Endpoint

MAX_BODY = 1 << 20  # a batch of MAX_BATCH requests is far smaller


class Upstream:
    """Forwards one JSON-RPC request object to a node and returns its response object."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url
        self._http = httpx.Client(timeout=timeout_s)

    def __call__(self, request: dict) -> dict:
        reply = self._http.post(self.url, json=request)
        return reply.json()

    def close(self) -> None:
        self._http.close()


class RpcServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, endpoint: Endpoint | None, host: str = "127.0.0.1", port: int = 8545, *,
                 cors_origins: Sequence[str] = (),
                 route: Callable[[str], Any] | None = None) -> None:
        """Serves `endpoint` on every path, or with `route` the handler it gives for the
        request's path (404 where it gives none)."""
        self.endpoint = endpoint
        self.route = route or (lambda path: endpoint)
        self.cors_origins = tuple(cors_origins)
        super().__init__((host, port), _Handler)

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
        self.end_headers()
        if body:
            self.wfile.write(body)

    def do_OPTIONS(self) -> None:  # noqa: N802 (the stdlib's naming)
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
        self._send(405, _message("POST a JSON-RPC request"))

    def do_POST(self) -> None:  # noqa: N802
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._send(411, _message("a request needs a Content-Length"))
            return
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            self._send(413, _message(f"a request body is at most {MAX_BODY} bytes"))
            return
        target = self.server.route(self.path)
        body = self.rfile.read(length)
        if target is None:
            self._send(404, _message("no such path"))
            return
        answer = target.handle(body)
        if answer is None:
            self._send(204)
        else:
            self._send(200, answer)


def _message(text: str) -> bytes:
    return json.dumps({"error": text}).encode()
