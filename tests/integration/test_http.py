"""HTTP and handle round trips against real Serve applications (party A: 3 shards, B: 2)."""

from __future__ import annotations

import asyncio
import json
import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import msgpack
import numpy as np
import pytest

from morphogen.client import AsyncPirClient, HandlePirClient, PirClient
from morphogen.protocol.codec import from_hex, to_hex
from morphogen.protocol.dpf import generate_keys

from . import spec_client
from .conftest import NUM_PAGES

pytestmark = pytest.mark.ray

D = 10  # ceil(log2(640))


def _post(url: str, body: bytes, ct: str | None = "application/json", **headers: str):
    h = dict(headers)
    if ct is not None:
        h["content-type"] = ct
    return httpx.post(url, content=body, headers=h, timeout=30)


def _pairs(targets: list[int]):
    pairs = [generate_keys(D, t) for t in targets]
    return [p[0].to_bytes() for p in pairs], [p[1].to_bytes() for p in pairs]


def _xor(a: bytes, b: bytes) -> bytes:
    return (np.frombuffer(a, np.uint8) ^ np.frombuffer(b, np.uint8)).tobytes()


def test_epoch_advertises_real_page_count_and_domain(parties) -> None:
    for app in ("a", "b"):
        doc = httpx.get(parties.app_url(app) + "/epoch").json()
        assert doc["page_pir"]["num_pages"] == NUM_PAGES
        assert doc["page_pir"]["domain_bits"] == D
        assert doc["epoch_id"] == 1
        assert set(doc) >= {"epoch_id", "num_rows", "seeds", "block_number", "state_root"}
        assert doc["state_root"].startswith("0x") and len(doc["state_root"]) == 66
    a = httpx.get(parties.app_url("a") + "/epoch").json()
    assert a["page_pir"]["num_shards"] == 3


def test_health(parties) -> None:
    r = httpx.get(parties.app_url("a") + "/health")
    assert r.status_code == 200
    body = r.json()
    identity = body.pop("identity")
    assert body == {"status": "ok", "epoch_id": 1, "block_number": 0,
                    "pending_updates": 0, "rotation_in_progress": False}
    # the same data behind party A (3 shards) and B (2 shards): the same identity
    assert identity == httpx.get(parties.app_url("b") + "/health").json()["identity"]
    assert identity == httpx.get(parties.app_url("a") + "/epoch").json()["identity"]


def test_raw_json_single_query_matches_pages(parties, pages) -> None:
    """Speaks PROTOCOL.md JSON by hand: no project client code on the wire."""
    ka, kb = _pairs([5, 639, 123])
    ra = _post(parties.app_url("a") + "/query/page/gpu",
               json.dumps({"keys": [to_hex(k) for k in ka]}).encode())
    rb = _post(parties.app_url("b") + "/query/page/gpu",
               json.dumps({"keys": [k.hex().upper() for k in kb]}).encode())  # no 0x, caps
    assert ra.status_code == rb.status_code == 200
    assert ra.headers["content-type"].startswith("application/json")
    da, db = ra.json(), rb.json()
    assert da["epoch_id"] == db["epoch_id"] == 1
    got = [_xor(from_hex(x), from_hex(y)) for x, y in zip(da["pages"], db["pages"], strict=True)]
    assert got == [pages[5].tobytes(), pages[639].tobytes(), pages[123].tobytes()]
    assert all(p.startswith("0x") and p == p.lower() for p in da["pages"])


def test_raw_msgpack_batch(parties, pages) -> None:
    targets = list(range(0, 30))
    ka, kb = _pairs(targets)
    out = []
    for app, keys in (("a", ka), ("b", kb)):
        body = msgpack.packb({"queries": [{"keys": keys[i : i + 3]} for i in range(0, 30, 3)]})
        r = _post(parties.app_url(app) + "/query/page/gpu/batch", body, "application/msgpack")
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/msgpack"
        doc = msgpack.unpackb(r.content)
        assert doc["epoch_id"] == 1 and len(doc["results"]) == 10
        out.append([p for res in doc["results"] for p in res["pages"]])
    assert [_xor(x, y) for x, y in zip(*out, strict=True)] == [pages[t].tobytes() for t in targets]


def test_json_request_msgpack_answer_by_accept(parties) -> None:
    ka, _ = _pairs([1, 2, 3])
    r = _post(parties.app_url("a") + "/query/page/gpu",
              json.dumps({"keys": [to_hex(k) for k in ka]}).encode(),
              accept="application/msgpack")
    assert r.status_code == 200 and r.headers["content-type"] == "application/msgpack"
    assert len(msgpack.unpackb(r.content)["pages"]) == 3


