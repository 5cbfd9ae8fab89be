"""Every bad input class gets its status and a JSON error body; nothing is scanned for it."""

from __future__ import annotations

import json

import httpx
import msgpack
import pytest

from morphogen.protocol.codec import to_hex
from morphogen.protocol.dpf import generate_keys

pytestmark = pytest.mark.ray

D = 10


def _keys(d: int = D) -> list[str]:
    return [to_hex(generate_keys(d, i)[0].to_bytes()) for i in range(3)]


def _flip(hex_key: str, offset: int, value: int) -> str:
    raw = bytearray(bytes.fromhex(hex_key[2:]))
    raw[offset] = value
    return to_hex(raw)


def _q(keys: list[str]) -> bytes:
    return json.dumps({"keys": keys}).encode()


JSON = {"content-type": "application/json"}

CASES = [
    # (name, path, body, headers, status, code)
    ("no content type", "/query/page/gpu", _q(_keys()), {}, 415, "unsupported_media_type"),
    ("text/plain", "/query/page/gpu", _q(_keys()), {"content-type": "text/plain"}, 415,
     "unsupported_media_type"),
    ("invalid json", "/query/page/gpu", b'{"keys": [', JSON, 400, "bad_request"),
    ("invalid msgpack", "/query/page/gpu", b"\xc1\xc1", {"content-type": "application/msgpack"},
     400, "bad_request"),
    ("keys not a list", "/query/page/gpu", b'{"keys": "0x00"}', JSON, 422, "invalid_field"),
    ("keys of numbers", "/query/page/gpu", b'{"keys": [1, 2, 3]}', JSON, 422, "invalid_field"),
    ("missing field", "/query/page/gpu", b'{"kees": []}', JSON, 422, "invalid_field"),
    ("bad hex", "/query/page/gpu", _q(["0xZZ"] + _keys()[1:]), JSON, 422, "invalid_field"),
    ("odd hex", "/query/page/gpu", _q(["0x123"] + _keys()[1:]), JSON, 422, "invalid_field"),
    ("two keys", "/query/page/gpu", _q(_keys()[:2]), JSON, 400, "bad_key_count"),
    ("four keys", "/query/page/gpu", _q(_keys() + _keys()[:1]), JSON, 400, "bad_key_count"),
    ("short key", "/query/page/gpu", _q(["0x0011"] + _keys()[1:]), JSON, 400, "bad_key"),
    ("truncated key", "/query/page/gpu", _q([_keys()[0][:-2]] + _keys()[1:]), JSON, 400,
     "bad_key"),
    ("other domain", "/query/page/gpu", _q(_keys(D + 2)), JSON, 400, "bad_domain"),
    ("smaller domain", "/query/page/gpu", _q(_keys(D - 1)), JSON, 400, "bad_domain"),
    ("t byte 2", "/query/page/gpu", _q([_flip(_keys()[0], 35, 2)] + _keys()[1:]), JSON, 400,
     "bad_key"),
    ("party 2", "/query/page/gpu", _q([_flip(_keys()[0], 17, 2)] + _keys()[1:]), JSON, 400,
     "bad_key"),
    ("root_t != party", "/query/page/gpu", _q([_flip(_keys()[0], 16, 1)] + _keys()[1:]), JSON,
     400, "bad_key"),
    ("empty batch", "/query/page/gpu/batch", b'{"queries": []}', JSON, 400, "bad_batch"),
    ("33 queries", "/query/page/gpu/batch",
     json.dumps({"queries": [{"keys": _keys()}] * 33}).encode(), JSON, 400, "bad_batch"),
    ("batch bad key count", "/query/page/gpu/batch",
     json.dumps({"queries": [{"keys": _keys()}, {"keys": _keys()[:1]}]}).encode(), JSON, 400,
     "bad_key_count"),
    ("unknown route", "/query/page/cpu", _q(_keys()), JSON, 404, "not_found"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(parties, case) -> None:
    _, path, body, headers, status, code = case
    r = httpx.post(parties.app_url("a") + path, content=body, headers=headers)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["code"] == code and err["message"]
    assert "Traceback" not in r.text


def test_wrong_method(parties) -> None:
    r = httpx.get(parties.app_url("a") + "/query/page/gpu")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert r.headers["allow"] == "POST"
    r = httpx.post(parties.app_url("a") + "/epoch", content=b"{}", headers=JSON)
    assert r.status_code == 405


def test_declared_oversized_body_413(parties) -> None:
    body = b" " * 2_000_000
    r = httpx.post(parties.app_url("a") + "/query/page/gpu/batch", content=body, headers=JSON)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "payload_too_large"


def test_streamed_oversized_body_413(parties) -> None:
    def chunks():
        for _ in range(64):
            yield b" " * 32768  # no Content-Length: the limit is enforced while reading

    r = httpx.post(parties.app_url("a") + "/query/page/gpu/batch", content=chunks(),
                   headers=JSON)
    assert r.status_code == 413


def test_msgpack_hex_strings_are_wrong_types(parties) -> None:
    body = msgpack.packb({"keys": _keys()})
    r = httpx.post(parties.app_url("a") + "/query/page/gpu", content=body,
                   headers={"content-type": "application/msgpack"})
    assert r.status_code == 422
