"""CORS over real HTTP: a party whose configuration lists a page's origin answers that page's
preflights and echoes its origin on the query routes; other origins, the admin routes and a
party listing none get no CORS header (morphogen/protocol/cors.py)."""

from __future__ import annotations

import httpx
import pytest

from morphogen.protocol.codec import (
    ADMIN_STATUS_PATH,
    ADMIN_UPDATES_PATH,
    BATCH_PATH,
    EPOCH_PATH,
    QUERY_PATH,
)
from morphogen.protocol.dpf import generate_keys

from .conftest import delete_apps, deploy

pytestmark = pytest.mark.ray

PAGE = "http://127.0.0.1:5173"
OTHER = "https://evil.example"
ACAO = "access-control-allow-origin"


@pytest.fixture(scope="module")
def party(serve_instance):
    deploy(serve_instance, "corsa", num_shards=1, cors_origins=[PAGE])
    yield serve_instance.app_url("corsa")
    delete_apps("corsa")


def preflight(url: str, origin: str, method: str = "POST") -> httpx.Response:
    return httpx.options(url, headers={"Origin": origin,
                                       "Access-Control-Request-Method": method,
                                       "Access-Control-Request-Headers": "content-type"})


def query(url: str, origin: str, body: dict) -> httpx.Response:
    return httpx.post(url + QUERY_PATH, json=body, headers={"Origin": origin}, timeout=30)


def test_preflights_are_answered_for_the_listed_origin_only(party) -> None:
    for path, method in ((QUERY_PATH, "POST"), (BATCH_PATH, "POST"), (EPOCH_PATH, "GET")):
        r = preflight(party + path, PAGE, method)
        assert r.status_code == 204, r.text
        assert r.headers[ACAO] == PAGE
        assert method in r.headers["access-control-allow-methods"]
        assert "content-type" in r.headers["access-control-allow-headers"].lower()
        refused = preflight(party + path, OTHER, method)
        assert refused.status_code == 403 and ACAO not in refused.headers
    assert preflight(party + QUERY_PATH, PAGE, "PUT").status_code == 403


def test_answers_echo_the_listed_origin_errors_included(party) -> None:
    keys = [k.to_bytes() for k in generate_keys(10, 3)][:1] * 3
    good = query(party, PAGE, {"keys": ["0x" + k.hex() for k in keys]})
    assert good.status_code == 200 and good.headers[ACAO] == PAGE
    assert good.headers["vary"] == "Origin"
    assert "retry-after" in good.headers["access-control-expose-headers"].lower()
    bad = query(party, PAGE, {"keys": ["0x00"]})
    assert bad.status_code == 400 and bad.headers[ACAO] == PAGE  # the page reads why
    epoch = httpx.get(party + EPOCH_PATH, headers={"Origin": PAGE})
    assert epoch.status_code == 200 and epoch.headers[ACAO] == PAGE
    for r in (query(party, OTHER, {"keys": ["0x" + k.hex() for k in keys]}),
              httpx.get(party + EPOCH_PATH, headers={"Origin": OTHER}),
              httpx.get(party + EPOCH_PATH)):
        assert r.status_code == 200 and ACAO not in r.headers


def test_admin_routes_are_never_open_to_a_page(party) -> None:
    assert ACAO not in preflight(party + ADMIN_UPDATES_PATH, PAGE).headers
    for r in (httpx.post(party + ADMIN_UPDATES_PATH, json={}, headers={"Origin": PAGE}),
              httpx.get(party + ADMIN_STATUS_PATH, headers={"Origin": PAGE})):
        assert r.status_code in (401, 403) and not any(
            h.startswith("access-control-") for h in r.headers), r.headers


def test_a_party_listing_no_origin_answers_no_page(parties) -> None:
    r = httpx.get(parties.app_url("a") + EPOCH_PATH, headers={"Origin": PAGE})
    assert r.status_code == 200 and ACAO not in r.headers
    assert preflight(parties.app_url("a") + QUERY_PATH, PAGE).status_code == 403
