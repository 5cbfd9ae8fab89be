"""Server-side wire handling: hex, body limits, validation of every key, response encoding."""

from __future__ import annotations

import json

import msgpack
import numpy as np
import pytest

from morphogen.constants import key_length
from morphogen.party import wire
from morphogen.protocol.codec import ErrorCode, WireError, from_hex, max_body_bytes, to_hex
from morphogen.protocol.dpf import generate_keys

D = 9


def _keys(n: int = 3, d: int = D) -> list[bytes]:
    return [generate_keys(d, i % (1 << d))[0].to_bytes() for i in range(n)]


def _json(obj: object) -> bytes:
    return json.dumps(obj).encode()


def _parse(body: bytes, *, batch: bool, ct: str = "application/json", max_queries: int = 32):
    return wire.parse_queries(body, ct, batch=batch, domain_bits=D, max_queries=max_queries)


def _status(exc: pytest.ExceptionInfo[WireError]) -> tuple[int, str]:
    return exc.value.status, exc.value.code


def test_hex_round_trip_and_strictness() -> None:
    raw = bytes(range(20))
    assert to_hex(raw) == "0x" + raw.hex()
    assert from_hex(to_hex(raw)) == raw
    assert from_hex(raw.hex().upper()) == raw
    assert from_hex("0X" + raw.hex()) == raw
    for bad in ("0x0", "zz", "00 11", "0x00\n", "é0"):
        with pytest.raises(ValueError):
            from_hex(bad)


def test_body_limit_fits_a_full_batch() -> None:
    keys = _keys(3, 25)
    body = _json({"queries": [{"keys": [to_hex(k) for k in keys]}] * 32})
    pretty = json.dumps({"queries": [{"keys": [to_hex(k) for k in keys]}] * 32}, indent=4)
    limit = max_body_bytes(25, 32)
    assert len(body) < len(pretty.encode()) <= limit
    assert limit > 64 * 1024  # the reference's limit was too small for 23..32 queries
    assert key_length(25) == 485


def test_single_query_parses() -> None:
    keys = _keys()
    parsed = _parse(_json({"keys": [to_hex(k) for k in keys]}), batch=False)
    assert parsed.encoding == wire.JSON
    assert [k.to_bytes() for k in parsed.keys.keys()] == keys and parsed.num_queries == 1


def test_batch_msgpack_parses() -> None:
    keys = _keys(6)
    body = msgpack.packb({"queries": [{"keys": keys[:3]}, {"keys": keys[3:]}]})
    parsed = _parse(body, batch=True, ct="application/msgpack")
    assert parsed.encoding == wire.MSGPACK
    assert [k.to_bytes() for k in parsed.keys.keys()] == keys


@pytest.mark.parametrize(
    "body,status,code",
    [
        (b"{not json", 400, ErrorCode.BAD_REQUEST),
        (b"[" * 100_000, 400, ErrorCode.BAD_REQUEST),  # past the parser's depth (was a 500)
        (_json({"keys": "0x00"}), 422, ErrorCode.INVALID_FIELD),
        (_json({"keys": [1, 2, 3]}), 422, ErrorCode.INVALID_FIELD),
        (_json({"nokeys": []}), 422, ErrorCode.INVALID_FIELD),
        (_json([1, 2]), 422, ErrorCode.INVALID_FIELD),
        (_json({"keys": ["0xzz", "0x00", "0x00"]}), 422, ErrorCode.INVALID_FIELD),
        (_json({"keys": ["0x00", "0x00"]}), 400, ErrorCode.BAD_KEY_COUNT),
        (_json({"keys": ["0x00"] * 4}), 400, ErrorCode.BAD_KEY_COUNT),
        (_json({"keys": ["0x00"] * 3}), 400, ErrorCode.BAD_KEY),
    ],
)
def test_single_query_refusals(body: bytes, status: int, code: str) -> None:
    with pytest.raises(WireError) as exc:
        _parse(body, batch=False)
    assert _status(exc) == (status, code)


def _mutate(key: bytes, offset: int, value: int) -> bytes:
    b = bytearray(key)
    b[offset] = value
    return bytes(b)


