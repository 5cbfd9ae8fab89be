"""The page client chooses the key format: packed keys where both parties' /epoch list them,
v1 keys otherwise (a reference server lists none), v1 always when asked; answers of real scans
of either format give the pages."""

from __future__ import annotations

import numpy as np
import pytest

from morphogen import engine
from morphogen.client.core import ClientCore, ReadEpoch, RetryPolicy, Send
from morphogen.client.wire import Answer, PirError
from morphogen.constants import key_length, packed_key_length
from morphogen.protocol.packed import batch_from_rows

FAST = RetryPolicy(attempts=3, backoff_s=0.001, max_backoff_s=0.01)
PAGES = np.random.default_rng(4).integers(0, 256, (37, 4096), dtype=np.uint8)
BOTH = ["v1", "packed"]


def doc(formats: list[str] | None) -> dict:
    pir = {"num_pages": 37, "domain_bits": 6, "max_batch_queries": 4}
    if formats is not None:
        pir["key_formats"] = formats
    return {"epoch_id": 1, "identity": "0x" + "11" * 16, "page_pir": pir}


def scan(queries: list[list[bytes]]) -> Answer:
    """A server's answer over PAGES, by the reference engine, for keys of either format."""
    flat = [k for q in queries for k in q]
    rows = np.frombuffer(b"".join(flat), np.uint8).reshape(len(flat), -1).copy()
    batch = batch_from_rows(rows)
    acc = engine.create("reference").load(PAGES).scan(batch)
    return Answer(1, "0x" + "11" * 16, [r.tobytes() for r in acc])


def run(core: ClientCore, docs: tuple[dict, dict], wanted: list[int]) -> tuple[Send, list]:
    machine = core.get(wanted)
    assert isinstance(next(machine), ReadEpoch)
    send = machine.send(docs)
    assert isinstance(send, Send)
    with pytest.raises(StopIteration) as done:
        machine.send((scan(send.queries_a), scan(send.queries_b)))
    return send, done.value.value


@pytest.mark.parametrize(("docs", "allowed", "length"), [
    ((doc(BOTH), doc(BOTH)), "auto", packed_key_length(6)),
    ((doc(BOTH), doc(["packed", "v1"])), "auto", packed_key_length(6)),
    ((doc(BOTH), doc(None)), "auto", key_length(6)),  # B: a reference server
    ((doc(None), doc(None)), "auto", key_length(6)),
    ((doc(BOTH), doc(["v1"])), "auto", key_length(6)),  # B: a party on GPU shards
    ((doc(BOTH), doc(BOTH)), "v1", key_length(6)),
])
def test_keys_are_packed_only_where_both_parties_take_them(docs, allowed, length):
    send, pages = run(ClientCore(FAST, key_format=allowed), docs, [5, 36, 0, 17])
    assert {len(k) for q in send.queries_a + send.queries_b for k in q} == {length}
    assert pages == [PAGES[p].tobytes() for p in (5, 36, 0, 17)]


def test_a_party_that_stops_taking_packed_keys_is_asked_again_in_v1():
    core = ClientCore(FAST)
    machine = core.get([3])
    next(machine)
    send = machine.send((doc(BOTH), doc(BOTH)))
    assert len(send.queries_a[0][0]) == packed_key_length(6)
    action = machine.throw(PirError("HTTP 400: does not take packed keys", 400, "bad_key"))
    assert isinstance(action, ReadEpoch)
    send = machine.send((doc(BOTH), doc(["v1"])))
    assert isinstance(send, Send) and len(send.queries_a[0][0]) == key_length(6)
    with pytest.raises(StopIteration) as done:
        machine.send((scan(send.queries_a), scan(send.queries_b)))
    assert done.value.value == [PAGES[3].tobytes()]


def test_a_bad_key_refusal_under_unchanged_formats_is_raised():
    core = ClientCore(FAST)
    machine = core.get([3])
    next(machine)
    machine.send((doc(BOTH), doc(BOTH)))
    machine.throw(PirError("HTTP 400: bad key", 400, "bad_key"))
    with pytest.raises(PirError, match="bad key"):
        machine.send((doc(BOTH), doc(BOTH)))


def test_key_format_option_is_checked():
    with pytest.raises(ValueError):
        ClientCore(FAST, key_format="packed-please")
