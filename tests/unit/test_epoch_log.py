"""The party's epoch log, a decided history: proposals, leases, renewals and decisions, only
committed proposals served, idempotent publication ids, compaction with a history record, the
log's marker; records and blobs on disk, torn tails, corruption, concurrent publishers."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from morphogen.protocol.changes import ChangeBatch
from morphogen.protocol.identity import EMPTY_CHAIN, EpochIdentity
from morphogen.publication import lease as lease_module
from morphogen.publication import log as epoch_log_module
from morphogen.publication.compaction import compacted
from morphogen.publication.log import (
    EpochLog,
    EpochLogBusy,
    EpochLogConflict,
    EpochLogError,
    LogEntry,
    LogState,
    Published,
    rotation_entry,
    updates_entry,
)
from morphogen.publication.records import FRAME, MAX_PAYLOAD, frame

T0 = 1_700_000_000_000  # the fake clock's start, unix milliseconds
Build = Callable[[LogEntry | None, int], tuple[LogEntry, ChangeBatch | None]]


def _batch(rng: np.random.Generator, n: int) -> ChangeBatch:
    pages = rng.integers(0, 1 << 40, n, dtype=np.int64)
    replace_ = rng.random(n) < 0.5
    return ChangeBatch(pages, replace_, rng.integers(0, 256, n * 4096, np.uint8).tobytes())


def _frame(payload: bytes, magic: bytes = b"MGL2") -> bytes:
    """A record frame built here, independently of the module, for hand-made records."""
    digest = hashlib.blake2b(payload, digest_size=16).digest()
    return magic + struct.pack("<II", len(payload), len(payload) ^ 0xFFFFFFFF) + digest + payload


def rotation(epoch: int, checksum: str = "ck") -> Build:
    """A build of a rotation proposal to `epoch` (snapshot /snaps/<epoch>)."""

    def build(head: LogEntry | None, seq: int) -> tuple[LogEntry, None]:
        ident = EpochIdentity.of_snapshot(epoch, checksum)
        return rotation_entry(epoch, f"/snaps/{epoch}", checksum, ident, seq), None

    return build


def updates(batch: ChangeBatch, fallback: EpochIdentity | None = None) -> Build:
    """A build of `batch` on top of the committed head (or `fallback` on an empty log), as a
    router builds it."""

    def build(head: LogEntry | None, seq: int) -> tuple[LogEntry, ChangeBatch]:
        base = head.epoch_identity() if head is not None else fallback
        assert base is not None
        epoch = base.epoch_id + 1
        return updates_entry(epoch, base.epoch_id, batch,
                             base.after_updates(epoch, batch.digest), seq), batch

    return build


def fixed(make: Callable[[int], tuple[LogEntry, ChangeBatch | None]]) -> Build:
    """A build that ignores the head (a router that built on what it read earlier)."""
    return lambda head, seq: make(seq)


class Writer:
    """One publisher: proposes on top of whatever the committed head is, decides at once."""

    def __init__(self, log: EpochLog, rng: np.random.Generator, name: str = "W") -> None:
        self.log, self.rng, self.name, self.count = log, rng, name, 0

    def propose(self, build: Build, lease_s: float = 60.0) -> LogEntry:
        self.count += 1
        pub = f"{self.name}-{self.count}"
        p = self.log.propose(pub, f"req-{pub}", self.name, lease_s, build)
        assert isinstance(p, LogEntry)
        return p

    def rotation(self, epoch: int, checksum: str = "ck") -> LogEntry:
        p = self.propose(rotation(epoch, checksum))
        self.log.decide(p, "commit")
        return p

    def updates(self, n: int = 2, outcome: str | None = "commit",
                lease_s: float = 60.0) -> tuple[LogEntry, ChangeBatch]:
        batch = _batch(self.rng, n)
        p = self.propose(updates(batch), lease_s)
        if outcome is not None:
            self.log.decide(p, outcome)
        return p, batch


def _rot(seq: int, epoch: int, pub: str, *, checksum: str = "ck", publisher: str = "P",
         lease_ms: int = T0 + 60_000, lease_for_ms: int = 60_000) -> LogEntry:
    """The rotation proposal `rotation(epoch, checksum)` leads to."""
    ident = EpochIdentity.of_snapshot(epoch, checksum)
    return LogEntry(seq, "rotation", epoch, ident.digest, path=f"/snaps/{epoch}",
                    checksum=checksum, snapshot_checksum=checksum, chain=EMPTY_CHAIN, pub=pub,
                    request=f"req-{pub}", publisher=publisher, lease_ms=lease_ms,
                    lease_for_ms=lease_for_ms)


def _files(log: EpochLog) -> tuple[bytes, list[str]] | list[str]:
    if not isinstance(log.directory, Path):  # an object-store log: its keys
        import obstore

        from morphogen.storage import open_location

        loc = open_location(log.directory)
        return sorted(m["path"] for m in obstore.list(loc.store, prefix=loc.prefix).collect())
    """Everything a write could change: the records and the directory's names."""
    return log.path.read_bytes(), sorted(os.listdir(log.directory))


@pytest.fixture
def log(tmp_path: Path) -> EpochLog:
    return EpochLog(tmp_path / "log")


