"""Named tables on the wire: the `table` field of query bodies (server side), and the client
planning keys, pages and agreement of both parties over a table."""

from __future__ import annotations

import json

import msgpack
import pytest

from morphogen.client.core import ClientCore, ReadEpoch, RetryPolicy, Send
from morphogen.client.wire import (
    Answer,
    DataMoved,
    PageOutOfRange,
    TableInfo,
    Transient,
    UnknownTable,
    encode_request,
    info_from_epoch,
)
from morphogen.constants import key_length
from morphogen.party import wire
from morphogen.protocol.codec import ErrorCode, WireError
from morphogen.protocol.dpf import generate_keys

D = 9
TABLE_DOMAINS = {"small": 3, "big": 7}
FAST = RetryPolicy(attempts=3, backoff_s=0.01, max_backoff_s=0.5)


def _keys(d: int) -> list[bytes]:
    return [generate_keys(d, i)[0].to_bytes() for i in range(3)]


def _parse(obj: object, *, batch: bool, enc: str = "json"):
    if enc == "json":
        body, ct = json.dumps(obj).encode(), "application/json"
    else:
        body, ct = msgpack.packb(obj, use_bin_type=True), "application/msgpack"
    return wire.parse_queries(body, ct, batch=batch, domain_bits=D, max_queries=4,
                              tables=TABLE_DOMAINS)


@pytest.mark.parametrize("enc", ["json", "msgpack"])
def test_a_body_names_its_table_and_its_keys_are_checked_against_its_domain(enc):
    keys = _keys(3) if enc == "msgpack" else ["0x" + k.hex() for k in _keys(3)]
    one = _parse({"keys": keys, "table": "small"}, batch=False, enc=enc)
    assert one.table == "small" and one.keys.domain_bits == 3
    many = _parse({"queries": [{"keys": keys}] * 2, "table": "small"}, batch=True, enc=enc)
    assert many.table == "small" and many.num_queries == 2
    whole = _parse({"keys": _keys(D) if enc == "msgpack" else ["0x" + k.hex() for k in _keys(D)]},
                   batch=False, enc=enc)
    assert whole.table is None and whole.keys.domain_bits == D  # the reference's body
    with pytest.raises(WireError) as err:
        _parse({"keys": keys, "table": "big"}, batch=False, enc=enc)
    assert (err.value.status, err.value.code) == (400, ErrorCode.BAD_DOMAIN)
    assert "table 'big' has 7" in err.value.message
    with pytest.raises(WireError) as err:
        _parse({"keys": keys}, batch=False, enc=enc)  # table keys sent as whole-matrix keys
    assert err.value.code == ErrorCode.BAD_DOMAIN


def test_unknown_and_mistyped_tables_are_refused():
    keys = ["0x" + k.hex() for k in _keys(3)]
    with pytest.raises(WireError) as err:
        _parse({"keys": keys, "table": "nope"}, batch=False)
    assert (err.value.status, err.value.code) == (400, ErrorCode.UNKNOWN_TABLE)
    assert "'nope'" in err.value.message and "big, small" in err.value.message
    with pytest.raises(WireError) as err:
        _parse({"keys": keys, "table": 3}, batch=False)
    assert (err.value.status, err.value.code) == (422, ErrorCode.INVALID_FIELD)
    with pytest.raises(WireError) as err:
        wire.table_domain("x", D, {})
    assert "tables served: none" in err.value.message


# --------------------------------------------------------------------------- the client

def doc(epoch: int = 1, tables: dict | None = None, num_pages: int = 100) -> dict:
    out = {"epoch_id": epoch, "identity": "0x" + "11" * 16,
           "page_pir": {"num_pages": num_pages, "domain_bits": 7, "max_batch_queries": 4}}
    if tables is not None:
        out["tables"] = tables
    return out


T = {"users": {"first_page": 10, "num_pages": 20, "domain_bits": 5},
     "blobs": {"first_page": 30, "num_pages": 70, "domain_bits": 7}}


def test_server_info_carries_the_tables_both_parties_agree_on():
    info = info_from_epoch(doc(tables=T), doc(tables=T))
    assert info.tables == {"users": TableInfo(10, 20, 5), "blobs": TableInfo(30, 70, 7)}
    assert info.shape("users") == (20, 5) and info.shape(None) == (100, 7)
    assert info_from_epoch(doc(), doc()).tables == {}  # a server without tables
    other = {"users": {**T["users"], "num_pages": 21, "domain_bits": 5}}
    with pytest.raises(Transient) as err:
        info_from_epoch(doc(tables=T), doc(tables=other))
    assert err.value.kind == "matrix"
    aliasing = {"users": {"first_page": 10, "num_pages": 20, "domain_bits": 4}}
    with pytest.raises(Exception, match="table 'users'"):
        info_from_epoch(doc(tables=aliasing), doc(tables=aliasing))


