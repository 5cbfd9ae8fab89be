"""`publish_to_parties` against scripted parties: one id to A then B, re-sent on what a dead
router replica looks like from outside, never on a refusal."""

from __future__ import annotations

import httpx
import pytest

from morphogen.client.admin import AdminClient, publish_to_parties
from morphogen.client.wire import PirError
from morphogen.protocol.codec import PUBLICATION_HEADER

TOKEN = "admin-client-test-token-0123456789"


def _parties(script: dict[str, list[httpx.Response]], seen: list[tuple[str, str]]):
    def route(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        seen.append((host, request.headers.get(PUBLICATION_HEADER)))
        if script[host]:
            resp = script[host].pop(0)
            if isinstance(resp, Exception):
                raise resp
            return resp
        return httpx.Response(200, json={"epoch_id": 2, "identity": "0x" + "ab" * 16,
                                         "publication": request.headers.get(PUBLICATION_HEADER)})

    transport = httpx.MockTransport(route)
    # the list form: every request the client sends is one the script answers
    return [AdminClient(f"http://{h}", TOKEN, transport=transport, sparse=False)
            for h in ("a", "b")]


def test_a_dead_router_is_answered_by_a_resend_of_the_same_id() -> None:
    seen: list[tuple[str, str]] = []
    script = {
        "a": [httpx.Response(500, text="Internal Server Error"),
              httpx.RemoteProtocolError("Server disconnected without sending a response.")],
        "b": [httpx.Response(502), httpx.Response(503, json={"error": {
            "code": "unavailable", "message": "a proposal is undecided"}})],
    }
    clients = _parties(script, seen)
    out = publish_to_parties(clients, lambda c: c.updates([(1, "diff", bytes(4096))], "pub-1"),
                             sleep=lambda s: None)
    assert [r["identity"] for r in out] == ["0x" + "ab" * 16] * 2
    assert seen == [("a", "pub-1")] * 3 + [("b", "pub-1")] * 3


def test_a_refusal_is_not_resent() -> None:
    seen: list[tuple[str, str]] = []
    script = {"a": [httpx.Response(400, json={"error": {"code": "bad_update", "message": "x"}})],
              "b": []}
    clients = _parties(script, seen)
    with pytest.raises(PirError) as exc:
        publish_to_parties(clients, lambda c: c.updates([(1, "diff", bytes(4096))], "pub-2"),
                           sleep=lambda s: None)
    assert exc.value.status == 400 and seen == [("a", "pub-2")]


def test_the_ingresss_404_is_sent_again_once_on_a_new_connection_the_partys_is_not() -> None:
    """A plain 404 comes from the HTTP ingress (no route to the party: a kept-alive connection
    to an ingress process from before the party was deployed again); the party's own 404 is
    JSON with an error code and stands."""
    seen: list[tuple[str, str]] = []
    script = {"a": [httpx.Response(404, text="Path '/a/admin/updates' not found.")],
              "b": [httpx.Response(404, text="not found"), httpx.Response(404, text="again")]}
    a, b = _parties(script, seen)
    assert a.updates([(1, "diff", bytes(4096))], "pub-3")["publication"] == "pub-3"
    assert seen == [("a", "pub-3")] * 2
    with pytest.raises(PirError, match="HTTP 404"):  # once only
        b.status()
    assert len(seen) == 4
    script["a"].append(httpx.Response(404, json={"error": {"code": "not_found",
                                                           "message": "no route /x"}}))
    with pytest.raises(PirError, match="no route /x"):
        a.status()
    assert len(seen) == 5