@pytest.fixture(params=["durable", "memory", "s3"])
def plog(request: pytest.FixtureRequest, tmp_path: Path) -> EpochLog:
    """A log in a directory, one in memory and one on a loopback S3 server: the protocol is
    the same."""
    if request.param == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        return EpochLog(f"s3://{bucket}/party-a/log")
    return EpochLog(tmp_path / "log") if request.param == "durable" else EpochLog.in_memory()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The log's clocks, set by the test (unix milliseconds): the wall clock its records
    show and the monotonic one its leases are timed on."""
    now = [T0]
    monkeypatch.setattr(epoch_log_module, "now_ms", lambda: now[0])
    monkeypatch.setattr(lease_module, "monotonic", lambda: now[0] / 1000)
    return now


# ---------------------------------------------------------------- records and what they mean


def test_proposals_renewals_and_decisions_round_trip(plog: EpochLog, rng, clock) -> None:
    log = plog
    assert (log.entries(), log.live(), log.head()) == ([], [], None)
    assert log.state() == LogState()
    r2 = log.propose("r2", "req-r2", "P", 60, rotation(2))
    assert r2 == _rot(0, 2, "r2")
    assert (log.live(), log.head()) == ([], None)  # undecided: never served
    st = log.state()
    assert (st.pending, st.lease_ms, st.committed, st.pubs) == (r2, T0 + 60_000, [], {})
    clock[0] = T0 + 15_000  # the lease is timed from the write, plus its slack
    assert log.lease_left_s(st) == pytest.approx(60 * 1.02 - 15)
    clock[0] = T0 + 70_000
    assert log.lease_left_s(st) == 0.0
    clock[0] = T0 + 1000
    log.renew(r2, 120)
    assert log.entries()[1] == LogEntry(1, "renew", 2, of=0, publisher="P",
                                        lease_ms=T0 + 121_000, lease_for_ms=120_000)
    log.renew(r2, 1)  # a shorter renewal does not shorten the lease
    assert log.entries()[2].lease_ms == T0 + 2000 and log.state().lease_ms == T0 + 121_000
    assert log.lease_left_s(log.state()) == pytest.approx(120 * 1.02)
    log.decide(r2, "commit")
    assert log.entries()[3] == LogEntry(3, "commit", 2, of=0)
    assert (log.live(), log.head(), log.state().pending) == ([r2], r2, None)
    assert log.lease_left_s(log.state()) == 0.0  # nothing undecided
    ident2 = EpochIdentity.of_snapshot(2, "ck")
    b3 = _batch(rng, 3)
    u3 = log.propose("u3", "req-u3", "P", 60, updates(b3))
    i3 = ident2.after_updates(3, b3.digest)
    assert u3 == LogEntry(4, "updates", 3, i3.digest, base_epoch=2,
                          blob=f"updates-000000000003-{b3.digest[:16]}.bin",
                          blob_digest=b3.digest, count=3, snapshot_checksum="ck",
                          chain=i3.chain, pub="u3", request="req-u3", publisher="P",
                          lease_ms=T0 + 61_000, lease_for_ms=60_000)
    assert u3.epoch_identity() == i3 and log.entries()[0].epoch_identity() == ident2
    assert log.entries()[3].epoch_identity() is None  # a decision leads to no identity
    log.decide(u3, "commit")
    x4 = log.propose("x4", "req-x4", "P", 60, updates(_batch(rng, 1)))
    log.decide(x4, "abort")  # a prepare failed: the party stays on epoch 3
    assert log.entries()[7] == LogEntry(7, "abort", 4, of=6)
    assert (log.live(), log.head()) == ([r2, u3], u3)
    b4 = _batch(rng, 2)
    u4 = log.propose("u4", "req-u4", "P", 60, updates(b4))  # epoch 4 again, on epoch 3
    assert (u4.seq, u4.epoch_id, u4.base_epoch) == (8, 4, 3)
    assert u4.identity == i3.after_updates(4, b4.digest).digest
    log.decide(u4, "commit")
    r5 = log.propose("r5", "req-r5", "P", 60, rotation(5, "ck-b"))
    log.decide(r5, "abort")  # the rotation failed: the party stays on epoch 4
    assert (log.live(), log.head()) == ([r2, u3, u4], u4)
    assert [(e.seq, e.kind, e.epoch_id, e.of) for e in log.entries()] == [
        (0, "rotation", 2, None), (1, "renew", 2, 0), (2, "renew", 2, 0), (3, "commit", 2, 0),
        (4, "updates", 3, None), (5, "commit", 3, 4), (6, "updates", 4, None),
        (7, "abort", 4, 6), (8, "updates", 4, None), (9, "commit", 4, 8),
        (10, "rotation", 5, None), (11, "abort", 5, 10)]
    st = log.state()
    assert (st.pending, st.aborted, st.committed) == (None, 2, [r2, u3, u4])
    assert st.pubs == {"r2": Published("r2", 2, r2.identity, "req-r2"),
                       "u3": Published("u3", 3, u3.identity, "req-u3"),
                       "u4": Published("u4", 4, u4.identity, "req-u4")}
    r6 = log.propose("r6", "req-r6", "P", 60, rotation(6, "ck-c"))
    log.decide(r6, "commit")
    assert log.live() == [r6] and log.head() == r6 and r6.seq == 12
    assert r6 == _rot(12, 6, "r6", checksum="ck-c", lease_ms=T0 + 61_000)
    assert log.state().committed == [r2, u3, u4, r6]


def test_append_committed_proposes_and_commits(plog: EpochLog) -> None:
    e = plog.append_committed("rot-2", rotation(2))
    assert plog.entries() == [e, LogEntry(1, "commit", 2, of=0)] and plog.head() == e
    assert (e.pub, e.request) == ("rot-2", "rot-2")
    host = socket.gethostname()[:32]
    assert re.fullmatch(re.escape(f"{host}-{os.getpid()}-") + "[0-9a-f]{8}", e.publisher)
    assert plog.state().pubs == {"rot-2": Published("rot-2", 2, e.identity, "rot-2")}


def test_live_without_a_rotation_is_every_committed_entry(tmp_path: Path, rng) -> None:
    log = EpochLog(tmp_path / "log")
    base = EpochIdentity.of_snapshot(1, "configured")  # what a router found on the shards
    made = []
    for i in range(3):
        p = log.propose(f"u{i}", "req", "P", 60, updates(_batch(rng, 1), fallback=base))
        made.append(p)
        log.decide(p, "commit" if i < 2 else "abort")
    assert [e.epoch_id for e in made] == [2, 3, 4] and made[0].base_epoch == 1
    assert log.live() == made[:2] and log.head() == made[1]
    # a log with aborted proposals only serves nothing, and takes any base
    other = EpochLog(tmp_path / "other")
    p = other.propose("x", "req", "P", 60, updates(_batch(rng, 1), fallback=base))
    other.decide(p, "abort")
    assert (other.live(), other.head(), other.state().aborted) == ([], None, 1)
    again = other.propose("y", "req", "P", 60,
                          updates(_batch(rng, 1), EpochIdentity.of_snapshot(5, "x")))
    assert (again.seq, again.epoch_id, again.base_epoch) == (2, 6, 5)
    assert other.live() == [] and other.head() is None  # undecided
    other.decide(again, "commit")
    assert other.live() == [again] and other.head() == again


@pytest.mark.parametrize("n", [0, 1, 37])
def test_batch_round_trip_is_bit_exact(log: EpochLog, rng, n: int) -> None:
    w = Writer(log, rng)
    w.rotation(2)
    entry, batch = w.updates(n)
    blob = log.directory / entry.blob
    assert blob.stat().st_size == 16 + n * (8 + 1 + 4096)
    assert blob.read_bytes()[:16] == b"MGB1" + struct.pack("<IQ", 4096, n)
    assert blob.read_bytes()[16 : 16 + 8 * n] == batch.pages.astype("<i8").tobytes()
    got = log.load_batch(entry)
    assert got.pages.dtype == np.int64 and got.replace.dtype == np.bool_
    np.testing.assert_array_equal(got.pages, batch.pages)
    np.testing.assert_array_equal(got.replace, batch.replace)
    assert got.data == batch.data
    assert got.digest == batch.digest == entry.blob_digest
    assert not [p for p in log.directory.iterdir() if p.name.startswith(".")]


def test_reopened_log_sees_the_same_state(tmp_path: Path, rng) -> None:
    first = EpochLog(tmp_path / "log")
    w = Writer(first, rng)
    w.rotation(2)
    made = [w.updates() for _ in range(3)]
    pending, pending_batch = w.updates(outcome=None)
    first.renew(pending, 120)
    again = EpochLog(tmp_path / "log", create=False, log_id=first.log_id)
    assert again.directory == tmp_path / "log" and again.path == tmp_path / "log" / "epochs.log"
    assert again.entries() == first.entries() and len(again.entries()) == 10
    assert again.state() == first.state()
    assert again.state().pending == pending
    assert again.state().lease_ms == first.entries()[-1].lease_ms
    assert again.live() == first.live() == [first.entries()[0]] + [m[0] for m in made]
    entry, batch = made[2]
    assert again.head() == entry and again.head().epoch_identity() == entry.epoch_identity()
    assert again.load_batch(entry).data == batch.data
    assert again.load_batch(pending).data == pending_batch.data  # its blob is written already


def test_create_false_needs_the_directory(tmp_path: Path) -> None:
    with pytest.raises(EpochLogError, match=re.escape(
            f"node {socket.gethostname()}: {tmp_path / 'missing'}: no epoch log directory")):
        EpochLog(tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()
    EpochLog(tmp_path / "made" / "deep")
    assert sorted(os.listdir(tmp_path / "made" / "deep")) == ["log.json"]


# ---------------------------------------------------------------- the marker


def test_the_marker_names_the_log(tmp_path: Path) -> None:
    d = tmp_path / "log"
    made = EpochLog(d)
    marker = (d / "log.json").read_bytes()
    assert json.loads(marker) == {"format": 2, "log_id": made.log_id}
    assert re.fullmatch("[0-9a-f]{16}", made.log_id)
    assert EpochLog(d, create=False, log_id=made.log_id).log_id == made.log_id
    assert EpochLog(d, log_id=made.log_id).log_id == made.log_id  # create keeps the marker
    assert EpochLog(d, create=False).log_id == made.log_id  # no id asked: any log
    assert (d / "log.json").read_bytes() == marker
    where = f"node {socket.gethostname()}: {d}"
    for create in (False, True):
        with pytest.raises(EpochLogError, match=re.escape(
                f"{where}: the epoch log here is {made.log_id}, the party's is "
                "0123456789abcdef: this node sees another directory")):
            EpochLog(d, create=create, log_id="0123456789abcdef")
    assert (d / "log.json").read_bytes() == marker


def test_a_directory_without_a_marker_is_refused(tmp_path: Path, rng) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(EpochLogError, match=re.escape(
            f"node {socket.gethostname()}: {bare}: not an epoch log (no log.json)")):
        EpochLog(bare, create=False)
    assert list(bare.iterdir()) == []
    # a marker that goes away under an open log: it is read no more, and never written into
    log = EpochLog(tmp_path / "log")
    Writer(log, rng).rotation(2)
    before = log.path.read_bytes()
    (log.directory / "log.json").unlink()
    with pytest.raises(EpochLogError, match=re.escape("not an epoch log (no log.json)")):
        Writer(log, rng, "V").updates()
    assert log.path.read_bytes() == before and sorted(os.listdir(log.directory)) == [
        "epochs.log"]
    log.path.unlink()
    with pytest.raises(EpochLogError, match=re.escape("not an epoch log (no log.json)")):
        log.entries()
    with pytest.raises(EpochLogError, match=re.escape("not an epoch log (no log.json)")):
        log.propose("p", "req", "P", 60, rotation(2))
    assert list(log.directory.iterdir()) == []


@pytest.mark.parametrize("body,why", [
    (json.dumps({"format": 1, "log_id": "0" * 16}), "epoch log format 1, this version reads 2"),
    ("{", "unreadable log.json"),
    (json.dumps({"format": 2}), "unreadable log.json"),
    (json.dumps({"format": "two", "log_id": "x"}), "unreadable log.json"),
])
def test_a_bad_marker_is_refused(tmp_path: Path, body: str, why: str) -> None:
    d = tmp_path / "log"
    d.mkdir()
    (d / "log.json").write_text(body)
    for create in (False, True):
        with pytest.raises(EpochLogError, match=re.escape(
                f"node {socket.gethostname()}: {d}: {why}")):
            EpochLog(d, create=create)
    assert (d / "log.json").read_text() == body


def test_an_old_format_log_is_refused(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    records = _frame(b'{"seq":0,"kind":"rotation","epoch_id":2}', b"MGL1")
    (old / "epochs.log").write_bytes(records)
    with pytest.raises(EpochLogError, match=re.escape(
            f"node {socket.gethostname()}: {old}: an epoch log without a log.json (written by "
            "an older version)")):
        EpochLog(old)
    assert sorted(os.listdir(old)) == ["epochs.log"]  # no marker was written
    with pytest.raises(EpochLogError, match=re.escape("not an epoch log (no log.json)")):
        EpochLog(old, create=False)
    # a marker over records of the older format: the records themselves are refused
    (old / "log.json").write_text(json.dumps({"format": 2, "log_id": "0" * 16}))
    log = EpochLog(old, create=False)
    why = re.escape(f"{old / 'epochs.log'}: byte 0: a record of an older log format")
    with pytest.raises(EpochLogError, match=why):
        log.entries()
    with pytest.raises(EpochLogError, match=why):
        log.propose("p", "req", "P", 60, rotation(3))
    assert (old / "epochs.log").read_bytes() == records


# ---------------------------------------------------------------- what a writer refuses


def test_proposals_that_do_not_fit_are_refused_with_nothing_written(log: EpochLog,
                                                                    rng) -> None:
    w = Writer(log, rng)
    r2 = w.rotation(2)
    u3, _ = w.updates()
    i2, i3 = r2.epoch_identity(), u3.epoch_identity()
    assert i2 is not None and i3 is not None
    b = _batch(rng, 1)
    other = EpochIdentity.of_snapshot(3, "elsewhere").after_updates(4, b.digest)
    before = _files(log)
    cases: list[tuple[Build, type[Exception], str]] = [
        (fixed(lambda s: (rotation_entry(3, "/t", "c", EpochIdentity.of_snapshot(3, "c"), s),
                          None)),
         EpochLogConflict, f"{log.path}: epoch 3 does not follow the head, epoch 3"),
        (fixed(lambda s: (updates_entry(4, 2, b, i2.after_updates(4, b.digest), s), b)),
         EpochLogConflict,
         f"{log.path}: updates of epoch 4 were made for epoch 2, not the head, epoch 3"),
        (fixed(lambda s: (updates_entry(2, 1, b, EpochIdentity.of_snapshot(1, "ck")
                                        .after_updates(2, b.digest), s), b)),
         EpochLogConflict, f"{log.path}: epoch 2 does not follow the head, epoch 3"),
        # the right epochs, but computed from other data than the head's
        (fixed(lambda s: (updates_entry(4, 3, b, other, s), b)), EpochLogConflict,
         f"{log.path}: identity {other.digest} of epoch 4 does not follow {i3.digest}"),
        (fixed(lambda s: (updates_entry(4, 3, b, i3, s), b)), ValueError,
         "identity of epoch 3 given for epoch 4"),
        (fixed(lambda s: (updates_entry(4, 4, b, i3.after_updates(4, b.digest), s), b)),
         ValueError, "updates of epoch 4 cannot apply to epoch 4"),
        (fixed(lambda s: (rotation_entry(5, "/t", "c", EpochIdentity.of_snapshot(4, "c"), s),
                          None)),
         ValueError, "identity of epoch 4 given for epoch 5"),
    ]
    for build, exc, message in cases:
        with pytest.raises(exc, match=re.escape(message)):
            log.propose("p", "req-p", "Q", 60, build)
    for bad in ("", "a b", "x" * 81, "é", "a/b"):
        with pytest.raises(ValueError, match="a publication id is 1..80 characters"):
            log.propose(bad, "req", "Q", 60, rotation(9))
    assert _files(log) == before
    log.propose("x" * 80, "req", "Q", 60, rotation(9))  # the longest id is fine
    log.decide(log.state().pending, "abort")
    before = _files(log)
    with pytest.raises(ValueError, match="a decision is one of"):
        log.decide(u3, "maybe")
    with pytest.raises(EpochLogConflict, match=re.escape(
            f"{log.path}: publication W-2 (epoch 3) was decided by another publisher")):
        log.decide(u3, "abort")  # committed already
    log.decide(u3, "commit")  # committed already, as asked: a retried commit, nothing written
    with pytest.raises(EpochLogConflict, match=re.escape(
            f"{log.path}: renew of record 2 (epoch 3) names no undecided proposal")):
        log.renew(u3, 60)
    with pytest.raises(EpochLogConflict, match=re.escape(
            f"{log.path}: publication W-2 is committed already")):
        log.append_committed("W-2", rotation(9))
    assert issubclass(EpochLogConflict, EpochLogError)
    assert issubclass(EpochLogBusy, EpochLogConflict)
    # nothing written: no record, no blob, no temporary file
    assert _files(log) == before
    assert log.head() == u3


def test_decisions_on_an_empty_log_are_refused(tmp_path: Path, rng) -> None:
    a, empty = EpochLog(tmp_path / "a"), EpochLog(tmp_path / "empty")
    p = Writer(a, rng).propose(rotation(2))
    for call in (lambda: empty.decide(p, "commit"), lambda: empty.decide(p, "abort")):
        with pytest.raises(EpochLogConflict, match="was decided by another publisher"):
            call()
    with pytest.raises(EpochLogConflict, match=re.escape(
            "renew of record 0 (epoch 2) names no undecided proposal")):
        empty.renew(p, 60)
    assert empty.path.read_bytes() == b"" and empty.entries() == []
    assert empty.abort_expired() is None and empty.compact() == 0
    assert empty.path.read_bytes() == b""


def test_two_writers_see_each_others_head(tmp_path: Path, rng) -> None:
    a, b = EpochLog(tmp_path / "log"), EpochLog(tmp_path / "log")
    ea = Writer(a, rng, "A").rotation(2)
    assert b.head() == ea
    eb, _ = Writer(b, rng, "B").updates()
    assert a.head() == eb and eb.seq == 2
    i2 = ea.epoch_identity()
    assert i2 is not None
    stale = _batch(rng, 1)  # a router that still believes the head is epoch 2
    with pytest.raises(EpochLogConflict, match="epoch 3 does not follow the head, epoch 3"):
        a.propose("A-9", "req", "A", 60,
                  fixed(lambda s: (updates_entry(3, 2, stale, i2.after_updates(3, stale.digest),
                                                 s), stale)))
    ec = a.propose("A-9", "req", "A", 60, updates(stale))  # built on the head it is given
    assert (ec.seq, ec.epoch_id) == (4, 4) and b.state().pending == ec
    b.decide(ec, "abort")  # another object of the same log may decide it
    assert a.head() == eb and a.entries() == b.entries()


# ---------------------------------------------------------------- torn tails and corruption


def _three_records(log: EpochLog, rng) -> tuple[bytes, bytes]:
    """(the log's bytes after a committed rotation, the frame of the proposal after it)."""
    w = Writer(log, rng)
    w.rotation(2)
    two = log.path.read_bytes()
    w.updates(outcome=None)
    three = log.path.read_bytes()
    return two, three[len(two):]


@pytest.mark.parametrize("cut", [1, 4, 11, 27, 28, 100, -1])
def test_torn_tail_is_ignored_then_truncated_by_the_next_writer(log: EpochLog, rng, caplog,
                                                                 cut: int) -> None:
    two, third = _three_records(log, rng)
    assert len(third) > 100
    log.path.write_bytes(two + third[:cut])
    kept = log.entries()
    assert [(e.seq, e.kind) for e in kept] == [(0, "rotation"), (1, "commit")]
    assert log.head() == kept[0] and log.state().pending is None
    assert EpochLog(log.directory, create=False).live() == [kept[0]]  # a fresh reader as well
    assert log.path.stat().st_size == len(two) + len(third[:cut])  # readers never write
    with caplog.at_level(logging.WARNING, logger="morphogen.publication"):
        entry, _ = Writer(log, rng, "V").updates(outcome=None)
    assert (entry.seq, entry.epoch_id) == (2, 3)
    assert [r.getMessage() for r in caplog.records] == [
        f"{log.path}: truncating an incomplete final record at byte {len(two)} "
        f"({len(third[:cut])} bytes, never acknowledged)"]
    raw = log.path.read_bytes()
    assert raw[:len(two)] == two and log.entries() == kept + [entry]
    assert log.state().pending == entry


@pytest.mark.parametrize("zeros", [5, 300])
def test_zero_filled_tail_is_an_unsynced_append(log: EpochLog, rng, caplog,
                                                zeros: int) -> None:
    two, _ = _three_records(log, rng)
    log.path.write_bytes(two + bytes(zeros))
    assert [e.seq for e in log.entries()] == [0, 1]
    with caplog.at_level(logging.WARNING, logger="morphogen.publication"):
        entry, _ = Writer(log, rng, "V").updates()
    assert [r.getMessage() for r in caplog.records] == [
        f"{log.path}: truncating an incomplete final record at byte {len(two)} "
        f"({zeros} bytes, never acknowledged)"]
    assert [e.seq for e in log.entries()] == [0, 1, 2, 3] and log.head() == entry


@pytest.mark.parametrize("tail", [b"X", b"garbage that is no frame", b"\x00\x00junk",
                                  b"MGL1", b"MGL3" + bytes(40)])
def test_a_tail_that_is_no_frame_is_refused(log: EpochLog, rng, tail: bytes) -> None:
    two, _ = _three_records(log, rng)
    log.path.write_bytes(two + tail)
    why = re.escape(f"{log.path}: byte {len(two)}: not a record (bad magic or length)")
    with pytest.raises(EpochLogError, match=why):
        log.entries()
    with pytest.raises(EpochLogError, match=why):  # a writer refuses to cut it as well
        Writer(log, rng, "V").updates()
    with pytest.raises(EpochLogError, match=why):
        log.compact()
    assert log.path.read_bytes() == two + tail


@pytest.mark.parametrize("where", ["magic", "length", "inverse", "digest", "payload", "end"])
@pytest.mark.parametrize("record", [0, 2])
def test_a_flipped_byte_in_a_complete_record_is_refused(log: EpochLog, rng, where: str,
                                                        record: int) -> None:
    two, third = _three_records(log, rng)
    raw = bytearray(two + third)
    one = 28 + struct.unpack_from("<I", raw, 4)[0]  # the first record's frame size
    assert one < len(two)
    start = {0: 0, 2: len(two)}[record]
    offset = start + {"magic": 1, "length": 5, "inverse": 10, "digest": 20, "payload": 40,
                      "end": (one if record == 0 else len(third)) - 1}[where]
    raw[offset] ^= 0x10
    log.path.write_bytes(bytes(raw))
    why = ("not a record (bad magic or length)" if where in ("magic", "length", "inverse")
           else "record checksum mismatch (corrupt log)")
    with pytest.raises(EpochLogError, match=re.escape(f"{log.path}: byte {start}: {why}")):
        log.entries()
    calls = (log.live, log.head, log.state, log.compact, log.abort_expired,
             lambda: Writer(log, rng, "V").updates())
    for call in calls:
        with pytest.raises(EpochLogError):
            call()
    assert log.path.read_bytes() == bytes(raw)


def _hand_made(log: EpochLog, *payloads: bytes) -> None:
    log.path.write_bytes(b"".join(_frame(p) for p in payloads))


def _json(entry: LogEntry, **changes) -> bytes:
    """The record's payload as a writer makes it (the fields that are set), changed."""
    data = {k: v for k, v in {**asdict(entry), **changes}.items() if v is not None}
    return json.dumps(data).encode()


def test_complete_records_that_do_not_hold_together_are_refused(log: EpochLog, rng) -> None:
    i2 = EpochIdentity.of_snapshot(2, "ck")
    r2 = LogEntry(0, "rotation", 2, i2.digest, path="/snaps/2", checksum="ck",
                  snapshot_checksum="ck", chain=EMPTY_CHAIN, pub="r2", request="req-r2",
                  publisher="P", lease_ms=T0)
    c2 = LogEntry(1, "commit", 2, of=0)
    b = _batch(rng, 1)
    i3 = i2.after_updates(3, b.digest)
    u3 = LogEntry(2, "updates", 3, i3.digest, base_epoch=2,
                  blob=f"updates-000000000003-{b.digest[:16]}.bin", blob_digest=b.digest,
                  count=1, snapshot_checksum="ck", chain=i3.chain, pub="u3", request="req-u3",
                  publisher="P", lease_ms=T0)
    n3 = LogEntry(3, "renew", 3, of=2, publisher="P", lease_ms=T0 + 5)
    c3 = LogEntry(4, "commit", 3, of=2)
    i4 = EpochIdentity.of_snapshot(4, "ck4")
    r4 = LogEntry(2, "rotation", 4, i4.digest, path="/snaps/4", checksum="ck4",
                  snapshot_checksum="ck4", chain=EMPTY_CHAIN, pub="r2", request="req-r4",
                  publisher="P", lease_ms=T0)
    hist = LogEntry(0, "history", 0, pubs=[["old", 1, "0xabc", "req-old"]])
    # the hand-made records are valid as they are
    _hand_made(log, _json(r2), _json(c2), _json(u3), _json(n3), _json(c3))
    st = log.state()
    assert st.entries == [r2, c2, u3, n3, c3] and st.committed == [r2, u3]
    assert log.live() == [r2, u3] and st.pending is None
    assert st.pubs == {"r2": Published("r2", 2, r2.identity, "req-r2"),
                       "u3": Published("u3", 3, u3.identity, "req-u3")}
    _hand_made(log, _json(r2), _json(c2), _json(u3), _json(n3))
    assert log.state().pending == u3 and log.state().lease_ms == T0 + 5 and log.live() == [r2]
    _hand_made(log, _json(r2), _json(LogEntry(1, "abort", 2, of=0)))
    assert (log.live(), log.state().aborted, log.state().pending) == ([], 1, None)
    _hand_made(log, _json(hist), _json(r2, seq=1), _json(c2, seq=2, of=1))
    assert log.state().pubs == {"old": Published("old", 1, "0xabc", "req-old"),
                                "r2": Published("r2", 2, r2.identity, "req-r2")}
    assert log.live() == [replace(r2, seq=1)]

    other = EpochIdentity.of_snapshot(2, "other").after_updates(3, b.digest)
    j = _json
    cases: list[tuple[list[bytes], int, str]] = [
        ([b"{not json"], 0, "undecodable record"),
        ([b"\xff\xfe"], 0, "undecodable record"),
        ([b"[1, 2]"], 0, "a record is a JSON object"),
        ([j(r2, extra=1)], 0, "unknown record fields ['extra']"),
        ([j(r2, kind="merge")], 0, "record of unknown kind 'merge'"),
        ([j(r2, kind="append")], 0, "record of unknown kind 'append'"),
        ([j(r2, path=None, checksum=None)], 0, "rotation record lacks path, checksum"),
        ([j(r2, pub=None, lease_ms=None)], 0, "rotation record lacks pub, lease_ms"),
        ([j(u3, seq=0, publisher=None, request=None)], 0,
         "updates record lacks request, publisher"),
        ([j(r2, blob="x")], 0, "rotation record with fields ['blob']"),
        ([j(r2), j(c2, pub="r2")], 1, "commit record with fields ['pub']"),
        ([j(r2), j(c2, kind="abort", lease_ms=5)], 1, "abort record with fields ['lease_ms']"),
        ([j(r2), j(n3, seq=1, of=0, epoch_id=2, publisher=None)], 1,
         "renew record lacks publisher"),
        ([j(r2), j(c2, of=None)], 1, "commit record lacks of"),
        ([j(LogEntry(0, "history", 0))], 0, "history record lacks pubs"),
        ([j(hist, pub="x")], 0, "history record with fields ['pub']"),
        ([j(LogEntry(0, "abort", 3, "0x", of=0))], 0, "abort record with fields ['identity']"),
        ([j(r2, epoch_id=-2)], 0, "bad value for field epoch_id"),
        ([j(r2, seq=True)], 0, "bad value for field seq"),
        ([j(r2, lease_ms="soon")], 0, "bad value for field lease_ms"),
        ([j(r2, lease_ms=1.5)], 0, "bad value for field lease_ms"),
        ([j(r2, publisher=7)], 0, "bad value for field publisher"),
        ([j(r2, request=["a"])], 0, "bad value for field request"),
        ([j(r2), j(c2, of=-1)], 1, "bad value for field of"),
        ([j(hist, pubs=[["old", "1", "0xabc", "req"]])], 0, "bad value for field pubs"),
        ([j(hist, pubs=[["old", 1, "0xabc"]])], 0, "bad value for field pubs"),
        ([j(hist, pubs="old")], 0, "bad value for field pubs"),
        ([j(r2, pub="a b")], 0, "bad publication id 'a b'"),
        ([j(r2, pub="")], 0, "bad value for field pub: ''"),
        ([j(r2, identity="0x" + "0" * 32)], 0, "is not the digest of its epoch"),
        ([j(r2, chain="zz")], 0, "is not the digest of its epoch"),
        ([j(r2, epoch_id=1 << 64)], 0, "is not the digest of its epoch"),
        ([j(r2, seq=1)], 0, "record seq 1 where 0 was due"),
        ([j(r2), j(c2, seq=0)], 1, "record seq 0 where 1 was due"),
        ([j(r2), j(u3, seq=1)], 1,
         "record 1: proposal of epoch 3 while epoch 2 (record 0) is undecided"),
        ([j(r2), j(c2), j(r2, seq=2, pub="r2b")], 2,
         "record 2: epoch 2 does not follow the head, epoch 2"),
        ([j(r2), j(c2), j(r4)], 2, "record 2: publication r2 is committed already"),
        ([j(hist), j(r2, seq=1, pub="old")], 1, "record 1: publication old is committed already"),
        ([j(r2), j(c2), j(hist, seq=2)], 2, "record 2: a history record other than the first"),
        ([j(r2), j(c2), j(u3, base_epoch=1)], 2,
         "record 2: updates of epoch 3 were made for epoch 1, not the head, epoch 2"),
        ([j(r2), j(c2), j(u3, base_epoch=3)], 2, "updates of epoch 3 made for the later epoch 3"),
        ([j(r2), j(c2), j(u3, blob="../../etc/passwd")], 2,
         "blob name '../../etc/passwd' does not match the record"),
        ([j(r2), j(c2), j(u3, blob_digest="ab")], 2, "bad batch digest 'ab'"),
        ([j(r2), j(c2), j(u3, identity=other.digest, snapshot_checksum="other",
                          chain=other.chain)], 2,
         f"record 2: identity {other.digest} of epoch 3 does not follow {r2.identity}"),
        ([j(c2, seq=0)], 0, "record 0: commit of record 0 (epoch 2) names no undecided proposal"),
        ([j(r2), j(c2, epoch_id=3)], 1,
         "record 1: commit of record 0 (epoch 3) names no undecided proposal"),
        ([j(r2), j(c2, of=5)], 1,
         "record 1: commit of record 5 (epoch 2) names no undecided proposal"),
        ([j(r2), j(c2), j(c2, seq=2)], 2,
         "record 2: commit of record 0 (epoch 2) names no undecided proposal"),
        ([j(r2), j(c2, kind="abort"), j(c2, seq=2)], 2,
         "record 2: commit of record 0 (epoch 2) names no undecided proposal"),
        ([j(r2), j(n3, seq=1, of=0, epoch_id=2, publisher="Q")], 1,
         "record 1: renewal of record 0 by another publisher"),
        ([j(r2), j(c2), j(n3, seq=2, of=0, epoch_id=2)], 2,
         "record 2: renew of record 0 (epoch 2) names no undecided proposal"),
    ]
    for payloads, bad, message in cases:
        _hand_made(log, *payloads)
        offset = sum(len(_frame(p)) for p in payloads[:bad])
        with pytest.raises(EpochLogError, match=re.escape(f"{log.path}: byte {offset}: ")
                           + ".*" + re.escape(message)):
            log.entries()


@pytest.mark.parametrize("damage", ["missing", "truncated", "flipped", "header", "magic",
                                    "longer", "flags"])
def test_a_damaged_blob_is_refused_naming_the_file(log: EpochLog, rng, damage: str) -> None:
    w = Writer(log, rng)
    w.rotation(2)
    entry, _ = w.updates(5)
    blob = log.directory / entry.blob
    raw = bytearray(blob.read_bytes())
    if damage == "missing":
        blob.unlink()
    elif damage == "truncated":
        blob.write_bytes(raw[:-1])
    elif damage == "flipped":
        raw[-100] ^= 1
        blob.write_bytes(bytes(raw))
    elif damage == "header":
        blob.write_bytes(raw[:6])
    elif damage == "magic":
        blob.write_bytes(b"MGB9" + raw[4:])
    elif damage == "longer":
        blob.write_bytes(bytes(raw) + bytes(4096))
    else:
        raw[16 + 8 * 5] = 7
        blob.write_bytes(bytes(raw))
    why = {"missing": "update batch of epoch 3 is unreadable",
           "truncated": f"{len(raw) - 1} bytes for 5 changes, the record names 5 changes",
           "header": "not an update batch file (6 bytes, bad header)",
           "flipped": "batch digest does not match record 2",
           "longer": f"{len(raw) + 4096} bytes for 5 changes",
           "flags": "replace flags other than 0 and 1", "magic": "bad header"}[damage]
    with pytest.raises(EpochLogError, match=re.escape(f"{blob}: ") + ".*" + re.escape(why)):
        log.load_batch(entry)
    assert log.head() == entry  # the records themselves are intact


def test_load_batch_of_a_rotation_is_refused(log: EpochLog) -> None:
    entry = log.append_committed("r2", rotation(2))
    with pytest.raises(EpochLogError, match=re.escape(
            f"{log.path}: record 0 is not an update batch")):
        log.load_batch(entry)
    with pytest.raises(EpochLogError, match="record 1 is not an update batch"):
        log.load_batch(log.entries()[1])


# ---------------------------------------------------------------- compaction


def test_compact_keeps_committed_from_the_last_rotation(tmp_path: Path, rng) -> None:
    log = EpochLog(tmp_path / "log")
    other_writer = EpochLog(tmp_path / "log")  # opened before the file is replaced
    w = Writer(log, rng)
    r2 = w.rotation(2)  # W-1
    dead = [w.updates()[0], w.updates()[0]]  # W-2, W-3: epochs 3, 4
    dead.append(w.updates(outcome="abort")[0])  # W-4: epoch 5, aborted
    r5 = w.rotation(5, "ck-b")  # W-5
    kept, kept_batch = w.updates()  # W-6: epoch 6
    dead.append(w.updates(outcome="abort")[0])  # W-7: epoch 7, aborted
    stale = log.directory / ".tmp-123456-updates-x.bin"
    stale.write_bytes(b"left by a crash")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    # a batch still being written outside the lock (a fold, a staged part) is not swept
    (log.directory / ".tmp-654321-fold-y.bin").write_bytes(b"being written")
    (log.directory / "notes.txt").write_text("not the log's")
    assert log.live() == [r5, kept] and len(log.entries()) == 14
    assert all((log.directory / e.blob).exists() for e in dead)
    assert log.compact() == 14 - 5
    history = LogEntry(0, "history", 0, pubs=[
        ["W-1", 2, r2.identity, "req-W-1"], ["W-2", 3, dead[0].identity, "req-W-2"],
        ["W-3", 4, dead[1].identity, "req-W-3"]])
    compacted = [history, replace(r5, seq=1), LogEntry(2, "commit", 5, of=1),
                 replace(kept, seq=3), LogEntry(4, "commit", 6, of=3)]
    assert log.entries() == compacted
    assert log.live() == [replace(r5, seq=1), replace(kept, seq=3)]
    assert log.head() == replace(kept, seq=3)
    st = log.state()
    assert sorted(st.pubs) == ["W-1", "W-2", "W-3", "W-5", "W-6"] and st.aborted == 0
    # the dropped records' batches stay until the next compaction, for a reader that read
    # the records before this one
    assert sorted(os.listdir(log.directory)) == sorted(
        ["epochs.log", "log.json", kept.blob, "notes.txt", ".tmp-654321-fold-y.bin"]
        + [e.blob for e in dead])
    assert log.load_batch(log.head()).data == kept_batch.data
    assert log.compact() == 0  # nothing more to drop
    assert log.entries() == compacted
    # both writer objects go on appending to the rewritten file
    e7, _ = Writer(other_writer, rng, "O").updates()
    e8, _ = Writer(log, rng, "L").updates()
    assert (e7.seq, e7.epoch_id, e8.seq, e8.epoch_id) == (5, 7, 7, 8)
    assert EpochLog(tmp_path / "log", create=False).entries()[5:] == [
        e7, LogEntry(6, "commit", 7, of=5), e8, LogEntry(8, "commit", 8, of=7)]
    Writer(log, rng, "R").rotation(9)
    assert log.compact() > 0
    assert not any((log.directory / e.blob).exists() for e in dead)


def test_compacted_publications_are_still_answered(plog: EpochLog, rng) -> None:
    log = plog
    w = Writer(log, rng)
    r2 = w.rotation(2)  # W-1
    u3, _ = w.updates()  # W-2
    w.updates(outcome="abort")  # W-3
    r4 = w.rotation(4)  # W-4
    assert log.compact() == 8 - 3
    first = {"W-1": Published("W-1", 2, r2.identity, "req-W-1"),
             "W-2": Published("W-2", 3, u3.identity, "req-W-2")}
    assert log.entries()[0] == LogEntry(0, "history", 0, pubs=[
        ["W-1", 2, r2.identity, "req-W-1"], ["W-2", 3, u3.identity, "req-W-2"]])

    def never(head: LogEntry | None, seq: int) -> tuple[LogEntry, None]:
        raise AssertionError("a committed publication was built again")

    before = log.entries()
    for pub, done in first.items():
        assert log.propose(pub, "another request", "B", 60, never) == done
    assert log.entries() == before
    # an aborted publication was never committed: it is proposed anew
    w3 = log.propose("W-3", "req-W-3", "B", 60, updates(_batch(rng, 1)))
    assert (w3.seq, w3.epoch_id, w3.base_epoch) == (3, 5, 4)
    log.decide(w3, "commit")
    u6, _ = Writer(log, rng, "V").updates()
    r7 = Writer(log, rng, "V2").rotation(7)
    # a second compaction carries the first one's history on
    assert log.compact() == 9 - 3
    assert log.entries() == [
        LogEntry(0, "history", 0, pubs=[
            ["W-1", 2, r2.identity, "req-W-1"], ["W-2", 3, u3.identity, "req-W-2"],
            ["W-4", 4, r4.identity, "req-W-4"], ["W-3", 5, w3.identity, "req-W-3"],
            ["V-1", 6, u6.identity, "req-V-1"]]),
        replace(r7, seq=1), LogEntry(2, "commit", 7, of=1)]
    for pub, done in first.items():
        assert log.propose(pub, "req", "C", 60, never) == done
    assert log.propose("W-3", "req", "C", 60, never) == Published("W-3", 5, w3.identity,
                                                                  "req-W-3")
    assert log.compact() == 0 and len(log.entries()) == 3


def test_compaction_waits_for_the_undecided_proposal(plog: EpochLog, rng) -> None:
    log = plog
    w = Writer(log, rng)
    w.rotation(2)
    w.updates()
    r4 = w.rotation(4)
    pending, _ = w.updates(outcome=None)
    before = log.entries()
    files = _files(log) if log.durable else None
    assert log.compact() == 0
    assert log.entries() == before and (_files(log) if log.durable else None) == files
    assert log.state().pending == pending
    assert log.load_batch(pending).digest == pending.blob_digest
    log.decide(pending, "abort")
    assert log.compact() == 8 - 3
    assert [(e.seq, e.kind) for e in log.entries()] == [
        (0, "history"), (1, "rotation"), (2, "commit")]
    assert log.head() == replace(r4, seq=1) and log.state().pending is None
    # the aborted proposal's batch stays for a reader that read the records before this
    # compaction; the next one deletes it (on an object store, whose sweep runs unlocked,
    # also only once the head has passed its epoch: a re-send has the same name)
    assert log.load_batch(pending).digest == pending.blob_digest
    w.rotation(6)
    log.compact()
    with pytest.raises(EpochLogError, match="update batch of epoch 5 is unreadable"):
        log.load_batch(pending)  # the aborted proposal's blob is gone
    if log.durable and isinstance(log.directory, Path):
        assert sorted(os.listdir(log.directory)) == ["epochs.log", "log.json"]


def test_compact_of_an_all_aborted_log_leaves_an_empty_history(log: EpochLog, rng) -> None:
    ident = EpochIdentity.of_snapshot(1, "ck")
    p = log.propose("x", "req", "P", 60, updates(_batch(rng, 1), ident))
    log.decide(p, "abort")
    assert log.compact() == 1
    assert log.entries() == [LogEntry(0, "history", 0, pubs=[])]
    assert log.path.read_bytes() == _frame(b'{"epoch_id":0,"kind":"history","pubs":[],"seq":0}')
    # the aborted batch stays until a compaction after this one drops something
    assert sorted(os.listdir(log.directory)) == ["epochs.log", "log.json", p.blob]
    assert log.compact() == 0 and (log.live(), log.head()) == ([], None)


# ---------------------------------------------------------------- the publication protocol


def test_only_committed_proposals_are_live(plog: EpochLog, rng) -> None:
    log = plog
    w = Writer(log, rng)
    r2 = w.rotation(2)
    pending, _ = w.updates(outcome=None)
    assert (log.live(), log.head()) == ([r2], r2)
    assert log.state().committed == [r2] and log.state().pending == pending
    log.decide(pending, "abort")
    assert (log.live(), log.head()) == ([r2], r2)
    r3 = w.propose(rotation(3))  # an undecided rotation does not hide what is served
    assert (log.live(), log.head()) == ([r2], r2)
    log.decide(r3, "abort")
    assert (log.live(), log.head()) == ([r2], r2)
    assert "W-2" not in log.state().pubs and "W-3" not in log.state().pubs
    u3, _ = w.updates()
    assert (log.live(), log.head()) == ([r2, u3], u3)


def test_a_running_lease_makes_another_publisher_wait(plog: EpochLog, rng, clock) -> None:
    log = plog
    w = Writer(log, rng, "A")
    w.rotation(2)
    p, _ = w.updates(outcome=None)
    assert p.lease_ms == T0 + 60_000
    before = log.entries()
    clock[0] += 250
    for pub in ("B-1", p.pub):  # the same publication re-sent to another router waits too
        with pytest.raises(EpochLogBusy) as busy:
            log.propose(pub, "req", "B", 60, updates(_batch(rng, 1)))
        assert busy.value.remaining_s == pytest.approx(61.2 - 0.25)
        assert str(busy.value) == f"publication {p.pub} (epoch 3) is in progress"
    assert log.abort_expired() is None
    assert log.compact() == 0
    end = T0 + 61_200  # the lease and its slack, on this reader's clock
    clock[0] = end - 1
    with pytest.raises(EpochLogBusy) as busy:
        log.propose("B-1", "req", "B", 60, updates(_batch(rng, 1)))
    assert busy.value.remaining_s == pytest.approx(0.001, abs=1e-6)
    assert log.entries() == before
    clock[0] = end  # the lease has ended
    assert log.abort_expired() == p
    assert log.entries() == before + [LogEntry(3, "abort", 3, of=2)]
    assert log.state().pending is None and log.abort_expired() is None
    with pytest.raises(EpochLogConflict, match="was decided by another publisher"):
        log.decide(p, "commit")
    assert len(log.entries()) == 4


@pytest.fixture(params=["durable", "s3"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], EpochLog]:
    """Opens one more reader of a log every router sees (a directory, a loopback S3 prefix)."""
    if request.param == "s3":
        where: str | Path = f"s3://{request.getfixturevalue('s3_bucket')}/party-a/log"
    else:
        where = tmp_path / "log"
    return lambda: EpochLog(where)


def test_leases_are_timed_on_the_readers_clock_not_the_writers(shared, rng,
                                                              monkeypatch) -> None:
    """A writer's wall clock decides nothing (issue 28, hole 6): one running 600 s fast that
    dies blocks the next publisher for about its lease; a reader whose clock runs 600 s fast
    does not take a live writer's lease."""
    lease_s = 1.0  # seconds of margin over a loaded machine's stalls, between renewals too
    skew_ms = [0]
    real_now = epoch_log_module.now_ms
    monkeypatch.setattr(epoch_log_module, "now_ms", lambda: real_now() + skew_ms[0])
    writer, reader = shared(), shared()
    Writer(writer, rng, "R").rotation(2)
    skew_ms[0] = 600_000  # the writer's clock runs fast; it proposes and dies
    dead = writer.propose("pub-a", "req-a", "A", lease_s, updates(_batch(rng, 1)))
    skew_ms[0] = 0
    started = time.monotonic()
    while True:
        try:
            b = reader.propose("pub-b", "req-b", "B", lease_s, updates(_batch(rng, 1)))
            break
        except EpochLogBusy as busy:
            assert busy.remaining_s <= lease_s * 1.02 + 0.001  # never the writer's 600 s
            assert time.monotonic() - started < lease_s + 2.0
            time.sleep(min(0.05, busy.remaining_s + 0.001))
    took = time.monotonic() - started
    assert lease_s <= took < lease_s + 2.0
    assert [e.kind for e in reader.entries()[-3:]] == ["updates", "abort", "updates"]
    assert reader.state().pending == b and dead.seq == b.seq - 2
    # now B's clock is right and C's runs 600 s fast: B renews, C waits for it
    skew_ms[0] = 600_000
    late = shared()
    for _ in range(4):
        time.sleep(0.1)
        skew_ms[0] = 0
        reader.renew(b, lease_s)
        skew_ms[0] = 600_000
        with pytest.raises(EpochLogBusy):
            late.propose("pub-c", "req-c", "C", lease_s, updates(_batch(rng, 1)))
        assert late.abort_expired() is None
    reader.decide(b, "commit")
    assert reader.head() == b


def test_an_expired_proposal_is_aborted_by_the_next_one(plog: EpochLog, rng, caplog) -> None:
    log = plog
    r2 = Writer(log, rng, "R").rotation(2)
    b1, b2 = _batch(rng, 1), _batch(rng, 2)
    a = log.propose("pub-a", "req-a", "A", 0.05, updates(b1))
    time.sleep(0.1)
    with caplog.at_level(logging.WARNING, logger="morphogen.publication"):
        b = log.propose("pub-b", "req-b", "B", 60, updates(b2))
    assert [r.getMessage() for r in caplog.records] == [
        "aborting publication pub-a (epoch 3): its publisher's lease ran out undecided"]
    assert log.entries()[2:] == [a, LogEntry(3, "abort", 3, of=2), b]
    assert (b.seq, b.epoch_id, b.base_epoch, b.publisher) == (4, 3, 2, "B")
    assert log.state().pending == b and log.state().aborted == 1
    # the first publisher wakes up: its decision and its renewal are refused
    before = log.entries()
    for outcome in ("commit", "abort"):
        with pytest.raises(EpochLogConflict, match=re.escape(
                f"{log.path}: publication pub-a (epoch 3) was decided by another publisher "
                "(its lease ran out)")):
            log.decide(a, outcome)
    with pytest.raises(EpochLogConflict, match=re.escape(
            f"{log.path}: renew of record 2 (epoch 3) names no undecided proposal")):
        log.renew(a, 60)
    assert log.entries() == before
    log.decide(b, "commit")
    assert (log.live(), log.head()) == ([r2, b], b)
    # the aborted publication was never committed: it may be proposed again
    again = log.propose("pub-a", "req-a", "A", 60, updates(b1))
    assert (again.seq, again.epoch_id, again.base_epoch) == (6, 4, 3)


def test_the_same_pub_re_sent_after_the_lease_ends_is_proposed_anew(plog: EpochLog,
                                                                    rng) -> None:
    log = plog
    Writer(log, rng, "R").rotation(2)
    batch = _batch(rng, 1)
    a = log.propose("pub", "req", "A", 0.05, updates(batch))
    time.sleep(0.1)
    b = log.propose("pub", "req", "B", 60, updates(batch))
    assert b == replace(a, seq=4, publisher="B", lease_ms=b.lease_ms, lease_for_ms=60_000)
    assert log.entries()[3] == LogEntry(3, "abort", 3, of=2)
    with pytest.raises(EpochLogConflict, match="was decided by another publisher"):
        log.decide(a, "commit")
    log.decide(b, "commit")
    assert log.state().pubs["pub"] == Published("pub", 3, b.identity, "req")


def test_renewal_extends_the_owners_lease(plog: EpochLog, rng) -> None:
    log = plog
    Writer(log, rng, "R").rotation(2)
    p = log.propose("pub-a", "req-a", "A", 0.05, updates(_batch(rng, 1)))
    t = int(time.time() * 1000)
    log.renew(p, 30)
    n = log.entries()[-1]
    assert (n.seq, n.kind, n.epoch_id, n.of, n.publisher) == (3, "renew", 3, 2, "A")
    assert t + 30_000 <= n.lease_ms <= int(time.time() * 1000) + 30_000
    assert log.state().lease_ms == n.lease_ms
    time.sleep(0.1)  # past the first lease, well within the renewed one
    with pytest.raises(EpochLogBusy) as busy:
        log.propose("pub-b", "req-b", "B", 60, updates(_batch(rng, 1)))
    assert 29.0 < busy.value.remaining_s <= 30 * 1.02
    assert log.abort_expired() is None
    with pytest.raises(EpochLogConflict, match=re.escape(
            f"{log.path}: renewal of record 2 by another publisher")):
        log.renew(replace(p, publisher="B"), 60)
    assert len(log.entries()) == 4
    log.decide(p, "commit")
    with pytest.raises(EpochLogConflict, match=re.escape(
            f"{log.path}: renew of record 2 (epoch 3) names no undecided proposal")):
        log.renew(p, 30)
    with pytest.raises(EpochLogConflict, match="was decided by another publisher"):
        log.decide(p, "abort")
    log.decide(p, "commit")  # committed already, as asked: nothing written
    assert [e.kind for e in log.entries()] == ["rotation", "commit", "updates", "renew",
                                               "commit"]


def test_a_committed_publication_is_answered_not_applied_again(plog: EpochLog, rng) -> None:
    log = plog
    Writer(log, rng, "R").rotation(2)
    p = log.propose("pub-1", "req-1", "A", 60, updates(_batch(rng, 1)))
    log.decide(p, "commit")
    done = Published("pub-1", 3, p.identity, "req-1")

    def never(head: LogEntry | None, seq: int) -> tuple[LogEntry, None]:
        raise AssertionError("a committed publication was built again")

    before = log.entries()
    for publisher, request in [("A", "req-1"), ("B", "req-1"), ("B", "another request")]:
        assert log.propose("pub-1", request, publisher, 60, never) == done  # the first outcome
    assert log.entries() == before
    # also while another publisher's lease runs, and while a proposal whose lease ended waits:
    # the answer aborts nothing
    q = log.propose("pub-2", "req-2", "B", 60, updates(_batch(rng, 1)))
    assert log.propose("pub-1", "req-1", "C", 60, never) == done
    log.decide(q, "abort")
    x = log.propose("pub-3", "req-3", "B", 0, updates(_batch(rng, 1)))  # ended at once
    before = log.entries()
    assert log.propose("pub-1", "req-1", "C", 60, never) == done
    assert log.entries() == before and log.state().pending == x
    log.decide(x, "abort")
    assert "pub-2" not in log.state().pubs and "pub-3" not in log.state().pubs
    with pytest.raises(EpochLogConflict, match="publication pub-1 is committed already"):
        log.append_committed("pub-1", never)
    assert log.state().pubs == {"R-1": log.state().pubs["R-1"], "pub-1": done}


def test_an_in_memory_log_keeps_nothing_on_disk(tmp_path: Path, monkeypatch, rng,
                                               clock) -> None:
    monkeypatch.chdir(tmp_path)
    log = EpochLog.in_memory()
    assert not log.durable and EpochLog(tmp_path / "log").durable
    w = Writer(log, rng)
    r2 = w.rotation(2)
    u3, b3 = w.updates(5)
    assert log.load_batch(u3).data == b3.data
    r4 = w.rotation(4)
    assert log.compact() == 6 - 3 and log.live() == [replace(r4, seq=1)]
    assert log.load_batch(u3).data == b3.data  # until the next compaction
    w.rotation(5)
    log.compact()
    with pytest.raises(EpochLogError, match=re.escape(
            f"<memory>/{u3.blob}: update batch of epoch 3 is unreadable (no such blob)")):
        log.load_batch(u3)
    assert log.propose("W-1", "x", "B", 60, rotation(9)) == Published(
        "W-1", 2, r2.identity, "req-W-1")
    assert EpochLog.in_memory().entries() == []  # each in-memory log is its own
    assert EpochLog.in_memory().log_id != log.log_id
    assert sorted(os.listdir(tmp_path)) == ["log"]


# ---------------------------------------------------------------- concurrency


@pytest.mark.parametrize("lease_s", [30.0, 0.002])
def test_concurrent_publishers_serialise(tmp_path: Path, lease_s: float) -> None:
    Writer(EpochLog(tmp_path / "log"), np.random.default_rng(0), "R").rotation(1)
    errors: list[BaseException] = []
    deadline = time.monotonic() + 60

    def run(seed: int) -> None:
        log = EpochLog(tmp_path / "log", create=False)
        rng = np.random.default_rng(seed)
        done = 0
        try:
            while done < 8:
                assert time.monotonic() < deadline, "no progress"
                pub = f"T{seed}-{done}"
                try:
                    p = log.propose(pub, f"req-{pub}", f"T{seed}", lease_s,
                                    updates(_batch(rng, 1)))
                    assert isinstance(p, LogEntry), p  # our decisions all raised or held
                    log.decide(p, "commit")
                    done += 1
                except EpochLogConflict:  # busy, or our expired proposal was aborted
                    time.sleep(0.001)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    log = EpochLog(tmp_path / "log", create=False)
    st = log.state()
    assert st.pending is None
    assert [e.epoch_id for e in st.committed] == list(range(1, 34))
    assert sorted(st.pubs) == sorted(["R-1"] + [f"T{s}-{i}" for s in range(4) for i in range(8)])
    # every proposal has exactly one decision
    assert len(st.entries) == 2 * 33 + 2 * st.aborted
    assert sum(e.kind == "abort" for e in st.entries) == st.aborted
    if lease_s == 30.0:
        assert st.aborted == 0  # nobody waited out a lease
    for e in log.live()[1:]:
        assert log.load_batch(e).digest == e.blob_digest


def test_a_writer_waiting_on_a_replaced_file_appends_to_the_new_one(log: EpochLog,
                                                                    rng) -> None:
    w = Writer(log, rng)
    w.rotation(2)
    p, _ = w.updates(outcome=None)
    fd = os.open(log.path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a compaction holds it
    got: list[str] = []
    t = threading.Thread(target=lambda: got.append(log.decide(p, "commit") or "decided"))
    t.start()
    time.sleep(0.2)
    assert not got  # waiting on the lock
    old = log.path.read_bytes()
    with open(log.path, "rb") as replaced:
        tmp = log.directory / "swap"
        tmp.write_bytes(old)
        os.replace(tmp, log.path)
        os.close(fd)
        t.join(5)
        assert replaced.read() == old  # nothing went to the replaced file
    assert got == ["decided"]
    assert log.entries()[-1] == LogEntry(3, "commit", 3, of=2) and log.head() == p


# ---------------------------------------------------------------- bugs found (failing)


def test_a_stale_decision_after_compaction_never_decides_another_proposal(plog: EpochLog,
                                                                          rng) -> None:
    """Compaction renumbers records, so a later proposal of the same publication id (the
    admin's re-send) can get the seq of an earlier proposal that another publisher aborted:
    the earlier publisher's late decision must be refused, not decide the new proposal
    (docs/publication.md: exactly one decision per proposal)."""
    log = plog
    build = rotation(2)
    x = log.propose("x", "req-x", "X", 60, build)
    log.decide(x, "abort")
    assert log.compact() == 1  # a history record only
    a = log.propose("p", "req-p", "A", 0.05, build)  # A stalls past its lease
    assert a.seq == 1
    time.sleep(0.1)
    b = log.propose("p", "req-p", "B", 60, build)  # the admin's re-send: aborts A's
    log.decide(b, "abort")  # B's prepare failed
    assert log.compact() == 4
    c = log.propose("p", "req-p", "C", 60, build)  # re-sent again
    assert (c.seq, c.pub, c.publisher) == (a.seq, a.pub, "C")  # the seq of A's proposal
    with pytest.raises(EpochLogConflict):  # A's proposal was aborted long ago
        log.decide(a, "commit")
    assert log.state().pending == c  # still C's to decide
    log.decide(c, "commit")


@pytest.mark.parametrize("flaw", ["seq of the build", "empty request"])
def test_a_proposal_that_readers_would_refuse_is_never_written(plog: EpochLog, rng,
                                                               flaw: str) -> None:
    """A writer applies every check a reader applies before it appends: a record no node could
    read would take the whole party down."""
    log = plog
    Writer(log, rng).rotation(2)
    before = log.entries()
    build = updates(_batch(rng, 1))
    request = "req"
    if flaw == "seq of the build":
        inner = build

        def build(head: LogEntry | None, seq: int) -> tuple[LogEntry, ChangeBatch | None]:
            entry, batch = inner(head, seq)
            return replace(entry, seq=seq + 1), batch
    else:
        request = ""
    with pytest.raises(ValueError):
        log.propose("pub", request, "A", 60, build)
    assert log.entries() == before  # refused, nothing written


def test_a_read_decodes_only_the_records_appended_since_the_last(plog: EpochLog, rng,
                                                                   monkeypatch) -> None:
    """A scan is a function of the bytes: a log that only grew is taken up where the last read
    stopped, so a publication costs the same on a long log as on a short one; bytes that
    changed under it (a compaction, damage) are read from the start."""
    log = plog
    w = Writer(log, rng, "W")
    w.rotation(1)
    for _ in range(20):
        w.updates()
    decoded: list[int] = []
    real = epoch_log_module._decode

    def counting(payload: bytes, where: str) -> LogEntry:
        entry = real(payload, where)
        decoded.append(entry.seq)
        return entry

    monkeypatch.setattr(epoch_log_module, "_decode", counting)
    assert len(log.entries()) == 42 and decoded == [41]  # the decision it wrote last
    decoded.clear()
    assert len(log.entries()) == 42 and decoded == []  # nothing new, nothing decoded
    w.updates()
    # the proposal as it is checked before it is written, then as the decision's read finds
    # it, then the decision as it is checked: nothing of the 42 records before
    assert decoded == [42, 42, 43]
    w.rotation(30)
    log.compact()  # the rewritten log is another byte string: read whole
    decoded.clear()
    assert [e.kind for e in log.entries()] == ["history", "rotation", "commit"]
    assert decoded == [0, 1, 2]


# ---------------------------------------------------------------- records readers accept


def test_a_compacted_history_of_20000_rotations_fits_in_a_record() -> None:
    """Hourly rotations for two years: 20,000 ids whose requests carry the snapshot path.
    Written whole they are a history record over the readers' limit, and every replica of the
    party would refuse the log."""
    state = LogState()
    for i in range(20_000):
        pub = f"r-{i:024x}"
        request = f"rotation:blake2b-256:{i:064x}:/srv/snapshots/{i:012d}/snapshot-hourly"
        state.pubs[pub] = Published(pub, 10**9 + i, f"0x{i:032x}", request)
    plan = compacted(state)
    history = plan.records[0].pubs
    assert len(frame(plan.records[0])) - FRAME.size <= MAX_PAYLOAD
    assert 15_000 < len(history) < 20_000
    assert [p[0] for p in history] == list(state.pubs)[-len(history):]  # the newest ones


def _long_rotations(log: EpochLog, count: int, request_bytes: int) -> list[str]:
    """`count` committed rotations whose requests are `request_bytes` long (a long snapshot
    path): a few of them outgrow a history record."""
    pubs = []
    for epoch in range(1, count + 1):
        pub = f"rot-{epoch}"
        p = log.propose(pub, f"rotation:{epoch}:" + "p" * request_bytes, "W", 60,
                        rotation(epoch))
        log.decide(p, "commit")
        pubs.append(pub)
    return pubs


def test_a_compaction_keeps_the_newest_history_that_readers_accept(plog: EpochLog) -> None:
    log = plog
    pubs = _long_rotations(log, 12, 400_000)  # 11 ids of ~400 KB to keep: 4.4 MB
    assert log.compact() == 24 - 3
    reader = log if not log.durable else EpochLog(log.directory, create=False)
    history = reader.entries()[0].pubs  # the old code wrote a history readers refuse here
    kept = [p[0] for p in history]
    assert kept == pubs[-1 - len(kept):-1] and 8 <= len(kept) < 11  # the newest that fit

    def never(head: LogEntry | None, seq: int) -> tuple[LogEntry, None]:
        raise AssertionError("a committed publication was built again")

    assert isinstance(reader.propose(kept[-1], "again", "B", 60, never), Published)
    assert pubs[0] not in reader.state().pubs  # dropped: too old to fit


def test_a_record_over_the_readers_limit_is_refused_before_it_is_written(plog: EpochLog
                                                                         ) -> None:
    """A record every reader refuses would stop every replica: the writer refuses it first,
    saying why, and the log stays as it was."""
    log = plog
    Writer(log, np.random.default_rng(5)).rotation(2)
    before = log.entries()
    files = _files(log) if log.durable else None
    with pytest.raises(ValueError, match=r"a rotation record of \d+ bytes: readers refuse "
                                         r"records over 4194304 bytes"):
        log.propose("huge", "rotation:" + "p" * MAX_PAYLOAD, "A", 60, rotation(3))
    assert log.entries() == before and (_files(log) if log.durable else None) == files
    if log.durable:
        assert EpochLog(log.directory, create=False).entries() == before


def test_staged_parts_of_a_publication_in_every_backend(plog: EpochLog,
                                                        rng: np.random.Generator) -> None:
    """A publication in parts keeps its parts in the log's store (any router replica reads
    them there): written whole, read back by the batch's digest, missing ones named, gone
    after `drop_parts`; a compaction leaves them alone."""
    from morphogen.protocol.changes import joined

    def part(n: int) -> ChangeBatch:
        return ChangeBatch(rng.integers(0, 50, n).astype(np.int64), rng.random(n) < 0.5,
                           rng.bytes(n * 4096))

    parts = [part(3), part(1), part(2)]
    digest = joined(parts).digest
    assert plog.staged_parts(digest, 3) == ([], [1, 2])
    plog.stage_part(digest, 2, 3, parts[1])
    found, missing = plog.staged_parts(digest, 3)
    assert missing == [1] and len(found) == 1
    plog.stage_part(digest, 1, 3, parts[0])
    plog.stage_part(digest, 1, 3, parts[0])  # a re-sent part writes the same name again
    found, missing = plog.staged_parts(digest, 3)
    assert missing == [] and joined([*found, parts[2]]).digest == digest
    assert plog.staged_parts("0" * 64, 3) == ([], [1, 2])  # another batch's: none
    plog.compact()
    assert plog.staged_parts(digest, 3)[1] == []
    plog.drop_parts(digest, 3)
    assert plog.staged_parts(digest, 3) == ([], [1, 2])
    plog.drop_parts(digest, 3)  # again: nothing to remove, no error
