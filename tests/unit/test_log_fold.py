"""A log that takes updates and never rotates stays bounded (issue 28, hole 5): compaction
folds all but the newest updates into folds kept in levels, composed before the writers'
lock; replicas replay the folds, written into their pages a slice at a time, to the same
pages and identity; and a router or replica that starts reads a bounded number of objects
however many publications the log has taken."""

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

from morphogen.party import epoch as epoch_mod
from morphogen.party.epoch import EpochError
from morphogen.party.version import page_with
from morphogen.protocol import dpf
from morphogen.protocol.changes import ChangeBatch, composed
from morphogen.publication import compaction
from morphogen.publication import log as log_mod
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
    # the next update builds on the head; the next compaction folds 3 more updates: into a
    # fold of their own while the first is larger than they are, else with it
    more = [w.updates(n=2) for _ in range(3)]
    fresh = EpochLog(plog.directory, create=False) if plog.durable else plog
    assert fresh.head() == plog.head() and fresh.head().pub == more[-1][0].pub
    plog.compact()
    folds = [e for e in plog.entries() if e.kind == "fold"]
    if fold.count > 3 * 2:
        assert folds[0] == replace(fold, seq=folds[0].seq)
        assert [(f.base_epoch, f.epoch_id) for f in folds[1:]] == \
            [(fold.epoch_id, sent[8][0].epoch_id)]
    else:
        assert [(f.base_epoch, f.epoch_id) for f in folds] == [(2, sent[8][0].epoch_id)]
    want = [b for _, b in sent] + [b for _, b in more]
    got = [plog.load_batch(e) for e in plog.live()[1:]]
    assert _model_after(got) == _model_after(want)


def test_folds_stay_in_levels_each_larger_than_what_follows_it(tmp_path: Path) -> None:
    """Forty compactions of 12 pages each: the folds behave as a binary counter's digits, so
    there are few of them, about half the compactions fold only what they add, and replay
    still gives every page its last value."""
    rng = np.random.default_rng(21)
    log = EpochLog(tmp_path / "log")
    w = Writer(log, rng)
    w.rotation(1)
    sent, written = [w.updates(n=3) for _ in range(KEEP)], []
    for _ in range(40):
        sent += [w.updates(n=3) for _ in range(4)]
        before = {e.blob for e in log.live() if e.kind == "fold"}
        log.compact()
        folds = [e for e in log.live() if e.kind == "fold"]
        new = [f for f in folds if f.blob not in before]
        assert len(new) == 1 and new[0] is folds[-1]  # one fold written, the newest
        written.append(folds[-1].count)
        counts = [f.count for f in folds]
        assert all(a > b for a, b in zip(counts, counts[1:], strict=False)), counts
        assert len(folds) <= 6
        got = [log.load_batch(e) for e in log.live()[1:]]
        assert _model_after(got) == _model_after([b for _, b in sent])
    assert sum(1 for c in written if c <= 4 * 3) >= len(written) // 3, written


@pytest.mark.parametrize("replay", ["slices", "whole", "staged"])
def test_a_replica_replays_a_folded_log_to_the_same_pages_and_identity(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replay: str) -> None:
    """A fold is written into the pages a few changes at a time ("slices"), in one slice
    ("whole"), or staged as pending updates where the pages take no writes ("staged")."""
    if replay == "slices":
        monkeypatch.setattr(epoch_mod, "REPLAY_ROWS", 2)
    if replay == "staged":
        monkeypatch.setattr(epoch_mod, "host_writable", lambda version: False)
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
        mine = {kind: sum(int(((b.pages >= first) & (b.pages < stop)).sum())
                          for b in log.load_batches([e for e in log.live()
                                                     if (e.kind == "fold") == (kind == "fold")]))
                for kind in ("fold", "updates")}
        # written into the pages, unless staged: pending are only the updates after the folds
        assert len(now.pending) == mine["updates"] + (mine["fold"] if replay == "staged" else 0)
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