def test_request_bodies_name_the_table_only_when_asked():
    keys = _keys(5)
    _, body, _ = encode_request([keys], "json", "users")
    assert json.loads(body)["table"] == "users"
    _, body, _ = encode_request([keys, keys], "msgpack", "users")
    assert msgpack.unpackb(body)["table"] == "users"
    _, body, _ = encode_request([keys], "json")
    assert "table" not in json.loads(body)  # byte-compatible with the reference


def _answers(send: Send, wanted: list[int]) -> tuple[Answer, Answer]:
    n = 3 * len(send.queries_a)
    b = [bytes([p]) * 4096 for p in wanted] + [bytes(4096)] * (n - len(wanted))
    ident = "0x" + "11" * 16
    return Answer(1, ident, [bytes(4096)] * n), Answer(1, ident, b)


def test_a_table_read_plans_keys_in_the_tables_domain_with_table_relative_pages():
    core = ClientCore(FAST)
    machine = core.get([0, 19], table="users")
    assert isinstance(next(machine), ReadEpoch)
    send = machine.send((doc(tables=T), doc(tables=T)))
    assert isinstance(send, Send) and send.table == "users"
    assert all(len(k) == key_length(5) for k in send.queries_a[0] + send.queries_b[0])
    with pytest.raises(StopIteration) as done:
        machine.send(_answers(send, [0, 19]))
    assert done.value.value == [bytes([0]) * 4096, bytes([19]) * 4096]
    with pytest.raises(PageOutOfRange):  # page 20 of a 20-page table, before any query
        next(core.get([20], table="users"))


def test_an_unknown_table_is_refused_after_one_fresh_look_before_any_query():
    core = ClientCore(FAST)
    machine = core.get([0], table="nope")
    assert isinstance(next(machine), ReadEpoch)
    assert isinstance(machine.send((doc(tables=T), doc(tables=T))), ReadEpoch)  # looks again
    with pytest.raises(UnknownTable, match="'nope'.*blobs, users"):
        machine.send((doc(tables=T), doc(tables=T)))


def test_get_pinned_plans_against_the_tables_size():
    core = ClientCore(FAST)
    machine = core.get_pinned([1], num_pages=21, table="users")
    next(machine)
    with pytest.raises(DataMoved, match="20 pages in table 'users', not 21"):
        machine.send((doc(tables=T), doc(tables=T)))
    machine = core.get_pinned([1], num_pages=20, table="users")
    send = next(machine)  # the cached info already names the table
    assert isinstance(send, Send) and send.table == "users"
    with pytest.raises(StopIteration) as done:
        machine.send(_answers(send, [1]))
    assert done.value.value.pages == [bytes([1]) * 4096]


class _Reply:
    """What a Serve handle call returns: `.result()` and awaitable."""

    def __init__(self, value) -> None:
        self.value = value

    def result(self, timeout_s=None):
        return self.value

    def __await__(self):
        async def get():
            return self.value
        return get().__await__()


class _Call:
    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args):
        return _Reply(self.fn(*args))


class _TableRouter:
    """A router handle over 100 pages serving the tables of `T`."""

    def __init__(self, model) -> None:
        self.seen: list[str | None] = []
        self.epoch = _Call(lambda: doc(tables=T))
        self.query_batch = _Call(self._query_batch)
        self.model = model

    def _query_batch(self, queries, table=None):
        from morphogen.engine.reference import ReferenceEngine

        self.seen.append(table)
        t = T[table]
        keys = wire.handle_queries(queries, domain_bits=t["domain_bits"], max_queries=4,
                                   batch=True, table=table)
        rows = self.model[t["first_page"]:t["first_page"] + t["num_pages"]]
        acc = ReferenceEngine().load(rows, 0).scan(keys)
        return {**wire.answer_dict(1, acc, batch=True), "identity": "0x" + "11" * 16}


def test_the_handle_client_sends_the_table_to_both_routers():
    import asyncio

    import numpy as np

    from morphogen.client import HandlePirClient

    model = np.random.default_rng(0).integers(0, 256, (100, 4096), np.uint8)
    ha, hb = _TableRouter(model), _TableRouter(model)
    client = HandlePirClient(ha, hb, retry=FAST)
    assert client.get([0, 19], table="users") == [model[10].tobytes(), model[29].tobytes()]
    assert asyncio.run(client.aget([69], table="blobs")) == [model[99].tobytes()]
    answer = client.get_pinned([1], num_pages=20, table="users")
    assert answer.pages == [model[11].tobytes()]
    assert ha.seen == hb.seen == ["users", "blobs", "users"]
