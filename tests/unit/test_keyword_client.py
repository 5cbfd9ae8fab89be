"""The keyword client as the servers see it: padded request shapes, table changes under a
long-lived client that every key meets alike, and a client that never goes back to an older
table. Fake parties answer with the real DPF over keyword tables (`_pir_fakes`)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from _pir_fakes import FAST, Client, Party, World
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from morphogen.client import Answer, ServerInfo
from morphogen.keyword import (
    AsyncKeywordClient,
    KeywordClient,
    KeywordIntegrityError,
    StaleTableError,
    build_table,
    request_sizes,
)
from morphogen.keyword import lookup as kwlookup
from morphogen.keyword.verify import ANSWER_FAILED

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
PUB = KEY.public_key()


def records(n: int, seed: int) -> dict[bytes, bytes]:
    rng = random.Random(seed)
    return {rng.randbytes(20): rng.randbytes(32) for _ in range(n)}


DATASET = bytes(range(16))  # one table's, whatever it holds and however it is rebuilt


def table(recs: dict[bytes, bytes], dataset: bytes = DATASET) -> Any:
    # one-row buckets: a few hundred records already span tens of pages
    return build_table(recs.items(), value_size=32, signing_key=KEY, layout="row",
                       row_size=128, load=0.8, dataset=dataset)


def bumped(t: Any, versions: int = 1) -> np.ndarray:
    """The table's pages under a later version (the same records, a re-signed descriptor)."""
    desc = t.descriptor
    for _ in range(versions):
        desc = desc.bumped(desc.root, desc.records, time=desc.time)
    pages = t.pages.copy()
    pages[-1] = np.frombuffer(desc.to_page(KEY), np.uint8)
    return pages