def test_full_batch_pretty_printed_fits(parties) -> None:
    ka, _ = _pairs([random.randrange(NUM_PAGES) for _ in range(96)])
    body = json.dumps({"queries": [{"keys": [to_hex(k) for k in ka[i : i + 3]]}
                                   for i in range(0, 96, 3)]}, indent=8).encode()
    r = _post(parties.app_url("a") + "/query/page/gpu/batch", body)
    assert r.status_code == 200, r.text
    assert len(r.json()["results"]) == 32


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_client_different_shard_counts(parties, pages, encoding: str) -> None:
    wanted = random.sample(range(NUM_PAGES), 40) + [0, NUM_PAGES - 1]
    with PirClient(parties.app_url("a"), parties.app_url("b"), encoding=encoding) as c:
        assert c.info().num_pages == NUM_PAGES
        assert c.get(wanted) == [pages[p].tobytes() for p in wanted]


def test_async_client(parties, pages) -> None:
    async def main():
        async with AsyncPirClient(parties.app_url("a"), parties.app_url("b")) as c:
            return await asyncio.gather(c.get([1, 2, 3, 4]), c.get([600, 601]))

    first, second = asyncio.run(main())
    assert first == [pages[p].tobytes() for p in (1, 2, 3, 4)]
    assert second == [pages[p].tobytes() for p in (600, 601)]


def test_handles(parties, pages) -> None:
    from ray import serve

    ha, hb = serve.get_app_handle("a"), serve.get_app_handle("b")
    c = HandlePirClient(ha, hb)
    wanted = [7, 8, 9, 10, 639]
    assert c.get(wanted) == [pages[p].tobytes() for p in wanted]
    assert asyncio.run(c.aget([11])) == [pages[11].tobytes()]
    doc = ha.epoch.remote().result()
    assert doc["page_pir"]["num_pages"] == NUM_PAGES
    ka, kb = _pairs([42, 43, 44])
    a = ha.query.remote(ka).result()
    b = hb.query.remote(kb).result()
    assert _xor(a["pages"][0], b["pages"][0]) == pages[42].tobytes()


def test_handle_refuses_bad_keys(parties) -> None:
    from ray import serve

    from morphogen.protocol.codec import WireError

    ha = serve.get_app_handle("a")
    wrong = [generate_keys(D + 1, 1)[0].to_bytes()] * 3
    with pytest.raises(WireError) as exc:
        ha.query.remote(wrong).result()
    assert exc.value.status == 400 and exc.value.code == "bad_domain"


def test_32_concurrent_clients(parties, pages) -> None:
    def one(seed: int) -> bool:
        rng = random.Random(seed)
        wanted = [rng.randrange(NUM_PAGES) for _ in range(3)]
        with PirClient(parties.app_url("a"), parties.app_url("b"), timeout_s=60) as c:
            return c.get(wanted) == [pages[p].tobytes() for p in wanted]

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, range(32)))
    assert all(results)


def test_concurrent_requests_are_coalesced(parties) -> None:
    from ray import serve

    ha = serve.get_app_handle("a")
    before = ha.stats.remote().result()
    ka, _ = _pairs([1, 2, 3])
    body = json.dumps({"keys": [to_hex(k) for k in ka]}).encode()

    def one(_: int) -> int:
        return _post(parties.app_url("a") + "/query/page/gpu", body).status_code

    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(one, range(48)))
    assert codes == [200] * 48
    after = ha.stats.remote().result()
    submissions = after["submissions"] - before["submissions"]
    calls = after["calls"] - before["calls"]
    assert submissions == 48
    assert calls < submissions  # merged into fewer shard passes


def test_packed_keys_over_http_by_the_spec_client_and_the_project_client(parties, pages) -> None:
    """docs/packed-keys.md by hand (the spec client's key generation, no project code on the
    wire), then the project's client, which picks packed keys since both parties list them."""
    url_a, url_b = parties.app_url("a"), parties.app_url("b")
    for url in (url_a, url_b):
        assert httpx.get(url + "/epoch").json()["page_pir"]["key_formats"] == ["v1", "packed"]
    targets = [0, 639, 128, 127, 5, 300]
    pairs = [spec_client.packed_keygen(D, t) for t in targets]
    got = []
    for i, url in enumerate((url_a, url_b)):
        body = {"queries": [{"keys": [to_hex(p[i]) for p in pairs[j:j + 3]]}
                            for j in (0, 3)]}
        r = _post(url + "/query/page/gpu/batch", json.dumps(body).encode())
        assert r.status_code == 200, r.text
        got.append([from_hex(p) for res in r.json()["results"] for p in res["pages"]])
    assert [_xor(a, b) for a, b in zip(*got, strict=True)] == [pages[t].tobytes()
                                                               for t in targets]
    mixed = {"keys": [to_hex(pairs[0][0]), to_hex(_pairs([1])[0][0]), to_hex(pairs[1][0])]}
    r = _post(url_a + "/query/page/gpu", json.dumps(mixed).encode())
    assert r.status_code == 400 and "mixes key formats" in r.text
    with PirClient(url_a, url_b) as client:
        assert client.info().key_format() == "packed"
        assert client.get([7, 600]) == [pages[7].tobytes(), pages[600].tobytes()]
