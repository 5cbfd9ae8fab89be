"""A static file server on loopback that answers ranged GETs (``Range: bytes=a-b`` → 206), as
a web server or a CDN in front of a bucket does, for the ``http(s)://`` snapshot tests.
Python's own `http.server` ignores ranges, so it cannot stand in for one. Fake nodes serve
their own handlers through `serving_with` and answer with `reply_json`."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


def _handler(root: Path) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet tests
            pass

        def _file(self) -> Path | None:
            path = (root / self.path.split("?")[0].lstrip("/")).resolve()
            return path if path.is_file() and root in path.parents else None

        def do_HEAD(self) -> None:  # noqa: N802 - the stdlib's name
            self._answer(body=False)

        def do_GET(self) -> None:  # noqa: N802
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            path = self._file()
            if path is None:
                self.send_error(404)
                return
            data = path.read_bytes()
            wanted = _RANGE.fullmatch(self.headers.get("Range", ""))
            if wanted:
                start = int(wanted.group(1))
                end = min(int(wanted.group(2) or len(data) - 1), len(data) - 1)
                if start > end:
                    self.send_error(416)
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                data = data[start:end + 1]
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if body:
                self.wfile.write(data)

    return Handler


def reply_json(handler: BaseHTTPRequestHandler, doc: object) -> None:
    """Answer `handler`'s request with `doc` as JSON (200): a fake node's reply."""
    body = json.dumps(doc).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def serving(root: Path) -> AbstractContextManager[str]:
    """Serve `root` on 127.0.0.1; yields the base URL."""
    return serving_with(_handler(root.resolve()))


@contextmanager
def serving_with(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve with `handler` on a loopback port of its own; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
