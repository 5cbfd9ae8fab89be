"""Admin wire models: update and snapshot bodies, the compact change batch, the admin client."""

from __future__ import annotations

import json

import httpx
import msgpack
import numpy as np
import pytest

from morphogen.client import PirError, PirUnavailable, encode_updates
from morphogen.client.admin import AdminClient
from morphogen.party import admin_wire
from morphogen.protocol.changes import ChangeBatch, PageUpdate, PageWrite
from morphogen.protocol.codec import ErrorCode, WireError, admin_body_bytes, to_hex

TOKEN = "admin-token-for-tests-0123456789"
JSON = "application/json"
MSGPACK = "application/msgpack"


def _diff(seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, 4096, np.uint8).tobytes()


def _parse(body: bytes, ct: str = JSON, num_pages: int = 100, max_updates: int = 8):
    return admin_wire.parse_updates(body, ct, num_pages=num_pages, max_updates=max_updates)


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_updates_round_trip(encoding: str) -> None:
    changes = [(5, "diff", _diff(1)), (7, "data", b"\x01\x02\x03"), (5, "data", _diff(2))]
    body = encode_updates(changes, encoding)
    batch = _parse(body, JSON if encoding == "json" else MSGPACK)
    assert len(batch) == 3 and batch.max_page() == 7
    assert batch.pages.tolist() == [5, 7, 5]
    assert batch.replace.tolist() == [False, True, True]
    objs = batch.select(0, 100)
    assert objs[0] == PageUpdate(5, _diff(1))
    assert isinstance(objs[1], PageWrite) and objs[1].data[:3] == b"\x01\x02\x03"
    assert objs[1].data[3:] == bytes(4093)  # replacement data is zero-padded
    assert [c.page for c in batch.select(6, 8)] == [7]


def _err(body: bytes, ct: str = JSON, **kw) -> tuple[int, str, str]:
    with pytest.raises(WireError) as exc:
        _parse(body, ct, **kw)
    return exc.value.status, exc.value.code, exc.value.message


def _body(*items: dict) -> bytes:
    return json.dumps({"updates": list(items)}).encode()


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (_body({"page": 100, "diff": to_hex(_diff(0))}), 400, ErrorCode.BAD_UPDATE),
        (_body({"page": -1, "diff": to_hex(_diff(0))}), 400, ErrorCode.BAD_UPDATE),
        (_body({"page": 1}), 400, ErrorCode.BAD_UPDATE),
        (_body({"page": 1, "diff": to_hex(_diff(0)), "data": "0x00"}), 400, ErrorCode.BAD_UPDATE),
        (_body({"page": 1, "diff": "0x0011"}), 400, ErrorCode.BAD_UPDATE),
        (_body({"page": 1, "data": to_hex(bytes(4097))}), 400, ErrorCode.BAD_UPDATE),
        (_body(), 400, ErrorCode.BAD_UPDATE),
        (_body(*[{"page": 1, "data": "0x00"}] * 9), 400, ErrorCode.BAD_UPDATE),
        (_body({"page": 1, "diff": "0xZZ"}), 422, ErrorCode.INVALID_FIELD),
        (_body({"page": "1", "data": "0x00"}), 422, ErrorCode.INVALID_FIELD),
        (_body({"page": True, "data": "0x00"}), 422, ErrorCode.INVALID_FIELD),
        (_body({"page": 1, "dat": "0x00"}), 422, ErrorCode.INVALID_FIELD),
        (b'{"updates": "x"}', 422, ErrorCode.INVALID_FIELD),
        (b'{"updates": [', 400, ErrorCode.BAD_REQUEST),
    ],
)
def test_bad_update_bodies(body: bytes, status: int, code: str) -> None:
    got_status, got_code, message = _err(body)
    assert (got_status, got_code) == (status, code)
    assert "0x" + "00" * 8 not in message  # never page contents


def test_msgpack_updates_need_raw_bytes() -> None:
    body = msgpack.packb({"updates": [{"page": 1, "data": "0x00"}]}, use_bin_type=True)
    assert _err(body, MSGPACK)[:2] == (422, ErrorCode.INVALID_FIELD)
    assert _err(b"x", "text/plain")[:2] == (415, ErrorCode.UNSUPPORTED_MEDIA_TYPE)


