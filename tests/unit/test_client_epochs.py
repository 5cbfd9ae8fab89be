"""Rotations, updates and split parties as every client sees them: sync and async HTTP (JSON and
msgpack) and the handle client (sync and async), against fake parties that answer with the real
DPF over scripted data. Pages are compared byte for byte with the data they must come from."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from typing import Any

import httpx
import msgpack
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
)
from morphogen.constants import key_length
from morphogen.party import wire
from morphogen.protocol.codec import WireError, from_hex, to_hex
from morphogen.protocol.dpf import DpfKey, eval_range
from morphogen.snapshot.layout import domain_bits_for
from morphogen.snapshot.synthetic import synthetic_pages

FAST = RetryPolicy(attempts=4, backoff_s=0.001, max_backoff_s=0.01)
KINDS = ["json", "msgpack", "async", "handle", "ahandle"]


class World:
    """One version of the data: its pages, epoch id, identity digest (None: a reference
    server, which publishes none) and key domain."""

    def __init__(self, seed: int, num_pages: int, epoch: int, *, identity: bool = True,
                 domain_bits: int | None = None) -> None:
        self.pages = synthetic_pages(seed, 0, num_pages)
        self.num_pages, self.epoch = num_pages, epoch
        self.domain_bits = domain_bits or domain_bits_for(num_pages)
        name = f"seed {seed} epoch {epoch}".encode()
        self.digest = "0x" + hashlib.blake2b(name, digest_size=16).hexdigest() if identity else None

    def page(self, p: int) -> bytes:
        return self.pages[p].tobytes()

    def scan(self, keys: list[DpfKey]) -> np.ndarray:
        lanes = self.pages.reshape(self.num_pages, 256, 16)
        out = np.empty((len(keys), 4096), np.uint8)
        for i, k in enumerate(keys):
            masks = eval_range(k, 0, self.num_pages)
            out[i] = np.bitwise_xor.reduce(lanes & masks[:, None, :], axis=0).reshape(-1)
        return out


class Party:
    """One fake party: GET /epoch and queries over HTTP or a handle, from `world`.

    `lagging` holds worlds to answer the next queries from instead (a replica behind /epoch);
    `check_domain=False` answers keys of any domain, as a server that does not check would."""

    def __init__(self, world: World, *, check_domain: bool = True) -> None:
        self.world = world
        self.check_domain = check_domain
        self.lagging: list[World] = []
        self.epoch_reads = 0
        self.sent: list[list[list[bytes]]] = []

    def epoch_doc(self) -> dict[str, Any]:
        self.epoch_reads += 1
        w = self.world
        doc: dict[str, Any] = {
            "epoch_id": w.epoch, "num_rows": w.num_pages, "seeds": [0, 0, 0],
            "block_number": 0, "state_root": "0x" + "00" * 32,
            "page_pir": {"domain_bits": w.domain_bits, "rows_per_page": 1,
                         "num_pages": w.num_pages, "max_batch_queries": 4},
        }
        if w.digest:
            doc["identity"] = w.digest
        return doc

    def answer(self, raw: list[list[bytes]], *, hex_pages: bool) -> dict[str, Any]:
        self.sent.append(raw)
        w = self.lagging.pop(0) if self.lagging else self.world
        if self.check_domain:
            keys = wire.validate_queries(raw, wire.MSGPACK, domain_bits=w.domain_bits,
                                         max_queries=4).keys()
        else:
            keys = [DpfKey.from_bytes(k) for q in raw for k in q]
        acc = w.scan(keys)
        rows = [to_hex(r) if hex_pages else r.tobytes() for r in acc]
        out: dict[str, Any] = {"epoch_id": w.epoch}
        if w.digest:
            out["identity"] = w.digest
        out["results"] = [{"pages": rows[i : i + 3]} for i in range(0, len(rows), 3)]
        return out

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/epoch"):
            return httpx.Response(200, json=self.epoch_doc())
        packed = "msgpack" in request.headers["content-type"]
        obj = msgpack.unpackb(request.content) if packed else json.loads(request.content)
        batch = request.url.path.endswith("/batch")
        queries = obj["queries"] if batch else [obj]
        raw = [[k if packed else from_hex(k) for k in q["keys"]] for q in queries]
        try:
            out = self.answer(raw, hex_pages=not packed)
        except WireError as err:
            return httpx.Response(err.status, content=wire.error_body(err))
        if not batch:
            out["pages"] = out.pop("results")[0]["pages"]
        if packed:
            return httpx.Response(200, content=msgpack.packb(out, use_bin_type=True),
                                  headers={"content-type": "application/msgpack"})
        return httpx.Response(200, json=out)


class _Response:
    """A duck-typed DeploymentResponse: `result()` for sync code, awaitable for async."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.value, self.exc = None, None
        try:
            self.value = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the caller as a handle would
            self.exc = exc

    def result(self, timeout_s: float | None = None) -> Any:
        if self.exc:
            raise self.exc
        return self.value

    def __await__(self):
        async def get() -> Any:
            return self.result()
        return get().__await__()


