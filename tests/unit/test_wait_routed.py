"""`wait_routed`: a party is announced (and tested) only once the ingress routes to it. A real
HTTP server on loopback plays the proxy: 404 for a route it has not learned yet, then the
party's own answer, and, while an old proxy process still takes connections after a reload,
404 and the answer in turn."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cluster.local import wait_routed


class _Proxy(ThreadingHTTPServer):
    def __init__(self, routed_after: int, status: int = 200, stale: tuple[int, ...] = ()) -> None:
        self.routed_after = routed_after
        self.status = status
        self.stale = stale  # the requests (counted from 1) an old process without the route takes
        self.seen: list[str] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Proxy
    protocol_version = "HTTP/1.1"  # keeps a connection open for a client that reuses it

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.server.seen.append(self.path)
        n = len(self.server.seen)
        routed = n > self.server.routed_after and n not in self.server.stale
        self.send_response(self.server.status if routed else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def proxy(request):
    server = _Proxy(*request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("proxy", [(3,)], indirect=True)
def test_waits_through_the_proxys_404_until_the_party_answers(proxy) -> None:
    wait_routed([proxy.url + "/a", proxy.url + "/b/"], timeout_s=10, settle=2)
    assert proxy.seen == ["/a/health"] * 5 + ["/b/health"] * 2


@pytest.mark.parametrize("proxy", [(1, 200, (4, 7))], indirect=True)
def test_a_404_after_the_route_answered_starts_the_count_again(proxy) -> None:
    # answers: 404, ok, ok, 404 (the old process), ok, ok, 404, ok, ok, ok
    wait_routed([proxy.url + "/a"], timeout_s=10, settle=3)
    assert len(proxy.seen) == 10


def test_each_try_is_a_connection_of_its_own() -> None:
    peers: list[int] = []

    class Counting(_Proxy):
        def process_request(self, request, client_address):
            peers.append(client_address[1])
            super().process_request(request, client_address)

    server = Counting(0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        wait_routed([server.url + "/a"], timeout_s=10, settle=4)
    finally:
        server.shutdown()
        server.server_close()
    assert len(server.seen) == 4 and len(set(peers)) == 4


@pytest.mark.parametrize("proxy", [(0, 503)], indirect=True)
def test_a_routed_party_that_is_not_healthy_yet_counts_as_routed(proxy) -> None:
    wait_routed([proxy.url + "/a"], timeout_s=10)
    assert proxy.seen == ["/a/health"] * 5


@pytest.mark.parametrize("proxy", [(10**9,)], indirect=True)
def test_a_route_that_never_comes_is_an_error_after_the_timeout(proxy) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="/a is not routed after 1 s"):
        wait_routed([proxy.url + "/a"], timeout_s=1.0)
    assert 1.0 <= time.monotonic() - started < 5.0
