"""Given-up requests (workers.Request): runs of a request whose client went away, or whose
deadline passed, are dropped before they start and a running one stops at its limit; a batch's
requests not begun are answered at once; the server gives a request up when its client closes
the connection. Fake EVM processes (threads) run the runs: each holds until told to end."""

from __future__ import annotations

import json
import queue
import socket
import struct
import threading

import pytest
from _evm_fakes import WAIT_S, fake_workers, queue_runs

from morphogen.wallet import Endpoint, RpcServer
from morphogen.wallet.jsonrpc import TIMED_OUT
from morphogen.wallet.server import GONE
from morphogen.wallet.workers import (
    Cancelled,
    Request,
    client,
    current_request,
)


@pytest.fixture
def world():
    with fake_workers() as pair:
        yield pair


def test_a_given_up_requests_queued_runs_are_dropped_and_the_next_client_runs(world):
    w, workers = world
    gone = Request()
    results: dict = {}
    mine = [f"a{i}" for i in range(10)]
    threads = queue_runs(workers, "a", gone, mine, results)
    assert workers.wait_for(lambda c: c["started"] == 1 and c["queued"] == 9, WAIT_S)
    gone.cancel(GONE)  # the client disconnected, a0 running
    assert workers.wait_for(lambda c: c["dropped"] == 9 and c["queued"] == 0, WAIT_S)
    threads += queue_runs(workers, "b", Request(), ["b0"], results)
    w.let("a0")  # the run already started ends as it would have
    w.let("b0")
    for t in threads:
        t.join(WAIT_S)
    assert w.ran == ["a0", "b0"]
    assert results["a0"] == b"a0" and results["b0"] == b"b0"
    assert all(isinstance(results[f"a{i}"], Cancelled) for i in range(1, 10))
    assert workers.counts() == {"started": 2, "dropped": 9, "stopped": 0, "queued": 0}
    # a run asked after its request was given up is never queued
    with client("a", gone), pytest.raises(Cancelled):
        workers.run("", {}, {"label": "late"}, False, WAIT_S)
    assert workers.counts()["started"] == 2 and "late" not in w.ran


def test_past_its_deadline_a_request_runs_nothing_more_and_its_running_run_stops(world):
    """The running run is stopped at the deadline (its process replaced), the queued ones
    dropped; nothing of them starts after it, and another client's run goes on."""
    w, workers = world
    soon = Request(deadline_s=0.5)
    results: dict = {}
    threads = queue_runs(workers, "a", soon, ["a0", "a1", "a2"], results)
    for t in threads:
        t.join(WAIT_S)
    assert all(isinstance(results[x], Cancelled) for x in ("a0", "a1", "a2"))
    assert soon.given_up() == "its deadline passed"
    assert w.ran == ["a0"] and w.killed == 1  # stopped with its process, not let end
    counts = workers.counts()
    assert counts["started"] == 1 and counts["stopped"] == 1 and counts["dropped"] == 2
    threads = queue_runs(workers, "b", None, ["b0"], results)
    w.let("b0")
    threads[0].join(WAIT_S)
    assert results["b0"] == b"b0" and w.ran == ["a0", "b0"]


def test_runs_of_a_given_up_request_met_in_turn_are_dropped_unstarted(world):
    """Given up without anyone told (its deadline passed while queued): the driver drops
    them when their turn comes."""
    w, workers = world
    results: dict = {}
    threads = queue_runs(workers, "a", None, ["a0"], results)
    assert workers.wait_for(lambda c: c["started"] == 1, WAIT_S)
    late = Request(deadline_s=60)
    threads += queue_runs(workers, "b", late, ["b0", "b1"], results)
    assert workers.wait_for(lambda c: c["queued"] == 2, WAIT_S)
    late.deadline = 0  # as if the time had passed, unnoticed by its waiting threads
    w.let("a0")
    for t in threads:
        t.join(WAIT_S)
    assert w.ran == ["a0"] and workers.counts()["dropped"] == 2
    assert isinstance(results["b0"], Cancelled) and isinstance(results["b1"], Cancelled)


class Counting:
    """A state stand-in that counts the reads made."""

    def __init__(self) -> None:
        self.reads = 0

    def head(self):
        self.reads += 1
        raise AssertionError("nothing is read for a request given up")


def test_a_given_up_batch_answers_its_requests_at_once_and_reads_nothing():
    state = Counting()
    endpoint = Endpoint(state)  # type: ignore[arg-type]
    body = json.dumps([{"jsonrpc": "2.0", "id": i, "method": "eth_blockNumber", "params": []}
                       for i in range(50)]).encode()
    request = Request()
    request.cancel("its deadline passed")
    with client("a", request):
        answers = json.loads(endpoint.handle(body))
    assert state.reads == 0 and len(answers) == 50
    assert {a["error"]["code"] for a in answers} == {TIMED_OUT}
    assert "request timed out" in answers[0]["error"]["message"]


class Waiting:
    """A handler that holds each request until it is given up, saying why."""

    def __init__(self) -> None:
        self.began = threading.Event()
        self.why: queue.Queue[str | None] = queue.Queue()

    def handle(self, body: bytes) -> bytes:
        request = current_request()
        assert request is not None
        self.began.set()
        given = threading.Event()
        forget = request.on_cancel(given.set)
        left = request.left()  # a deadline gives it up unannounced: seen when it comes
        given.wait(WAIT_S if left is None else left)
        forget()
        self.why.put(request.given_up())
        return b'{"jsonrpc": "2.0", "id": 1, "result": "0x1"}'


def _post(url: str, path: str = "/") -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "eth_call", "params": []}'
    sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock


@pytest.mark.parametrize("how", ["close", "reset"])
def test_the_server_gives_a_request_up_when_its_client_goes_away(how):
    target = Waiting()
    server = RpcServer(None, "127.0.0.1", 0, route=lambda path: target)
    server.start()
    try:
        sock = _post(server.url)
        assert target.began.wait(WAIT_S)
        if how == "reset":  # an abortive close: RST, not FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        assert target.why.get(timeout=WAIT_S) == GONE
    finally:
        server.shutdown()
        server.server_close()


def test_a_client_still_there_is_answered_and_one_past_the_deadline_given_up():
    target = Waiting()
    server = RpcServer(None, "127.0.0.1", 0, route=lambda path: target, request_s=0.3)
    server.start()
    try:
        sock = _post(server.url)
        assert target.why.get(timeout=WAIT_S) == "its deadline passed"
        sock.settimeout(WAIT_S)
        assert b"200 OK" in sock.recv(4096)  # what it has is answered
        sock.close()
    finally:
        server.shutdown()
        server.server_close()