def test_a_replica_of_another_snapshot_is_refused_by_a_log_that_starts_with_a_fold(
        tmp_path: Path) -> None:
    """A fold's identity is the log's, not one derived from the replica's pages: a replica
    whose configured path holds another build at the same epoch id (a re-export, a stale
    copy on its node) must not take the fold over its own pages under the party's identity,
    as an updates entry's derived identity refuses it."""
    root, snaps = make_world(tmp_path)
    party, _ = make_party(snaps, root / "log")
    rng = np.random.default_rng(21)

    async def publish(n: int) -> None:
        for _ in range(n):
            await party.admin.updates(random_batch(rng, 3, 96))
        if party.admin._compacting is not None:
            await party.admin._compacting

    from morphogen.snapshot.synthetic import build_synthetic

    build_synthetic(snaps / "other", 96, seed=99, epoch_id=1, progress=False)
    asyncio.run(publish(3))  # not folded yet: the first updates entry refuses the other build
    log = EpochLog(root / "log", create=False)
    with pytest.raises(EpochLogError, match="this shard derived"):
        start_replica(snaps / "other", 0, log)
    asyncio.run(publish(17))
    assert log.live()[0].kind == "fold"
    for i in range(2):
        with pytest.raises(EpochLogError, match="first entry folds the updates made on snapshot"):
            start_replica(snaps / "other", i, log)
        assert start_replica(snaps / "base", i, log).core.identity.digest == log.head().identity
    # a shard at the fold's base epoch with updates of its own (not the log's) is refused too
    stray = start_replica(snaps / "base", 0, None).core
    stray.prepare_updates(2, random_batch(rng, 2, 96), base_epoch=1)
    stray.commit(2)
    first = log.live()[0]
    assert first.base_epoch == 1
    with pytest.raises(EpochLogError, match="folded into one batch|first entry folds"):
        stray.catch_up(log)


def test_a_fold_written_in_slices_over_pending_updates_answers_as_staged_whole(
        tmp_path: Path) -> None:
    """A shard with updates still pending takes a fold of diffs and whole-page writes (some
    pages written twice over) two changes at a time: the same pages, the fold's identity,
    nothing left pending, and every key answered as by a shard that staged it whole."""
    _, snaps = make_world(tmp_path)
    rng = np.random.default_rng(19)
    sliced = start_replica(snaps / "base", 1, None).core
    whole = start_replica(snaps / "base", 1, None).core
    before = random_batch(rng, 6, 96)
    fold = composed([random_batch(rng, 9, 96), random_batch(rng, 9, 96)])
    assert fold.replace.any() and not fold.replace.all()
    target = sliced.identity.after_updates(2, before.digest).after_updates(3, "ab" * 32)
    for shard in (sliced, whole):
        shard.prepare_updates(2, before, base_epoch=1)
        shard.commit(2)
        assert shard.state.current.pending  # not folded yet
    taken = sliced.state.replay_updates(3, fold, base_epoch=2, identity=target, rows=2)
    whole.prepare_updates(3, fold, base_epoch=2, identity=target)
    whole.commit(3)
    first, stop = whole.first_page, whole.stop_page
    assert taken == int(((fold.pages >= first) & (fold.pages < stop)).sum())
    assert sliced.identity == whole.identity == target
    a, b = sliced.state.current, whole.state.current
    assert not a.pending
    assert all(np.array_equal(page_with(a, a.pending, p), page_with(b, b.pending, p))
               for p in range(first, stop))
    keys = [dpf.generate_keys(sliced.domain_bits, int(t))[0]
            for t in rng.integers(first, stop, 5)]
    assert np.array_equal(sliced.scan(keys)[1], whole.scan(keys)[1])
    with pytest.raises(EpochError):  # made for another epoch: nothing written
        sliced.state.replay_updates(4, fold, base_epoch=2,
                                    identity=target.after_updates(4, "cd" * 32))
    assert sliced.identity == target


def _ready_to_fold(log_dir: Path, seed: int) -> tuple[EpochLog, Writer, list]:
    """A directory log of a rotation and `KEEP` + 5 updates: a compaction folds 5 of them."""
    log = EpochLog(log_dir)
    w = Writer(log, np.random.default_rng(seed))
    w.rotation(1)
    return log, w, [w.updates(n=3) for _ in range(KEEP + 5)]


def _stalled_compaction(monkeypatch: pytest.MonkeyPatch, log_dir: Path
                        ) -> tuple[threading.Thread, list[int], threading.Event]:
    """A compaction of the log at `log_dir`, started in a thread and stalled as it composes
    its fold (before the writers' lock): (the thread, what its compact() returned, the event
    that lets it go on). Later compactions compose without stalling."""
    reached, go = threading.Event(), threading.Event()
    real = compaction.composed

    def slow(batches):
        if not reached.is_set():
            reached.set()
            assert go.wait(60)
        return real(batches)

    monkeypatch.setattr(compaction, "composed", slow)
    dropped: list[int] = []
    thread = threading.Thread(target=lambda: dropped.append(
        EpochLog(log_dir, create=False).compact()))
    thread.start()
    assert reached.wait(60)
    return thread, dropped, go