@pytest.mark.parametrize(
    "mutation,code",
    [
        (lambda k: k[:-1], ErrorCode.BAD_KEY),  # length
        (lambda k: k + b"\0", ErrorCode.BAD_KEY),
        (lambda k: _mutate(k, 18, D + 1), ErrorCode.BAD_DOMAIN),  # d != advertised
        (lambda k: _mutate(k, 18, 0), ErrorCode.BAD_KEY),  # d out of range
        (lambda k: _mutate(k, 18, 40), ErrorCode.BAD_KEY),
        (lambda k: _mutate(k, 16, 2), ErrorCode.BAD_KEY),  # root_t
        (lambda k: _mutate(k, 17, 2), ErrorCode.BAD_KEY),  # party
        (lambda k: _mutate(k, 16, 1), ErrorCode.BAD_KEY),  # root_t != party
        (lambda k: _mutate(k, 35, 2), ErrorCode.BAD_KEY),  # tcw_left[0]
        (lambda k: _mutate(k, 36 + 18 * (D - 1), 7), ErrorCode.BAD_KEY),  # tcw_right[d-1]
    ],
)
def test_every_key_rule(mutation, code) -> None:
    keys = _keys()
    keys[2] = mutation(keys[2])
    with pytest.raises(WireError) as exc:
        _parse(_json({"keys": [to_hex(k) for k in keys]}), batch=False)
    assert _status(exc) == (400, code)
    assert "key 2" in exc.value.message
    assert keys[2].hex()[:16] not in exc.value.message  # never echo key bytes


def test_a_bad_key_deep_in_a_batch_is_named_by_its_query_and_key() -> None:
    queries = [_keys() for _ in range(5)]
    queries[3][1] = _mutate(queries[3][1], 36 + 18 * 2, 3)  # tcw_right at level 2
    queries[4][0] = _mutate(queries[4][0], 17, 9)  # later: not the one reported
    body = msgpack.packb({"queries": [{"keys": q} for q in queries]}, use_bin_type=True)
    with pytest.raises(WireError) as exc:
        _parse(body, batch=True, ct="application/msgpack")
    assert _status(exc) == (400, ErrorCode.BAD_KEY)
    assert exc.value.message == "query 3 key 1: control-bit correction at level 2 is not 0 or 1"


def test_key_of_another_domain_is_refused_even_if_well_formed() -> None:
    other = generate_keys(D + 3, 5)[0].to_bytes()
    keys = _keys()[:2] + [other]
    with pytest.raises(WireError) as exc:
        _parse(_json({"keys": [to_hex(k) for k in keys]}), batch=False)
    assert _status(exc) == (400, ErrorCode.BAD_DOMAIN)


def test_batch_size_limits() -> None:
    q = {"keys": [to_hex(k) for k in _keys()]}
    with pytest.raises(WireError) as exc:
        _parse(_json({"queries": []}), batch=True)
    assert _status(exc) == (400, ErrorCode.BAD_BATCH)
    with pytest.raises(WireError) as exc:
        _parse(_json({"queries": [q] * 5}), batch=True, max_queries=4)
    assert _status(exc) == (400, ErrorCode.BAD_BATCH)
    assert _parse(_json({"queries": [q] * 4}), batch=True, max_queries=4).num_queries == 4


def test_batch_error_names_the_query() -> None:
    good = [to_hex(k) for k in _keys()]
    with pytest.raises(WireError) as exc:
        _parse(_json({"queries": [{"keys": good}, {"keys": good[:2]}]}), batch=True)
    assert _status(exc) == (400, ErrorCode.BAD_KEY_COUNT)
    assert "query 1" in exc.value.message


def test_msgpack_types_are_strict() -> None:
    body = msgpack.packb({"keys": [to_hex(k) for k in _keys()]})  # str where bytes belong
    with pytest.raises(WireError) as exc:
        _parse(body, batch=False, ct="application/msgpack")
    assert exc.value.status == 422
    with pytest.raises(WireError) as exc:
        _parse(b"\xc1", batch=False, ct="application/msgpack")
    assert exc.value.status == 400


@pytest.mark.parametrize("ct", [None, "", "text/plain", "application/x-www-form-urlencoded"])
def test_content_types_refused(ct: str | None) -> None:
    with pytest.raises(WireError) as exc:
        wire.request_encoding(ct)
    assert exc.value.status == 415


def test_content_type_parameters_accepted() -> None:
    assert wire.request_encoding("application/json; charset=utf-8") == wire.JSON
    assert wire.request_encoding("Application/X-Msgpack") == wire.MSGPACK