class _Method:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> _Response:
        return _Response(lambda: self.fn(*args))


class FakeHandle:
    def __init__(self, party: Party) -> None:
        self.epoch = _Method(party.epoch_doc)
        self.query_batch = _Method(lambda queries: party.answer(queries, hex_pages=False))


class Client:
    """One blocking interface over the five ways to run a client."""

    def __init__(self, kind: str, a: Party, b: Party, retry: RetryPolicy = FAST) -> None:
        self.loop = asyncio.new_event_loop() if kind in ("async", "ahandle") else None
        if kind in ("json", "msgpack", "async"):
            parties = {"a": a, "b": b}

            def route(request: httpx.Request) -> httpx.Response:
                return parties[request.url.host](request)

            async def aroute(request: httpx.Request) -> httpx.Response:
                return route(request)

            if kind == "async":
                self.c: Any = AsyncPirClient("http://a", "http://b", encoding="msgpack",
                                             transport=httpx.MockTransport(aroute), retry=retry)
            else:
                self.c = PirClient("http://a", "http://b", encoding=kind,
                                   transport=httpx.MockTransport(route), retry=retry)
        else:
            self.c = HandlePirClient(FakeHandle(a), FakeHandle(b), retry=retry)
        self.prefix = "a" if kind == "ahandle" else ""

    def _call(self, name: str, *args: Any) -> Any:
        out = getattr(self.c, self.prefix + name)(*args)
        return self.loop.run_until_complete(out) if self.loop else out

    def get(self, pages: list[int]) -> list[bytes]:
        return self._call("get", pages)

    def get_with_epoch(self, pages: list[int]) -> tuple[int, list[bytes]]:
        return self._call("get_with_epoch", pages)

    def info(self, refresh: bool = False) -> Any:
        return self._call("info", refresh)

    def close(self) -> None:
        if isinstance(self.c, PirClient):
            self.c.close()
        if self.loop:
            if isinstance(self.c, AsyncPirClient):
                self.loop.run_until_complete(self.c.aclose())
            self.loop.close()


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def clients():
    made: list[Client] = []

    def make(kind: str, a: Party, b: Party, **kw: Any) -> Client:
        made.append(Client(kind, a, b, **kw))
        return made[-1]

    yield make
    for c in made:
        c.close()


def _rotate(world: World, *parties: Party) -> None:
    for p in parties:
        p.world = world


def test_shrinking_rotation_never_answers_past_the_new_end(kind: str, clients) -> None:
    old, new = World(1, 37, 1), World(2, 33, 2)
    assert old.domain_bits == new.domain_bits  # the domain alone cannot tell the rotation
    a, b = Party(old), Party(old)
    c = clients(kind, a, b)
    assert c.info().num_pages == 37
    _rotate(new, a, b)
    with pytest.raises(PageOutOfRange) as exc:
        c.get([35])  # the servers answer it (all zeros): the client must not believe that
    assert isinstance(exc.value, IndexError) and isinstance(exc.value, PirError)
    assert (exc.value.page, exc.value.num_pages) == (35, 33)
    assert (a.epoch_reads, b.epoch_reads, len(a.sent)) == (2, 2, 1)  # refreshed once
    assert c.get([3, 32, 0]) == [new.page(3), new.page(32), new.page(0)]
    assert (a.epoch_reads, len(a.sent)) == (2, 2)
    with pytest.raises(PageOutOfRange):
        c.get([1, 33])
    assert len(a.sent) == len(b.sent) == 2  # refused before anything was sent


def test_pages_below_the_new_end_are_accepted_with_one_refresh(kind: str, clients) -> None:
    old, new = World(1, 37, 1), World(2, 33, 2)
    a, b = Party(old), Party(old)
    c = clients(kind, a, b)
    c.info()
    _rotate(new, a, b)
    assert c.get_with_epoch([0, 32, 5]) == (2, [new.page(0), new.page(32), new.page(5)])
    assert (a.epoch_reads, b.epoch_reads, len(a.sent), len(b.sent)) == (2, 2, 1, 1)
    info = c.info()
    assert (info.num_pages, info.epoch_id, info.identity) == (33, 2, new.digest)


def test_other_data_under_the_same_epoch_id_is_vouched_for_by_identity(kind: str,
                                                                       clients) -> None:
    """A snapshot rebuilt in place keeps its epoch id; only the identity tells. The answer is
    kept once /epoch shows both parties on exactly that data."""
    old, rebuilt = World(1, 37, 1), World(5, 37, 1)
    a, b = Party(old), Party(old)
    c = clients(kind, a, b)
    c.info()
    _rotate(rebuilt, a, b)
    assert c.get([4, 36]) == [rebuilt.page(4), rebuilt.page(36)]
    assert (a.epoch_reads, b.epoch_reads, len(a.sent)) == (2, 2, 1)
    assert c.info().identity == rebuilt.digest


