"""A publication larger than one request, sent in parts (docs/publication.md): the parts are
staged in the party's log store, the last publishes them all as one epoch, and nothing is
served before it. In-process shards and a real epoch log on disk, as tests/unit/test_party.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from _party_world import NUM_PAGES, apply_batch, ask, make_party, make_world, random_batch

from morphogen.client.admin import changes_digest
from morphogen.protocol.changes import ChangeBatch, PageWrite, joined
from morphogen.protocol.codec import ErrorCode, WireError
from morphogen.publication.log import EpochLog
from morphogen.snapshot.synthetic import synthetic_pages


@pytest.fixture
def world(tmp_path: Path):
    return make_world(tmp_path)


def _split(batch: ChangeBatch, parts: int) -> list[ChangeBatch]:
    bounds = np.linspace(0, len(batch), parts + 1).astype(int)
    changes = batch.select(0, 1 << 62)
    return [ChangeBatch.from_changes(changes[a:b]) for a, b in zip(bounds, bounds[1:],
                                                                    strict=False)]


def _send(party, part: ChangeBatch, i: int, n: int, digest: str, pub: str = "pub-1"):
    return asyncio.run(party.admin.updates_part(part, pub, None, i, n, digest))


def test_parts_are_staged_and_the_last_publishes_them_whole(world):
    root, snaps = world
    log_dir = root / "log"
    party, _ = make_party(snaps, log_dir)
    model = synthetic_pages(3, 0, NUM_PAGES)
    batch = random_batch(np.random.default_rng(1), 40, NUM_PAGES)
    parts = _split(batch, 4)
    assert joined(parts).digest == batch.digest
    # parts 3, 1, 2 in any order: nothing is served before the last
    for i in (3, 1, 2):
        out = _send(party, parts[i - 1], i, 4, batch.digest)
        assert out == {"publication": "pub-1", "part": i, "parts": 4,
                       "staged": len(parts[i - 1])}
        answer, pages = ask(party, model, [0, 50])
        assert answer["epoch_id"] == 1 and pages == [model[0].tobytes(), model[50].tobytes()]
    assert EpochLog(log_dir).entries() == []
    staged = sorted(p.name for p in log_dir.iterdir() if p.name.startswith("part-"))
    assert len(staged) == 3
    out = _send(party, parts[3], 4, 4, batch.digest)
    assert out["epoch_id"] == 2 and out["applied"] == len(batch) and out["parts"] == 4
    model = apply_batch(model, batch)
    targets = sorted({int(p) for p in batch.pages[:6]} | {1, 95})
    answer, pages = ask(party, model, targets)
    assert answer["identity"] == out["identity"]
    assert pages == [model[t].tobytes() for t in targets]
    # one epoch, one batch in the log, the parts gone
    [entry] = EpochLog(log_dir).live()
    assert entry.kind == "updates" and entry.count == len(batch)
    assert not [p for p in log_dir.iterdir() if p.name.startswith("part-")]
    # any part re-sent after the commit (an owner that died before it saw the answer) is
    # answered from the log and applies nothing
    for i in (1, 4):
        again = _send(party, parts[i - 1], i, 4, batch.digest)
        assert again["duplicate"] and again["epoch_id"] == 2 and again["applied"] == 0
    assert len(EpochLog(log_dir).live()) == 1


def test_a_last_part_before_the_others_is_refused_and_nothing_is_applied(world):
    root, snaps = world
    party, _ = make_party(snaps, root / "log")
    batch = random_batch(np.random.default_rng(2), 12, NUM_PAGES)
    parts = _split(batch, 3)
    _send(party, parts[1], 2, 3, batch.digest)
    with pytest.raises(WireError) as err:
        _send(party, parts[2], 3, 3, batch.digest)
    assert err.value.status == 409 and err.value.code == ErrorCode.MISSING_PARTS
    assert "part(s) 1 of 3" in err.value.message
    assert EpochLog(root / "log").entries() == []
    _send(party, parts[0], 1, 3, batch.digest)
    assert _send(party, parts[2], 3, 3, batch.digest)["epoch_id"] == 2


def test_parts_over_the_publications_cap_are_refused_and_nothing_is_applied(world):
    """Each staged part is read as whole pages once the last arrives: without a cap on
    them all, a few hundred small requests of changed bytes took the router's memory. Past
    `admin_max_publication_pages` the last part is a 413, nothing is applied, and a
    publication within the cap goes on."""
    root, snaps = world
    party, _ = make_party(snaps, root / "log", admin_max_publication_pages=30)
    batch = random_batch(np.random.default_rng(3), 40, NUM_PAGES)
    parts = _split(batch, 4)
    for i in (1, 2, 3):
        _send(party, parts[i - 1], i, 4, batch.digest)
    with pytest.raises(WireError) as err:
        _send(party, parts[3], 4, 4, batch.digest)
    assert err.value.status == 413 and err.value.code == ErrorCode.PAYLOAD_TOO_LARGE
    assert "admin_max_publication_pages" in err.value.message
    assert EpochLog(root / "log").entries() == []
    small = random_batch(np.random.default_rng(4), 20, NUM_PAGES)
    halves = _split(small, 2)
    _send(party, halves[0], 1, 2, small.digest, "pub-2")
    assert _send(party, halves[1], 2, 2, small.digest, "pub-2")["epoch_id"] == 2


def test_parts_of_another_batch_under_the_named_digest_are_refused(world):
    root, snaps = world
    party, _ = make_party(snaps, root / "log")
    rng = np.random.default_rng(3)
    batch, other = random_batch(rng, 10, NUM_PAGES), random_batch(rng, 10, NUM_PAGES)
    parts, others = _split(batch, 2), _split(other, 2)
    _send(party, others[0], 1, 2, batch.digest)  # a part that is not this batch's
    with pytest.raises(WireError) as err:
        _send(party, parts[1], 2, 2, batch.digest)
    assert err.value.status == 409 and "another batch" in err.value.message
    assert EpochLog(root / "log").entries() == []
    _send(party, parts[0], 1, 2, batch.digest)  # the right part replaces it
    assert _send(party, parts[1], 2, 2, batch.digest)["applied"] == len(batch)


def test_one_publication_id_for_two_batches_is_a_conflict(world):
    root, snaps = world
    party, _ = make_party(snaps, root / "log")
    rng = np.random.default_rng(4)
    batch, other = random_batch(rng, 6, NUM_PAGES), random_batch(rng, 6, NUM_PAGES)
    for i, part in enumerate(_split(batch, 2), 1):
        _send(party, part, i, 2, batch.digest)
    with pytest.raises(WireError) as err:
        _send(party, _split(other, 2)[0], 1, 2, other.digest)
    assert err.value.status == 409 and err.value.code == ErrorCode.CONFLICT


def test_two_routers_given_the_last_part_at_once_apply_it_once(world):
    """A re-send of the last part to another router replica while the first still works:
    both meet the parts in the shared store, one publication is decided."""
    root, snaps = world
    party, links = make_party(snaps, root / "log")
    other, _ = make_party(snaps, root / "log")
    other.shards = party.shards  # one party: two routers in front of the same shards
    batch = random_batch(np.random.default_rng(5), 30, NUM_PAGES)
    parts = _split(batch, 3)
    for i in (1, 2):
        _send(party, parts[i - 1], i, 3, batch.digest)

    async def both():
        return await asyncio.gather(
            party.admin.updates_part(parts[2], "pub-1", None, 3, 3, batch.digest),
            other.admin.updates_part(parts[2], "pub-1", None, 3, 3, batch.digest))

    outs = asyncio.run(both())
    assert sorted(bool(o.get("duplicate")) for o in outs) == [False, True]
    assert outs[0]["identity"] == outs[1]["identity"]
    assert len(EpochLog(root / "log").live()) == 1
    model = apply_batch(synthetic_pages(3, 0, NUM_PAGES), batch)
    _, pages = ask(party, model, [int(batch.pages[0])])
    assert pages == [model[int(batch.pages[0])].tobytes()]


def test_the_admin_clients_digest_is_the_partys():
    rng = np.random.default_rng(6)
    changes = [(int(p), kind, rng.bytes(n)) for p, kind, n in
               [(3, "data", 4096), (9, "diff", 4096), (3, "data", 100), (0, "data", 0)]]
    party_side = ChangeBatch.from_changes(
        [PageWrite(p, raw) if kind == "data" else _diff(p, raw) for p, kind, raw in changes])
    assert changes_digest(changes) == party_side.digest


def _diff(page: int, raw: bytes):
    from morphogen.protocol.changes import PageUpdate

    return PageUpdate(page, raw)