class PagePir:
    """A page client without the DPF: `get_pinned` straight from a table's pages, counting
    the lookups (queries of three pages) each request carries."""

    def __init__(self, pages: np.ndarray, max_batch: int = 32, epoch: int = 1) -> None:
        self.pages, self.max_batch, self.epoch = pages, max_batch, epoch
        self.requests: list[int] = []
        self.corrupt_last = self.corrupt_all = False

    def info(self, refresh: bool = False) -> ServerInfo:
        n = len(self.pages)
        return ServerInfo(n, max(1, (n - 1).bit_length()), self.epoch, self.max_batch)

    def get_pinned(self, pages: list[int], num_pages: int) -> Answer:
        assert num_pages == len(self.pages)
        # as the page clients do: pages go three to a query, the last query padded
        assert len(pages) <= 3 * self.max_batch
        self.requests.append(-(-len(pages) // 3))
        got = [self.pages[p].tobytes() for p in pages]
        if self.corrupt_all or (self.corrupt_last and len(pages) > 3):
            got[-1] = got[-1][:-1] + bytes([got[-1][-1] ^ 1])
        return Answer(self.epoch, None, got)


# -- one version shared ------------------------------------------------------------------------

def test_clients_sharing_a_version_read_its_descriptor_once_and_each_a_new_one() -> None:
    recs = records(200, seed=5)
    t = table(recs)
    pir = PagePir(t.pages)
    shared = kwlookup.SharedVersion()
    a, b = (KeywordClient(pir, PUB, shared=shared) for _ in range(2))
    key = sorted(recs)[0]
    assert a.get(key) == recs[key]
    asked = len(pir.requests)
    assert b.get(key) == recs[key]
    assert len(pir.requests) == asked + 1  # the lookup alone: a's descriptor served b
    alone = KeywordClient(pir, PUB)
    pir.requests.clear()
    assert alone.get(key) == recs[key]
    assert len(pir.requests) > 1  # descriptor, whole levels, then the lookup
    # a new version: the first client to meet it reads it for both
    pir.pages, pir.epoch = bumped(t), 2
    assert a.get(key) == recs[key] and a.descriptor().version == t.descriptor.version + 1
    pir.requests.clear()
    assert b.get(key) == recs[key] and b.descriptor().version == t.descriptor.version + 1
    assert len(pir.requests) == 1


# -- padded batches ----------------------------------------------------------------------------

def test_request_sizes_are_full_requests_then_one_bucket() -> None:
    assert request_sizes(0, 32) == []
    assert [request_sizes(n, 32) for n in (1, 2, 3, 5, 9, 17, 32)] == [
        [1], [2], [4], [8], [16], [32], [32]]
    assert request_sizes(70, 32) == [32, 32, 8]
    assert request_sizes(11, 5) == [5, 5, 1] and request_sizes(4, 5) == [4]
    assert request_sizes(3, 5) == [4] and request_sizes(5, 5) == [5]


def test_every_request_is_a_bucket_and_the_values_are_unchanged() -> None:
    recs = records(400, seed=1)
    pir = PagePir(table(recs).pages)
    kc = KeywordClient(pir, PUB)
    kc.descriptor()
    rng = random.Random(2)
    present = sorted(recs)
    for n in range(1, 71):
        keys = [rng.choice(present) if rng.random() < 0.7 else rng.randbytes(20)
                for _ in range(n)]
        pir.requests.clear()
        assert kc.get_many(keys) == [recs.get(k) for k in keys]
        assert pir.requests == request_sizes(n, 32), n
        assert set(pir.requests) <= {1, 2, 4, 8, 16, 32}


def test_padding_answers_are_dropped_even_when_they_hold_records(monkeypatch) -> None:
    recs = records(400, seed=3)
    pir = PagePir(table(recs).pages, max_batch=8)
    kc = KeywordClient(pir, PUB)
    present = sorted(recs)
    # padding keys that the table holds: their values must still never reach the caller
    fillers = iter(present[100:])
    monkeypatch.setattr(kwlookup.secrets, "token_bytes", lambda n: next(fillers))
    keys = [present[0], b"absent-key", present[1]]
    assert kc.get_many(keys) == [recs[present[0]], None, recs[present[1]]]
    assert pir.requests[-1] == 4


def test_a_server_lying_about_the_descriptor_too_gives_the_one_error() -> None:
    recs = records(400, seed=4)
    pir = PagePir(table(recs).pages)
    kc = KeywordClient(pir, PUB)
    kc.descriptor()
    pir.corrupt_all = True
    for key in (sorted(recs)[0], b"absent"):
        with pytest.raises(KeywordIntegrityError) as exc:
            kc.get(key)
        assert str(exc.value) == ANSWER_FAILED
    # the descriptor and the tree's top (read whole), then per key the lookup and the
    # descriptor read again, which fails alike
    assert pir.requests == [1, 1, 1, 1, 1, 1]


def test_a_bad_padding_page_fails_like_any_other_page() -> None:
    recs = records(400, seed=4)
    pir = PagePir(table(recs).pages)
    kc = KeywordClient(pir, PUB)
    kc.descriptor()
    pir.corrupt_last = True  # the last page of a request of 3 keys padded to 4 is padding
    with pytest.raises(KeywordIntegrityError) as exc:
        kc.get_many(sorted(recs)[:3])
    assert str(exc.value) == ANSWER_FAILED
    # the descriptor and the tree's top, the lookup, both once again
    assert pir.requests == [1, 1, 4, 1, 1]


# -- table changes under a long-lived client ---------------------------------------------------

class Harness:
    """Parties A and B and a keyword client over one of the page clients' kinds."""

    def __init__(self, kind: str, world: World, **kw: Any) -> None:
        self.a, self.b = Party(world), Party(world)
        self.pages = Client(kind, self.a, self.b, retry=FAST)
        cls = AsyncKeywordClient if self.pages.loop else KeywordClient
        self.kc = cls(self.pages.c, PUB, **kw)
        self.prefix = self.pages.prefix

    def call(self, name: str, *args: Any) -> Any:
        out = getattr(self.kc, name)(*args)
        return self.pages.loop.run_until_complete(out) if self.pages.loop else out

    def rotate(self, world: World) -> None:
        self.a.world = self.b.world = world

    def traffic(self) -> tuple[int, ...]:
        return (len(self.a.sent), len(self.b.sent), self.a.epoch_reads, self.b.epoch_reads,
                *(len(q) for q in self.a.sent))

    def close(self) -> None:
        self.pages.close()


@pytest.fixture(scope="module")
def tables() -> dict[str, Any]:
    big, small = records(2000, seed=5), records(300, seed=6)
    # "rebuilt": the same records, new seeds (the owner's rebuild keeps the dataset id);
    # "elsewhere": the same records built apart (another dataset), signed with the same key
    return {"big": (big, table(big)), "small": (small, table(small)),
            "rebuilt": (big, table(big)), "elsewhere": (big, table(big, bytes(16)))}


def _world(t: Any, seed: int, epoch: int, identity: bool = True) -> World:
    return World(seed, len(t.pages), epoch, identity=identity, pages=t.pages)


CHANGES = {  # (table before, table after, epoch id after, identities published)
    "smaller": ("big", "small", 2, True),
    "larger": ("small", "big", 2, True),
    "same-epoch-rebuild": ("big", "rebuilt", 1, True),
    "same-epoch-rebuild-no-identity": ("big", "rebuilt", 1, False),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("kind", ["msgpack", "async", "ahandle"])
def test_a_table_change_meets_every_key_alike(tables, change: str, kind: str) -> None:
    before, after, epoch, identity = CHANGES[change]
    old_recs, old = tables[before]
    new_recs, new = tables[after]
    rng = random.Random(7)
    # keys of both tables and of neither: where their candidates fall differs widely
    keys = rng.sample(sorted(new_recs), 3) + rng.sample(sorted(old_recs), 3) + [
        rng.randbytes(20) for _ in range(3)]
    seen = set()
    for key in keys:
        h = Harness(kind, _world(old, 1, 1, identity))
        try:
            warm = sorted(old_recs)[0]
            assert h.call("get", warm) == old_recs[warm]
            h.rotate(_world(new, 2, epoch, identity))
            start = h.traffic()
            assert h.call("get", key) == new_recs.get(key)
            seen.add(tuple(x - y for x, y in zip(h.traffic()[:4], start[:4], strict=True))
                     + h.traffic()[len(start):])
            assert h.call("get_many", keys) == [new_recs.get(k) for k in keys]
        finally:
            h.close()
    assert len(seen) == 1, seen  # the same requests, of the same sizes, for every key


# -- freshness ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["msgpack", "ahandle"])
def test_both_parties_rolled_back_are_refused_for_every_key(tables, kind: str) -> None:
    recs, t = tables["small"]
    v1, v2 = _world(t, 1, 1), World(2, len(t.pages), 2, pages=bumped(t))
    keys = sorted(recs)[:3] + [b"absent"]
    traffic = set()
    for key in keys:
        h = Harness(kind, v2)
        try:
            assert h.call("get", key) == recs.get(key)
            assert h.kc.seen_version == 2
            h.rotate(v1)  # a restored backup
            start = h.traffic()[:4]
            with pytest.raises(StaleTableError, match="version 1 .* already read version 2"):
                h.call("get", key)
            traffic.add(tuple(x - y for x, y in zip(h.traffic()[:4], start, strict=True)))
            with pytest.raises(StaleTableError):  # and again: never silently
                h.call("get_many", keys)
            h.rotate(World(3, len(t.pages), 3, pages=bumped(t, 2)))  # the owner moves on
            assert h.call("get_many", keys) == [recs.get(k) for k in keys]
        finally:
            h.close()
    assert len(traffic) == 1


@pytest.mark.parametrize("kind", ["msgpack", "ahandle"])
def test_a_table_built_apart_and_signed_with_the_same_key_is_refused(tables, kind) -> None:
    """Two builds signed with one key (two chains, two sets of records): the parties serving
    the other one's pages, at the same version, get no value accepted, for any key."""
    recs, t = tables["big"]
    _, other = tables["elsewhere"]
    keys = sorted(recs)[:3] + [b"absent"]
    h = Harness(kind, _world(t, 1, 1))
    try:
        assert h.call("get_many", keys) == [recs.get(k) for k in keys]
        h.rotate(_world(other, 2, 2))
        for key in keys:
            with pytest.raises(KeywordIntegrityError, match=(
                    f"keyword table '' of dataset {bytes(16).hex()}; this client has read "
                    f"dataset {DATASET.hex()}: another table signed with the same key")):
                h.call("get", key)
        h.rotate(_world(t, 3, 3))  # its own table again
        assert h.call("get_many", keys) == [recs.get(k) for k in keys]
    finally:
        h.close()
    # told the dataset: the other build is refused from its first read, before any lookup
    h = Harness(kind, _world(other, 1, 1), dataset="0x" + DATASET.hex())
    try:
        with pytest.raises(KeywordIntegrityError, match="this client was given dataset"):
            h.call("get", keys[0])
        assert [len(q) for q in h.a.sent] == [1]  # the descriptor only
    finally:
        h.close()
    h = Harness(kind, _world(t, 1, 1), dataset=DATASET)
    try:
        assert h.call("get", keys[0]) == recs[keys[0]]
    finally:
        h.close()
    for bad in ("00" * 15, "zz" * 16, b"x" * 17, 5):
        with pytest.raises(ValueError, match="16-byte dataset id"):
            KeywordClient(PagePir(t.pages), PUB, dataset=bad)


def test_a_client_with_a_minimum_version_refuses_an_older_table(tables) -> None:
    recs, t = tables["small"]
    h = Harness("msgpack", _world(t, 1, 1), min_version=2)
    try:
        with pytest.raises(StaleTableError, match="version 1 .* caller trusts version 2"):
            h.call("get", sorted(recs)[0])
        assert [len(q) for q in h.a.sent] == [1]  # the descriptor only: no lookup was sent
        h.rotate(World(2, len(t.pages), 2, pages=bumped(t)))
        assert h.call("get", sorted(recs)[0]) == recs[sorted(recs)[0]]
    finally:
        h.close()
    with pytest.raises(ValueError, match="min_version"):
        KeywordClient(None, PUB, min_version=-1)


@pytest.mark.parametrize("kind", ["msgpack", "async"])
def test_a_trusted_version_from_the_caller_is_a_floor_at_every_call(tables, kind) -> None:
    recs, t = tables["small"]
    head = {"version": None}

    async def ahead() -> int | None:
        return head["version"]

    bound = ahead if kind == "async" else (lambda: head["version"])
    h = Harness(kind, _world(t, 1, 1), trusted_version=bound)
    key = sorted(recs)[1]
    try:
        assert h.call("get", key) == recs[key]  # None: no bound yet
        head["version"] = 1
        assert h.call("get", key) == recs[key]
        head["version"] = 2  # the owner says 2 is out; the parties still serve 1
        with pytest.raises(StaleTableError, match="caller trusts version 2"):
            h.call("get", key)
        h.rotate(World(2, len(t.pages), 2, pages=bumped(t)))
        assert h.call("get", key) == recs[key]
    finally:
        h.close()