def test_parties_serving_different_data_under_one_epoch_are_refused(kind: str,
                                                                    clients) -> None:
    a, b = Party(World(1, 37, 4)), Party(World(9, 37, 4))
    c = clients(kind, a, b)
    with pytest.raises(PirUnavailable, match="different data under epoch 4") as exc:
        c.get([1])
    assert not isinstance(exc.value, EpochMismatchError)
    assert len(a.sent) == len(b.sent) == FAST.attempts


def test_a_domain_change_refused_by_the_servers_replans_the_keys(kind: str, clients) -> None:
    old, new = World(1, 37, 1), World(2, 100, 2)
    a, b = Party(old), Party(old)
    c = clients(kind, a, b)
    c.info()
    _rotate(new, a, b)
    assert c.get([5, 36]) == [new.page(5), new.page(36)]  # bad_domain, /epoch, new keys
    assert [len(q[0][0]) for q in a.sent] == [key_length(6), key_length(7)]
    assert c.info().num_pages == 100
    assert c.get([99]) == [new.page(99)]


def test_a_domain_change_seen_only_in_the_answer_replans_the_keys(kind: str, clients) -> None:
    """The answer names data in another domain: it is not kept, even if it looks right."""
    old, new = World(1, 37, 1), World(2, 60, 2, domain_bits=7)
    a, b = Party(old, check_domain=False), Party(old, check_domain=False)
    c = clients(kind, a, b)
    c.info()
    _rotate(new, a, b)
    epoch, got = c.get_with_epoch([5, 36])
    assert (epoch, got) == (2, [new.page(5), new.page(36)])
    assert [len(q[0][0]) for q in b.sent] == [key_length(6), key_length(7)]
    assert (a.epoch_reads, b.epoch_reads) == (2, 2)


def test_an_answer_from_a_lagging_replica_is_asked_again(kind: str, clients) -> None:
    old, new = World(1, 37, 1), World(2, 37, 2)
    a, b = Party(new), Party(new)
    c = clients(kind, a, b)
    c.info()
    a.lagging, b.lagging = [old], [old]  # /epoch says 2, the first answers come from 1
    assert c.get_with_epoch([7, 8, 9]) == (2, [new.page(7), new.page(8), new.page(9)])
    assert (len(a.sent), a.epoch_reads) == (2, 2)


def test_answers_from_data_no_party_advertises_are_never_returned(kind: str,
                                                                  clients) -> None:
    old, new = World(1, 37, 1), World(2, 37, 2)
    a, b = Party(new), Party(new)
    c = clients(kind, a, b)
    c.info()
    a.lagging, b.lagging = [old] * 10, [old] * 10
    with pytest.raises(PirUnavailable):
        c.get([7])
    assert len(a.sent) == FAST.attempts


@pytest.mark.parametrize("rotate", [False, True])
def test_reference_servers_without_identity(kind: str, clients, rotate: bool) -> None:
    old, new = World(1, 37, 1, identity=False), World(2, 33, 2, identity=False)
    a, b = Party(old), Party(old)
    c = clients(kind, a, b)
    assert c.info().identity is None
    world = old
    if rotate:
        _rotate(new, a, b)
        world = new
        with pytest.raises(PageOutOfRange):
            c.get([34])
    assert c.get([0, 31, 2, 6]) == [world.page(p) for p in (0, 31, 2, 6)]
    assert a.epoch_reads == (2 if rotate else 1)


def test_one_party_without_identity_is_checked_by_epoch(kind: str, clients) -> None:
    a, b = Party(World(1, 37, 3)), Party(World(1, 37, 3, identity=False))
    c = clients(kind, a, b)
    assert c.get([10, 20]) == [a.world.page(10), a.world.page(20)]
    assert a.epoch_reads == 1


def test_epoch_mismatch_still_ends_in_epoch_mismatch_error(kind: str, clients) -> None:
    a, b = Party(World(1, 37, 1)), Party(World(1, 37, 2))
    c = clients(kind, a, b)
    with pytest.raises(EpochMismatchError, match="A 1, B 2"):
        c.get([1])


def test_a_grown_snapshot_is_found_through_the_next_answer(kind: str, clients) -> None:
    old, new = World(1, 37, 1), World(2, 50, 2)
    a, b = Party(old), Party(old)
    c = clients(kind, a, b)
    c.info()
    _rotate(new, a, b)
    with pytest.raises(PageOutOfRange):
        c.get([45])  # past the end the client knows: nothing sent, nothing refreshed
    assert (len(a.sent), a.epoch_reads) == (0, 1)
    assert c.get([3]) == [new.page(3)]
    assert c.get([45]) == [new.page(45)]
