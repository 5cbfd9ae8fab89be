"""`wait_routed`: a party is announced (and tested) only once the ingress routes to it. A real
HTTP server on loopback plays the proxy: 404 for a route it has not learned yet, then the
party's own answer."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cluster.local import wait_routed


class _Proxy(ThreadingHTTPServer):
    def __init__(self, routed_after: int, status: int = 200) -> None:
        self.routed_after = routed_after
        self.status = status
        self.seen: list[str] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Proxy

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.server.seen.append(self.path)
        routed = len(self.server.seen) > self.server.routed_after
        self.send_response(self.server.status if routed else 404)
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
    wait_routed([proxy.url + "/a", proxy.url + "/b/"], timeout_s=10)
    assert proxy.seen == ["/a/health"] * 4 + ["/b/health"]


@pytest.mark.parametrize("proxy", [(0, 503)], indirect=True)
def test_a_routed_party_that_is_not_healthy_yet_counts_as_routed(proxy) -> None:
    wait_routed([proxy.url + "/a"], timeout_s=10)
    assert proxy.seen == ["/a/health"]


@pytest.mark.parametrize("proxy", [(10**9,)], indirect=True)
def test_a_route_that_never_comes_is_an_error_after_the_timeout(proxy) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="/a is not routed after 1 s"):
        wait_routed([proxy.url + "/a"], timeout_s=1.0)
    assert 1.0 <= time.monotonic() - started < 5.0
