"""The two-server client against in-process fake servers (the real wire code, no Ray)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import numpy as np
import pytest

from morphogen.client import (
    AsyncPirClient,
    EpochMismatchError,
    HandlePirClient,
    PageOutOfRange,
    PirClient,
    PirError,
    PirUnavailable,
    RetryPolicy,
    plan_targets,
)
from morphogen.party import wire
from morphogen.protocol.codec import WireError, max_body_bytes
from morphogen.protocol.dpf import eval_range
from morphogen.snapshot.layout import domain_bits_for
from morphogen.snapshot.synthetic import synthetic_pages

NUM_PAGES = 37  # not a power of two: the domain is larger than the page count
PAGES = synthetic_pages(3, 0, NUM_PAGES)
D = domain_bits_for(NUM_PAGES)
FAST = RetryPolicy(attempts=4, backoff_s=0.001, max_backoff_s=0.01)


def reference_scan(keys) -> np.ndarray:
    out = np.empty((len(keys), 4096), np.uint8)
    lanes = PAGES.reshape(NUM_PAGES, 256, 16)
    for i, k in enumerate(keys):
        masks = eval_range(k, 0, NUM_PAGES)
        out[i] = np.bitwise_xor.reduce(lanes & masks[:, None, :], axis=0).reshape(-1)
    return out


class FakeServer:
    """One party: real request parsing and encoding, a NumPy scan, scripted faults."""

    def __init__(self, epoch: int = 1) -> None:
        self.epoch = epoch
        self.faults: list[Callable[[], httpx.Response | None]] = []
        self.requests = 0
        self.batch_sizes: list[int] = []

    def epoch_doc(self) -> dict:
        return {
            "epoch_id": self.epoch,
            "num_rows": NUM_PAGES,
            "seeds": [0, 0, 0],
            "block_number": 0,
            "state_root": "0x" + "00" * 32,
            "page_pir": {"domain_bits": D, "rows_per_page": 1, "num_pages": NUM_PAGES,
                         "max_batch_queries": 4},
        }

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if self.faults:
            resp = self.faults.pop(0)()
            if resp is not None:
                return resp
        if request.url.path.endswith("/epoch"):
            return httpx.Response(200, json=self.epoch_doc())
        batch = request.url.path.endswith("/batch")
        try:
            if len(request.content) > max_body_bytes(D, 4):
                raise WireError(413, "payload_too_large", "too large")
            parsed = wire.parse_queries(request.content, request.headers.get("content-type"),
                                        batch=batch, domain_bits=D, max_queries=4)
        except WireError as err:
            return httpx.Response(err.status, content=wire.error_body(err))
        self.batch_sizes.append(parsed.num_queries)
        acc = reference_scan(parsed.keys.keys())
        enc = wire.response_encoding(request.headers.get("accept"), parsed.encoding)
        ct = "application/msgpack" if enc == wire.MSGPACK else "application/json"
        body = wire.encode_answer(self.epoch, acc, batch=batch, encoding=enc)
        return httpx.Response(200, content=body, headers={"content-type": ct})


def _client(a: FakeServer, b: FakeServer, **kw) -> PirClient:
    mounts = {"http://a": a, "http://b": b}

    def route(request: httpx.Request) -> httpx.Response:
        return mounts[f"{request.url.scheme}://{request.url.host}"](request)

    return PirClient("http://a", "http://b", transport=httpx.MockTransport(route),
                     retry=FAST, **kw)


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_get_pages_in_order(encoding: str) -> None:
    a, b = FakeServer(), FakeServer()
    wanted = [5, 0, 36, 5, 17, 2, 9, 30, 31, 12, 1, 3, 4, 8]  # 14 pages: 5 queries, 2 requests
    with _client(a, b, encoding=encoding) as c:
        got = c.get(wanted)
    assert got == [PAGES[p].tobytes() for p in wanted]
    assert a.batch_sizes == b.batch_sizes == [4, 1]  # chunked at the advertised cap


def test_single_page() -> None:
    with _client(FakeServer(), FakeServer()) as c:
        assert c.get_page(36) == PAGES[36].tobytes()
        assert c.get([]) == []
        with pytest.raises(PageOutOfRange):  # an IndexError and a PirError, nothing sent
            c.get([NUM_PAGES])


def test_padding_dummies_are_in_range() -> None:
    t = plan_targets([1, 2, 3, 4], 5)
    assert len(t) == 6 and t[:4] == [1, 2, 3, 4] and all(0 <= x < 5 for x in t)


def test_epoch_mismatch_is_retried_until_consistent() -> None:
    a, b = FakeServer(epoch=1), FakeServer(epoch=2)
    with _client(a, b) as c:
        c.info()

        def catch_up() -> None:
            b.epoch = 1

        b.faults = [lambda: None, lambda: catch_up()]  # first answer from epoch 2, then 1
        assert c.get_page(3) == PAGES[3].tobytes()
    assert b.requests == 3  # /epoch, a mismatched answer, a consistent one


def test_epoch_mismatch_forever_gives_up() -> None:
    with _client(FakeServer(epoch=1), FakeServer(epoch=2)) as c, pytest.raises(PirUnavailable):
        c.get_page(3)


def test_503_and_connection_errors_are_retried() -> None:
    a, b = FakeServer(), FakeServer()

    def unavailable() -> httpx.Response:
        return httpx.Response(503, json={"error": {"code": "unavailable", "message": "x"}},
                              headers={"Retry-After": "0"})

    def refused() -> httpx.Response:
        raise httpx.ConnectError("refused")

    with _client(a, b) as c:
        c.info()
        a.faults = [unavailable, refused]
        assert c.get_page(7) == PAGES[7].tobytes()


def _serve_500() -> httpx.Response:
    """What Serve's proxy (and its HAProxy ingress) answers for a request whose replica died."""
    return httpx.Response(500, text="Internal Server Error",
                          headers={"content-type": "text/plain"})


