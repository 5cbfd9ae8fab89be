"""A log that takes updates and never rotates stays bounded (issue 28, hole 5): compaction
folds all but the newest updates into one batch, replicas replay the fold to the same pages
and identity, and a router or replica that starts reads a bounded number of objects however
many publications the log has taken."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from _party_world import (
    apply_batch,
    ask_async,
    make_party,
    make_world,
    random_batch,
    start_replica,
)

from morphogen.party.version import page_with
from morphogen.protocol.changes import ChangeBatch, composed
from morphogen.publication import compaction
from morphogen.publication.log import EpochLog, EpochLogError, Published
from morphogen.snapshot.synthetic import synthetic_pages
from morphogen.storage import log_objects
from tests.unit.test_epoch_log import Writer
from tests.unit.test_epoch_log_objects import _keys

KEEP = 4


@pytest.fixture(autouse=True)
def small_folds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compaction, "FOLD_KEEP", KEEP)
    monkeypatch.setattr(compaction, "COMPACT_AFTER", 16)


@pytest.fixture(params=["dir", "memory", "s3"])
def plog(request: pytest.FixtureRequest, tmp_path: Path) -> EpochLog:
    if request.param == "s3":
        return EpochLog(f"s3://{request.getfixturevalue('s3_bucket')}/fold/log")
    return EpochLog(tmp_path / "log") if request.param == "dir" else EpochLog.in_memory()


def _model_after(batches: list[ChangeBatch]) -> dict[int, bytes]:
    """The pages `batches` leave, applied in order to an all-zero matrix of any size."""
    pages: dict[int, np.ndarray] = {}
    for b in batches:
        for i, page in enumerate(b.pages.tolist()):
            data = np.frombuffer(b.data[i * 4096:(i + 1) * 4096], np.uint8)
            pages[page] = data if b.replace[i] else pages.get(page, 0) ^ data
    return {p: v.tobytes() for p, v in pages.items()}


def test_a_composed_batch_does_what_its_batches_did_in_order() -> None:
    rng = np.random.default_rng(11)
    start = rng.integers(0, 256, (32, 4096), np.uint8)
    for _ in range(20):
        batches = [random_batch(rng, int(rng.integers(0, 12)), 32)
                   for _ in range(int(rng.integers(1, 8)))]
        one = composed(batches)
        want = start
        for b in batches:
            want = apply_batch(want, b)
        assert np.array_equal(apply_batch(start, one), want)
        assert len(set(one.pages.tolist())) == len(one)  # one change a page
        assert one.pages.tolist() == sorted(one.pages.tolist())


def test_compaction_folds_all_but_the_newest_updates(plog: EpochLog) -> None:
    rng = np.random.default_rng(12)
    w = Writer(plog, rng)
    w.rotation(2)
    sent = [w.updates(n=3) for _ in range(10)]
    head = plog.head()
    dropped = plog.compact()
    kinds = [e.kind for e in plog.entries()]
    assert kinds == ["history", "rotation", "commit", "fold"] + ["updates", "commit"] * KEEP
    assert dropped == 2 + 2 * 10 - len(kinds)
    fold = plog.entries()[3]
    assert (fold.base_epoch, fold.epoch_id) == (2, sent[-KEEP - 1][0].epoch_id)
    assert fold.identity == sent[-KEEP - 1][0].identity
    assert plog.head() == replace(head, seq=len(kinds) - 2)
    # the fold's batch is the folded batches' net change; the ids stay answered
    folded = plog.load_batch(fold)
    assert _model_after([folded]) == _model_after([b for _, b in sent[:-KEEP]])
    first = sent[0][0]
    again = plog.propose(first.pub, first.request, "W", 60, None)
    assert isinstance(again, Published)  # answered from the history, nothing written
    assert (again.epoch_id, again.identity) == (first.epoch_id, first.identity)
    # the next update builds on the head; the next compaction folds the fold with more
    more = [w.updates(n=2) for _ in range(3)]
    fresh = EpochLog(plog.directory, create=False) if plog.durable else plog
    assert fresh.head() == plog.head() and fresh.head().pub == more[-1][0].pub
    plog.compact()
    second = next(e for e in plog.entries() if e.kind == "fold")
    assert (second.base_epoch, second.epoch_id) == (2, sent[8][0].epoch_id)  # fold + 3 more
    want = [b for _, b in sent] + [b for _, b in more]
    got = [plog.load_batch(e) for e in plog.live()[1:]]
    assert _model_after(got) == _model_after(want)


def test_a_replica_replays_a_folded_log_to_the_same_pages_and_identity(tmp_path: Path) -> None:
    root, snaps = make_world(tmp_path)
    party, links = make_party(snaps, root / "log")
    rng = np.random.default_rng(13)
    model = synthetic_pages(3, 0, 96)
    sent: list[ChangeBatch] = []

    async def publish(n: int) -> dict:
        nonlocal model
        for _ in range(n):
            batch = random_batch(rng, 3, 96)
            await party.admin.updates(batch)
            model = apply_batch(model, batch)
            sent.append(batch)
        if party.admin._compacting is not None:
            await party.admin._compacting  # the background compaction the publisher started
        answer, got = await ask_async(party, model, [0, 5, 50, 95])
        assert got == [model[p].tobytes() for p in (0, 5, 50, 95)]
        return answer

    answer = asyncio.run(publish(20))
    log = EpochLog(root / "log", create=False)
    assert log.live()[0].kind == "fold"  # the publisher compacted by itself, in the background
    head = log.head()
    assert answer["identity"] == head.identity
    for i in range(2):
        fresh = start_replica(snaps / "base", i, log).core  # a replica that (re)starts
        assert fresh.identity.digest == head.identity
        first, stop = fresh.first_page, fresh.stop_page
        now = fresh.state.current
        pages = np.stack([page_with(now, now.pending, p) for p in range(first, stop)])
        assert np.array_equal(pages, model[first:stop])
    # one left further behind than the records kept is told why it cannot catch up (its
    # health check then fails and Serve restarts it, replaying from the snapshot)
    stale = start_replica(snaps / "base", 0, None).core
    one = log.entries()[0].pubs[0]  # the first publication, folded away
    stale.prepare_updates(2, sent[0], base_epoch=1)
    stale.commit(2)
    assert stale.identity.digest == one[2]
    with pytest.raises(EpochLogError, match="folded into one batch"):
        stale.catch_up(log)
    assert len(links) == 2


def test_a_stalled_sweep_never_deletes_a_fold_a_later_compaction_wrote(s3_bucket) -> None:
    """Compaction C2 seals with its fold and stalls before its sweep; C3 compacts meanwhile,
    folding C2's fold and a few more updates into a fold whose epoch is below C2's head. C2's
    sweep must leave C3's fold: the live log names it."""
    uri = f"s3://{s3_bucket}/fold-sweep"
    rng = np.random.default_rng(14)
    w = Writer(EpochLog(uri), rng)
    w.rotation(1)
    for _ in range(KEEP + 3):
        w.updates()
    c2 = EpochLog(uri, create=False)
    assert c2._objects is not None
    real_list = c2._objects.names_under
    reached, go = threading.Event(), threading.Event()

    def names_under(folder: str) -> list[str]:
        if not reached.is_set():
            reached.set()  # sealed: stall before the sweep lists the batches
            assert go.wait(60)
        return real_list(folder)

    c2._objects.names_under = names_under  # type: ignore[method-assign]
    thread = threading.Thread(target=c2.compact)
    thread.start()
    assert reached.wait(60)
    w.updates()
    assert EpochLog(uri, create=False).compact() > 0  # C3
    live_fold = next(e for e in EpochLog(uri, create=False).live() if e.kind == "fold")
    go.set()
    thread.join(60)
    assert f"blobs/{live_fold.blob}" in _keys(uri)
    fresh = EpochLog(uri, create=False)
    assert [fresh.load_batch(e).digest for e in fresh.live()[1:]] == \
        [e.blob_digest for e in fresh.live()[1:]]