def test_publications_go_on_while_a_compaction_composes_its_fold(tmp_path: Path,
                                                                  monkeypatch) -> None:
    """The fold is composed before the writers' lock is taken: a publication proposed and
    committed meanwhile is not held up, and stays in the log the compaction writes."""
    log, w, sent = _ready_to_fold(tmp_path / "log", seed=16)
    thread, dropped, go = _stalled_compaction(monkeypatch, tmp_path / "log")
    sent.append(w.updates(n=3))  # would wait on the lock if the compaction held it
    go.set()
    thread.join(60)
    assert dropped and dropped[0] > 0
    live = log.live()
    assert [e.kind for e in live] == ["rotation", "fold"] + ["updates"] * (KEEP + 1)
    assert live[-1].pub == sent[-1][0].pub
    assert _model_after([log.load_batch(e) for e in live[1:]]) == \
        _model_after([b for _, b in sent])


def test_a_fold_made_for_entries_folded_meanwhile_is_not_used(tmp_path: Path,
                                                              monkeypatch) -> None:
    """Compaction A composes its fold; B compacts the same log first. A's fold stands for
    entries B folded: A writes nothing more, and B's log, with all its batches, stays."""
    log, w, sent = _ready_to_fold(tmp_path / "log", seed=17)
    thread, dropped, go = _stalled_compaction(monkeypatch, tmp_path / "log")
    sent.append(w.updates(n=3))
    assert EpochLog(tmp_path / "log", create=False).compact() > 0  # B, its run one longer
    after_b = log.entries()
    go.set()
    thread.join(60)
    assert dropped == [0] and log.entries() == after_b
    live = log.live()
    assert _model_after([log.load_batch(e) for e in live[1:]]) == \
        _model_after([b for _, b in sent])


def test_a_compaction_that_composed_a_fold_waits_for_a_proposal_to_be_decided(
        tmp_path: Path, monkeypatch) -> None:
    """A proposal undecided when the fold is ready: the compaction looks again once it is
    decided, and the committed update is kept after the fold."""
    log, w, sent = _ready_to_fold(tmp_path / "log", seed=20)
    looked, decided = threading.Event(), threading.Event()

    def nap(seconds: float) -> None:
        looked.set()  # found the proposal undecided
        assert decided.wait(60)

    monkeypatch.setattr(log_mod, "_nap", nap)
    thread, dropped, go = _stalled_compaction(monkeypatch, tmp_path / "log")
    proposal, batch = w.updates(n=3, outcome=None)
    go.set()
    assert looked.wait(60)
    log.decide(proposal, "commit")
    decided.set()
    thread.join(60)
    assert dropped and dropped[0] > 0
    live = log.live()
    assert [e.kind for e in live] == ["rotation", "fold"] + ["updates"] * (KEEP + 1)
    assert live[-1].pub == proposal.pub
    assert _model_after([log.load_batch(e) for e in live[1:]]) == \
        _model_after([b for _, b in sent] + [batch])


def test_a_fold_whose_batch_was_swept_before_the_lock_is_not_used(tmp_path: Path) -> None:
    """A compaction that ran meanwhile may sweep a fold batch written before the lock: the
    compaction that wrote it then folds nothing, and never names a batch that is gone."""
    log, w, sent = _ready_to_fold(tmp_path / "log", seed=18)
    before = log.entries()
    store = log._store
    real = store.write_file

    def swept(name: str, parts: tuple[bytes, ...]) -> None:
        real(name, parts)
        if name.startswith("fold-"):
            store.remove_files([name])

    store.write_file = swept  # type: ignore[method-assign]
    assert log.compact() == 0
    assert log.entries() == before
    store.write_file = real  # type: ignore[method-assign]
    assert log.compact() > 0
    assert _model_after([log.load_batch(e) for e in log.live()[1:]]) == \
        _model_after([b for _, b in sent])


def test_a_stalled_sweep_never_deletes_a_fold_a_later_compaction_wrote(s3_bucket) -> None:
    """Compaction C2 seals with its fold and stalls before its sweep; C3 compacts meanwhile,
    folding the next update into a fold whose epoch is below C2's head (a fold of its own:
    C2's is larger). C2's sweep must leave C3's fold: the live log names it."""
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
    live_folds = [e for e in EpochLog(uri, create=False).live() if e.kind == "fold"]
    assert len(live_folds) == 2
    go.set()
    thread.join(60)
    assert {f"blobs/{f.blob}" for f in live_folds} <= set(_keys(uri))
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