def test_a_replica_death_is_retried_with_fresh_keys_to_both_parties() -> None:
    a, b = FakeServer(), FakeServer()
    sent: dict[str, list[bytes]] = {"a": [], "b": []}

    def route(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            sent[request.url.host].append(request.content)
        return (a if request.url.host == "a" else b)(request)

    def dropped() -> httpx.Response:
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.")

    with PirClient("http://a", "http://b", transport=httpx.MockTransport(route),
                   retry=FAST) as c:
        c.info()
        a.faults = [_serve_500, dropped, lambda: httpx.Response(504)]
        assert c.get_page(7) == PAGES[7].tobytes()
        b.faults = [lambda: httpx.Response(502)]
        assert c.get_page(8) == PAGES[8].tobytes()
    assert len(sent["a"]) == len(sent["b"]) == FAST.attempts + 2
    assert len(set(sent["a"])) == len(set(sent["b"])) == FAST.attempts + 2  # fresh keys


def test_a_5xx_that_lasts_gives_up_with_its_status() -> None:
    a, b = FakeServer(), FakeServer()
    with _client(a, b) as c:
        c.info()
        a.faults = [_serve_500] * FAST.attempts
        with pytest.raises(PirUnavailable) as exc:
            c.get_page(1)
    assert exc.value.status == 500 and f"after {FAST.attempts} attempts: HTTP 500" in str(
        exc.value)
    assert a.faults == []


def test_4xx_is_not_retried() -> None:
    a, b = FakeServer(), FakeServer()

    def bad() -> httpx.Response:
        return httpx.Response(400, json={"error": {"code": "bad_key", "message": "k"}})

    with _client(a, b) as c:
        c.info()
        a.faults = [bad, bad, bad]
        with pytest.raises(PirError) as exc:
            c.get_page(1)
    assert exc.value.status == 400 and exc.value.code == "bad_key"
    assert len(a.faults) == 2


class DomainRefuser(FakeServer):
    """Refuses every query with bad_domain while /epoch keeps advertising the same domain."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/epoch"):
            return super().__call__(request)
        self.queries = getattr(self, "queries", 0) + 1
        return httpx.Response(400, json={"error": {"code": "bad_domain", "message": "d"}})


def test_bad_domain_without_a_rotation_is_not_retried_forever() -> None:
    a = DomainRefuser()
    with _client(a, FakeServer()) as c:
        c.info()
        with pytest.raises(PirError) as exc:
            c.get_page(1)  # /epoch says the domain did not move: a client bug, raised
    assert exc.value.code == "bad_domain"
    assert a.queries == 2  # one retry (a router may have been behind), then raised


def test_one_bad_domain_from_a_lagging_router_is_retried() -> None:
    a, b = FakeServer(), FakeServer()

    def bad() -> httpx.Response:
        return httpx.Response(400, json={"error": {"code": "bad_domain", "message": "d"}})

    with _client(a, b) as c:
        c.info()
        a.faults = [bad]
        assert c.get_page(1) == PAGES[1].tobytes()


class MovedServer(FakeServer):
    """Advertises another page count (a rotation happened on this party only)."""

    def __init__(self, extra: int, **kw) -> None:
        super().__init__(**kw)
        self.extra = extra

    def epoch_doc(self) -> dict:
        doc = super().epoch_doc()
        doc["page_pir"]["num_pages"] = NUM_PAGES + self.extra
        return doc


def test_servers_with_different_matrices_are_refused() -> None:
    with _client(FakeServer(), MovedServer(1)) as c, pytest.raises(
        PirUnavailable, match="different matrices"
    ):
        c.info()


def test_a_rotation_seen_by_one_server_first_is_retried() -> None:
    a, b = FakeServer(), MovedServer(1)
    with _client(a, b) as c:
        b.faults = [lambda: setattr(b, "extra", 0)]  # B catches up after the first /epoch
        assert c.info().num_pages == NUM_PAGES


def test_bad_domain_after_a_rotation_refreshes_and_retries() -> None:
    a, b = FakeServer(), FakeServer()
    with _client(a, b) as c:
        c.info()
        stale = c._info
        c._info = type(stale)(stale.num_pages - 5, stale.domain_bits, 1, stale.max_batch_queries)

        def bad() -> httpx.Response:
            return httpx.Response(400, json={"error": {"code": "bad_domain", "message": "d"}})

        a.faults = [bad]
        assert c.get_page(2) == PAGES[2].tobytes()
        assert c.info().num_pages == NUM_PAGES  # re-read from /epoch


def test_get_with_epoch_names_the_answer_epoch() -> None:
    a, b = FakeServer(epoch=7), FakeServer(epoch=7)
    with _client(a, b) as c:
        epoch, got = c.get_with_epoch([4, 9])
        assert epoch == 7 and got == [PAGES[4].tobytes(), PAGES[9].tobytes()]
        with pytest.raises(ValueError):
            c.get_with_epoch(list(range(13)))  # more than one request (4 queries of 3)


def test_persistent_epoch_mismatch_says_so() -> None:
    with _client(FakeServer(epoch=1), FakeServer(epoch=2)) as c, pytest.raises(
        EpochMismatchError, match="different epochs"
    ) as exc:
        c.get_page(3)
    assert "A 1, B 2" in str(exc.value)


def test_async_client() -> None:
    a, b = FakeServer(), FakeServer()
    mounts = {"a": a, "b": b}

    async def route(request: httpx.Request) -> httpx.Response:
        return mounts[request.url.host](request)

    async def main() -> list[bytes]:
        async with AsyncPirClient("http://a", "http://b", encoding="msgpack",
                                  transport=httpx.MockTransport(route), retry=FAST) as c:
            return await c.get([4, 5, 6, 7, 36])

    assert asyncio.run(main()) == [PAGES[p].tobytes() for p in (4, 5, 6, 7, 36)]


class _Response:
    def __init__(self, value=None, exc: Exception | None = None) -> None:
        self.value, self.exc = value, exc

    def result(self, timeout_s=None):
        if self.exc:
            raise self.exc
        return self.value

    def __await__(self):
        async def get():
            return self.result()
        return get().__await__()


class _Method:
    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args):
        try:
            return _Response(self.fn(*args))
        except Exception as exc:  # noqa: BLE001
            return _Response(exc=exc)


class FakeHandle:
    """Duck-typed router handle over a FakeServer's data."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.fail_next = 0
        self.epoch = _Method(lambda: server.epoch_doc())
        self.query_batch = _Method(self._query_batch)

    def _query_batch(self, queries):
        if self.fail_next:
            self.fail_next -= 1
            raise WireError(503, "unavailable", "later", 0)
        parsed = wire.handle_queries(queries, domain_bits=D, max_queries=4, batch=True)
        acc = reference_scan(parsed.keys())
        return wire.answer_dict(self.server.epoch, acc, batch=True)


def test_handle_client_sync_and_async() -> None:
    ha, hb = FakeHandle(FakeServer()), FakeHandle(FakeServer())
    c = HandlePirClient(ha, hb, retry=FAST)
    hb.fail_next = 1
    assert c.get([9, 8, 7, 6]) == [PAGES[p].tobytes() for p in (9, 8, 7, 6)]
    assert asyncio.run(c.aget([1, 36])) == [PAGES[1].tobytes(), PAGES[36].tobytes()]


def test_handle_client_4xx_raises() -> None:
    ha, hb = FakeHandle(FakeServer()), FakeHandle(FakeServer())
    ha.query_batch = _Method(lambda q: (_ for _ in ()).throw(WireError(400, "bad_key", "no")))
    with pytest.raises(PirError) as exc:
        HandlePirClient(ha, hb, retry=FAST).get([1])
    assert exc.value.status == 400


def test_json_body_is_reference_shaped() -> None:
    seen: list[dict] = []
    a, b = FakeServer(), FakeServer()

    def spy(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            seen.append(json.loads(request.content))
        return (a if request.url.host == "a" else b)(request)

    with PirClient("http://a", "http://b", transport=httpx.MockTransport(spy)) as c:
        c.get([1, 2, 3])
    assert set(seen[0]) == {"keys"} and len(seen[0]["keys"]) == 3
    assert all(k.startswith("0x") and k == k.lower() for k in seen[0]["keys"])


def test_a_url_without_scheme_is_refused_at_once() -> None:
    for bad in ("127.0.0.1:8000", "localhost:8000/a", "ftp://host/a", "http://"):
        with pytest.raises(ValueError, match="needs http:// or https://"):
            PirClient(bad, "http://b:8000")


def test_a_connection_failure_names_the_server() -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    unreachable = r"cannot reach http://\w:8000/\w/ \(ConnectError\)"
    with PirClient("http://a:8000/a", "http://b:8000/b", transport=httpx.MockTransport(refused),
                   retry=RetryPolicy(attempts=2, backoff_s=0.0)) as c, \
            pytest.raises(PirUnavailable, match=unreachable):
        c.info()