def test_a_new_reader_reads_a_bounded_number_of_objects(s3_bucket,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """However many publications the log has taken, a router's first read and a replica's
    replay fetch about COMPACT_AFTER records and FOLD_KEEP batches, not all of them."""
    uri = f"s3://{s3_bucket}/bounded/log"
    rng = np.random.default_rng(15)
    w = Writer(EpochLog(uri), rng)
    w.rotation(1)
    counts = []
    gets: list[str] = []
    real_get = log_objects.LogObjects.get

    def counting_get(self, name: str) -> bytes:
        gets.append(name)
        return real_get(self, name)

    for total in (40, 160):
        while w.count < total:
            w.updates(n=1)
            if w.log.worth_compacting():
                w.log.compact()
        monkeypatch.setattr(log_objects.LogObjects, "get", counting_get)
        gets.clear()
        reader = EpochLog(uri, create=False)
        live = reader.live()
        batches = list(reader.load_batches([e for e in live if e.kind != "rotation"]))
        monkeypatch.setattr(log_objects.LogObjects, "get", real_get)
        assert len(batches) <= KEEP + compaction.COMPACT_AFTER
        counts.append(len(gets))
    # the marker, the last seal, the records since, the batches: the same bound at 4x the log
    bound = 1 + 1 + 2 * compaction.COMPACT_AFTER + 3 * KEEP + 8
    assert max(counts) <= bound, counts
