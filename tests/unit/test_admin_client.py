"""The admin client over two in-process parties: one publication id to both, a lagging party
re-sent to until it has it, a re-run that applies nothing twice, and a status comparison that
names what one party lacks and the command that fixes it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from _party_world import make_party, make_world

from morphogen.client.admin import (
    AdminClient,
    PartiesApart,
    PartiesDiverged,
    compare_parties,
    content_publication_id,
    publish_to_parties,
)
from morphogen.client.wire import PirUnavailable
from morphogen.party import admin_wire
from morphogen.party.admin_status import party_status
from morphogen.party.router import Party
from morphogen.party.wire import error_body
from morphogen.protocol.codec import ADMIN_STATUS_PATH, ADMIN_UPDATES_PATH, WireError

TOKEN = "admin-client-test-token-0123456789"


class PartyServer:
    """A party's admin routes over HTTP semantics (the router's parsing, the real publisher);
    `down` answers that many requests with 503 first, `drop` that many with a dropped
    connection."""

    def __init__(self, party: Party) -> None:
        self.party = party
        self.down = 0
        self.drop = 0
        self.requests = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if self.drop:
            self.drop -= 1
            raise httpx.ConnectError("connection reset", request=request)
        if self.down:
            self.down -= 1
            return httpx.Response(503, content=error_body(self.party.unavailable("restarting")),
                                  headers={"Retry-After": "0"})
        try:
            if request.url.path == ADMIN_STATUS_PATH:
                out = asyncio.run(party_status(self.party.admin))
            else:
                assert request.url.path == ADMIN_UPDATES_PATH
                pub = admin_wire.publication_id(request.headers.get("idempotency-key"))
                changes = admin_wire.parse_updates(request.content,
                                                   request.headers.get("content-type"),
                                                   num_pages=1 << 20, max_updates=64)
                parent = admin_wire.parent_identity(request.headers.get("morphogen-parent"))
                out = asyncio.run(self.party.admin.updates(changes, pub, parent))
        except WireError as err:
            return httpx.Response(err.status, content=error_body(err))
        return httpx.Response(200, content=json.dumps(out).encode(),
                              headers={"Content-Type": "application/json"})


@pytest.fixture
def two_parties(tmp_path: Path):
    root, snaps = make_world(tmp_path)
    servers = [PartyServer(make_party(snaps, root / f"log-{n}")[0]) for n in "ab"]
    clients = [AdminClient(f"http://{n}", TOKEN, transport=httpx.MockTransport(s))
               for n, s in zip("ab", servers, strict=True)]
    return servers, clients


def _changes(seed: int) -> list[tuple[int, str, bytes]]:
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(0, 96)), "diff", rng.integers(0, 256, 4096, np.uint8).tobytes())]


def test_one_id_to_both_parties_and_a_rerun_applies_nothing_twice(two_parties) -> None:
    servers, clients = two_parties
    changes = _changes(1)
    pub = content_publication_id("updates", json.dumps([c[0] for c in changes]).encode())
    servers[1].down, servers[1].drop = 2, 1  # B restarts meanwhile
    out = publish_to_parties(clients, lambda c: c.updates(changes, pub), sleep=lambda s: None)
    assert out[0]["identity"] == out[1]["identity"] and out[0]["epoch_id"] == 2
    assert servers[1].requests == 4
    again = publish_to_parties(clients, lambda c: c.updates(changes, pub), sleep=lambda s: None)
    assert [r["duplicate"] for r in again] == [True, True]
    assert [r["identity"] for r in again] == [out[0]["identity"]] * 2
    statuses = [c.status() for c in clients]
    assert compare_parties(["http://a", "http://b"], statuses) is None


def test_a_party_that_stays_down_is_named_and_the_rerun_completes(two_parties) -> None:
    servers, clients = two_parties
    changes = _changes(2)
    servers[1].down = 1000
    with pytest.raises(PirUnavailable, match=r"http://b did not take the publication .*applied "
                                             r"on http://a at epoch 2.*re-run the same command"):
        publish_to_parties(clients, lambda c: c.updates(changes, "pub-1"), retry_for_s=0.2,
                           sleep=lambda s: None)
    statuses = [c.status() for c in clients[:1]]
    servers[1].down = 0
    statuses.append(clients[1].status())
    diff = compare_parties(["http://a", "http://b"], statuses)
    assert diff is not None and "http://b lacks publication(s) pub-1" in diff
    assert "morphogen admin --server http://a --server http://b snapshot PATH" in diff
    out = publish_to_parties(clients, lambda c: c.updates(changes, "pub-1"), sleep=lambda s: None)
    assert out[0].get("duplicate") and not out[1].get("duplicate")
    assert out[0]["identity"] == out[1]["identity"]
    assert compare_parties(["a", "b"], [c.status() for c in clients]) is None


def test_parties_that_held_different_data_are_reported(two_parties) -> None:
    servers, clients = two_parties
    clients[1].updates(_changes(3), "only-on-b")
    with pytest.raises(PartiesDiverged, match="rotate both to one snapshot"):
        publish_to_parties(clients, lambda c: c.updates(_changes(4), "pub-2"),
                           sleep=lambda s: None)


def test_an_id_reused_for_other_content_is_refused(two_parties) -> None:
    _, clients = two_parties
    clients[0].updates(_changes(5), "pub-3")
    with pytest.raises(Exception, match="409.*used for another request"):
        clients[0].updates(_changes(6), "pub-3")


def test_content_ids_are_stable_and_distinct() -> None:
    assert content_publication_id("updates", b"x") == content_publication_id("updates", b"x")
    assert content_publication_id("updates", b"x") != content_publication_id("updates", b"y")
    assert content_publication_id("updates", b"x") != content_publication_id("snapshot", b"x")


def _send(changes, pub):
    return lambda c, parent: c.updates(changes, pub, parent)


def test_two_publishers_at_once_leave_both_parties_on_one_sequence(two_parties) -> None:
    """Publisher 1 reaches A and stops (or is slow) before B; publisher 2 starts then: it
    finds the parties apart and sends nothing. Publisher 1's re-run completes its own
    publication on B, and publisher 2 then publishes on top of both."""
    servers, clients = two_parties
    one, two = _changes(7), _changes(8)
    clients[0].updates(one, "pub-one", clients[0].head()[0])  # publisher 1, stopped after A
    with pytest.raises(PartiesApart, match="different data before publication pub-two"):
        publish_to_parties(clients, _send(two, "pub-two"), sleep=lambda s: None,
                           publication="pub-two")
    assert [c.head()[1][-1:] for c in clients] == [["pub-one"], []]
    done = publish_to_parties(clients, _send(one, "pub-one"), sleep=lambda s: None,
                              publication="pub-one")
    assert done[0].get("duplicate") and done[0]["identity"] == done[1]["identity"]
    out = publish_to_parties(clients, _send(two, "pub-two"), sleep=lambda s: None,
                             publication="pub-two")
    assert out[0]["identity"] == out[1]["identity"]
    assert [c.head()[1][-2:] for c in clients] == [["pub-one", "pub-two"]] * 2


def test_a_publisher_stopped_with_a_two_ahead_and_b_one_ahead_completes_on_a_re_run(
        two_parties) -> None:
    """An overlapped publisher sends the next publication to A while B takes this one, and
    stops before it notes this one done: A holds both, B the first. Its re-run re-sends the
    first (each party answers it as done, at different heads) and then the second, which
    brings B up. Refused as parties apart, every re-run failed, and a follower never
    restarted."""
    servers, clients = two_parties
    one, two = _changes(11), _changes(12)
    heads = [c.head()[0] for c in clients]
    clients[0].updates(one, "pub-a1", heads[0])
    clients[0].updates(two, "pub-a2", clients[0].head()[0])  # A: the next one, overlapped
    clients[1].updates(one, "pub-a1", heads[1])  # B: this one; then the publisher stops
    done = publish_to_parties(clients, _send(one, "pub-a1"), sleep=lambda s: None,
                              publication="pub-a1")
    assert all(d.get("duplicate") for d in done)
    assert done[0]["identity"] == done[1]["identity"]
    out = publish_to_parties(clients, _send(two, "pub-a2"), sleep=lambda s: None,
                             publication="pub-a2")
    assert out[0].get("duplicate") and out[0]["identity"] == out[1]["identity"]
    assert clients[0].head()[0] == clients[1].head()[0]


def test_a_publisher_overtaken_at_party_a_never_reaches_party_b(two_parties) -> None:
    """Both publishers read the same heads; the second to reach A is refused there (409), so
    B never gets it and the two parties apply one sequence."""
    servers, clients = two_parties
    heads = [c.head()[0] for c in clients]
    clients[0].updates(_changes(9), "pub-first", heads[0])
    with pytest.raises(Exception, match="parent_mismatch|another publisher"):
        clients[0].updates(_changes(10), "pub-second", heads[0])
    assert clients[1].head()[0] == heads[1]  # B untouched by the refused one
    clients[1].updates(_changes(9), "pub-first", heads[1])
    assert clients[0].head()[0] == clients[1].head()[0]