def test_response_negotiation() -> None:
    assert wire.response_encoding(None, wire.JSON) == wire.JSON
    assert wire.response_encoding(None, wire.MSGPACK) == wire.MSGPACK
    assert wire.response_encoding("application/msgpack", wire.JSON) == wire.MSGPACK
    assert wire.response_encoding("application/json", wire.MSGPACK) == wire.JSON
    assert wire.response_encoding("*/*", wire.MSGPACK) == wire.MSGPACK


def test_encode_answer_json_and_msgpack_agree() -> None:
    rng = np.random.default_rng(1)
    acc = rng.integers(0, 256, (6, 4096), dtype=np.uint8)
    single = json.loads(wire.encode_answer(7, acc[:3], batch=False, encoding=wire.JSON))
    assert single == {"epoch_id": 7, "pages": [to_hex(r.tobytes()) for r in acc[:3]]}
    batch = json.loads(wire.encode_answer(7, acc, batch=True, encoding=wire.JSON))
    assert batch["epoch_id"] == 7
    assert [[from_hex(p) for p in r["pages"]] for r in batch["results"]] == [
        [r.tobytes() for r in acc[:3]],
        [r.tobytes() for r in acc[3:]],
    ]
    mp = msgpack.unpackb(wire.encode_answer(7, acc, batch=True, encoding=wire.MSGPACK))
    assert mp == wire.answer_dict(7, acc, batch=True)
    with pytest.raises(ValueError):
        wire.encode_answer(1, acc[:2], batch=False, encoding=wire.JSON)


def test_answers_carry_the_identity_in_every_encoding() -> None:
    acc = np.random.default_rng(2).integers(0, 256, (6, 4096), dtype=np.uint8)
    ident = "0x" + "ab" * 16
    for batch in (False, True):
        rows = acc if batch else acc[:3]
        js = json.loads(wire.encode_answer(7, rows, batch=batch, encoding=wire.JSON,
                                           identity=ident))
        mp = msgpack.unpackb(wire.encode_answer(7, rows, batch=batch, encoding=wire.MSGPACK,
                                                identity=ident))
        assert js["identity"] == mp["identity"] == ident
        assert js["epoch_id"] == mp["epoch_id"] == 7
        assert mp == wire.answer_dict(7, rows, batch=batch, identity=ident)
    with pytest.raises(ValueError):
        wire.encode_answer(7, acc[:3], batch=False, encoding=wire.JSON, identity='0x"}')


def test_handle_queries_validation() -> None:
    keys = _keys()
    out = wire.handle_queries([keys], domain_bits=D, max_queries=1, batch=False)
    assert [k.to_bytes() for k in out.keys()] == keys
    with pytest.raises(WireError) as exc:
        wire.handle_queries([[to_hex(k) for k in keys]], domain_bits=D, max_queries=1,
                            batch=False)
    assert exc.value.status == 422
    with pytest.raises(WireError) as exc:
        wire.handle_queries([keys] * 3, domain_bits=D, max_queries=2, batch=True)
    assert exc.value.status == 400


def test_wire_error_pickles_and_renders() -> None:
    import pickle

    err = WireError(503, ErrorCode.UNAVAILABLE, "later", retry_after=2)
    back = pickle.loads(pickle.dumps(err))
    assert (back.status, back.code, back.message, back.retry_after) == (503, "unavailable",
                                                                        "later", 2)
    assert json.loads(wire.error_body(back)) == {
        "error": {"code": "unavailable", "message": "later"}
    }
    assert back.headers() == {"Retry-After": "2"}


def test_a_deep_json_body_is_refused_where_the_recursion_limit_was_raised() -> None:
    """A library in the process may raise the recursion limit; the JSON parser, which
    recurses in C once a level, then overflows the stack on a deep body and the router's
    process dies (this suite's own worker did). The depth is judged before parsing. In a
    process of its own: a failure here is a crash."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.setrecursionlimit(10**7)\n"
        "from morphogen.party import wire\n"
        "from morphogen.protocol.codec import WireError\n"
        "try:\n"
        "    wire.decode_body(b'[' * 2_000_000 + b']' * 2_000_000, wire.JSON)\n"
        "except WireError as exc:\n"
        "    print(exc.status, exc.message)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("400 request body nests deeper than")