def test_error_messages_never_echo_page_contents() -> None:
    secret = bytes(range(256)) * 16
    _, _, message = _err(_body({"page": 500, "diff": to_hex(secret)}))
    assert "page 500" in message and secret.hex()[:32] not in message


def test_admin_body_limit_fits_a_full_json_request() -> None:
    items = [{"page": 2**31, "diff": to_hex(_diff(i % 4))} for i in range(1024)]
    body = json.dumps({"updates": items}, indent=1).encode()
    assert len(body) <= admin_body_bytes(1024)
    batch = _parse(body, num_pages=2**32, max_updates=1024)
    assert len(batch) == 1024


def test_snapshot_request() -> None:
    assert admin_wire.parse_snapshot_request(b'{"path": "rot/1"}', JSON) == "rot/1"
    body = msgpack.packb({"path": "x"}, use_bin_type=True)
    assert admin_wire.parse_snapshot_request(body, MSGPACK) == "x"
    for bad, status in ((b'{"path": 3}', 422), (b"{}", 422), (b'{"path": ""}', 400)):
        with pytest.raises(WireError) as exc:
            admin_wire.parse_snapshot_request(bad, JSON)
        assert exc.value.status == status


def test_change_batch_checks_itself() -> None:
    with pytest.raises(ValueError):
        ChangeBatch(np.array([1, 2]), np.array([False]), bytes(8192))
    with pytest.raises(ValueError):
        ChangeBatch(np.array([1]), np.array([False]), bytes(10))
    with pytest.raises(ValueError):
        ChangeBatch(np.array([-1]), np.array([False]), bytes(4096))
    changes = [PageUpdate(3, _diff(3)), PageWrite(4, b"\x09")]
    batch = ChangeBatch.from_changes(changes)
    assert batch.select(0, 10) == [changes[0], PageWrite(4, b"\x09" + bytes(4095))]
    assert len(ChangeBatch.from_changes([])) == 0 and ChangeBatch.from_changes([]).max_page() < 0


def test_admin_client_sends_the_token_and_maps_errors() -> None:
    seen: list[httpx.Request] = []

    def route(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        path = request.url.path
        if path.endswith("/admin/status"):
            return httpx.Response(200, json={"epoch_id": 3})
        if path.endswith("/admin/snapshot"):
            return httpx.Response(401, json={"error": {"code": "unauthorized", "message": "no"}})
        return httpx.Response(503, json={"error": {"code": "unavailable", "message": "busy"}},
                              headers={"Retry-After": "1"})

    with AdminClient("http://a/x", TOKEN, transport=httpx.MockTransport(route)) as c:
        assert TOKEN not in repr(c)
        assert c.status() == {"epoch_id": 3}
        with pytest.raises(PirError) as exc:
            c.snapshot("s")
        assert exc.value.status == 401 and TOKEN not in str(exc.value)
        with pytest.raises(PirUnavailable):
            c.updates([(1, "diff", _diff(1))])
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in seen)
    assert msgpack.unpackb(seen[-1].content)["updates"][0]["page"] == 1
    with pytest.raises(ValueError):
        encode_updates([(1, "xor", b"")])


def test_the_part_headers_of_a_publication_in_parts():
    from morphogen.party.admin_wire import part_of

    digest = "ab" * 32
    assert part_of(None, None) is None
    assert part_of("1/1", digest) == (1, 1, digest)
    assert part_of("3/12", digest) == (3, 12, digest)
    for bad_part in ("0/3", "4/3", "1/0", "1/100000", "a/b", "1-3", "", " 1/3", "01/3"):
        with pytest.raises(WireError) as err:
            part_of(bad_part, digest)
        assert err.value.status == 400 and "Morphogen-Part" in err.value.message
    for bad_digest in (None, "AB" * 32, "ab" * 31, "zz" * 32):
        with pytest.raises(WireError) as err:
            part_of("1/2", bad_digest)
        assert err.value.status == 400 and "Morphogen-Batch" in err.value.message
