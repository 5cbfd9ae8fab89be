"""The party's durable epoch log: records, blobs, torn tails, corruption, conflicts, compaction."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import struct
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from morphogen.changes import ChangeBatch
from morphogen.epoch_log import EpochLog, EpochLogConflict, EpochLogError, LogEntry
from morphogen.identity import EMPTY_CHAIN, EpochIdentity


def _batch(rng: np.random.Generator, n: int) -> ChangeBatch:
    pages = rng.integers(0, 1 << 40, n, dtype=np.int64)
    replace_ = rng.random(n) < 0.5
    return ChangeBatch(pages, replace_, rng.integers(0, 256, n * 4096, np.uint8).tobytes())


def _frame(payload: bytes) -> bytes:
    """A record frame built here, independently of the module, for hand-made records."""
    digest = hashlib.blake2b(payload, digest_size=16).digest()
    return b"MGL1" + struct.pack("<II", len(payload), len(payload) ^ 0xFFFFFFFF) + digest + payload


def _rotation(seq: int, epoch: int, checksum: str = "ck") -> LogEntry:
    ident = EpochIdentity.of_snapshot(epoch, checksum)
    return LogEntry(seq, "rotation", epoch, ident.digest, path=f"/snaps/{epoch}",
                    checksum=checksum, snapshot_checksum=checksum, chain=EMPTY_CHAIN)


class Writer:
    """Appends updates on top of whatever the log's head is, as a router does."""

    def __init__(self, log: EpochLog, rng: np.random.Generator) -> None:
        self.log, self.rng = log, rng

    def updates(self, n: int = 2) -> tuple[LogEntry, ChangeBatch, EpochIdentity]:
        head = self.log.head()
        assert head is not None
        base = head.epoch_identity()
        assert base is not None
        batch = _batch(self.rng, n)
        ident = base.after_updates(head.epoch_id + 1, batch.digest)
        entry = self.log.append_updates(head.epoch_id + 1, head.epoch_id, batch, ident)
        return entry, batch, ident


@pytest.fixture
def log(tmp_path: Path) -> EpochLog:
    return EpochLog(tmp_path / "log")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def test_rotations_updates_and_aborts_round_trip(log: EpochLog, rng) -> None:
    assert (log.entries(), log.live(), log.head()) == ([], [], None)
    r2 = EpochIdentity.of_snapshot(2, "ck-a")
    e0 = log.append_rotation(2, "/snaps/a", "ck-a", r2)
    assert e0 == LogEntry(0, "rotation", 2, r2.digest, path="/snaps/a", checksum="ck-a",
                          snapshot_checksum="ck-a", chain=EMPTY_CHAIN)
    b3 = _batch(rng, 3)
    i3 = r2.after_updates(3, b3.digest)
    e1 = log.append_updates(3, 2, b3, i3)
    assert e1 == LogEntry(1, "updates", 3, i3.digest, base_epoch=2,
                          blob=f"updates-000000000003-{b3.digest[:16]}.bin",
                          blob_digest=b3.digest, count=3, snapshot_checksum="ck-a",
                          chain=i3.chain)
    assert e1.epoch_identity() == i3
    b4 = _batch(rng, 1)
    log.append_updates(4, 3, b4, i3.after_updates(4, b4.digest))
    assert log.append_abort(4) == LogEntry(3, "abort", 4, None)
    assert log.head() == e1
    b4b = _batch(rng, 2)
    i4 = i3.after_updates(4, b4b.digest)
    e4 = log.append_updates(4, 3, b4b, i4)
    assert e4.seq == 4 and e4.identity == i4.digest
    log.append_rotation(5, "/snaps/b", "ck-b", EpochIdentity.of_snapshot(5, "ck-b"))
    log.append_abort(5)  # the rotation failed: the party stays on epoch 4
    assert log.head() == e4
    assert log.live() == [e0, e1, e4]
    assert [(e.seq, e.kind, e.epoch_id) for e in log.entries()] == [
        (0, "rotation", 2), (1, "updates", 3), (2, "updates", 4), (3, "abort", 4),
        (4, "updates", 4), (5, "rotation", 5), (6, "abort", 5)]
    r6 = EpochIdentity.of_snapshot(6, "ck-c")
    e7 = log.append_rotation(6, "/snaps/c", "ck-c", r6)
    assert log.live() == [e7] and log.head() == e7 and e7.seq == 7
    assert e7.identity == r6.digest and e7.epoch_identity() == r6


def test_live_without_a_rotation_is_every_live_entry(log: EpochLog, rng) -> None:
    base = EpochIdentity.of_snapshot(1, "configured")
    batches = [_batch(rng, 1) for _ in range(3)]
    ident, made = base, []
    for epoch, b in enumerate(batches, start=2):
        ident = ident.after_updates(epoch, b.digest)
        made.append(log.append_updates(epoch, epoch - 1, b, ident))
    log.append_abort(4)
    assert log.live() == made[:2]
    log.append_abort(3)
    log.append_abort(2)
    assert log.live() == [] and log.head() is None
    # an empty live log takes any base again
    again = log.append_updates(7, 5, batches[0], EpochIdentity.of_snapshot(5, "x").after_updates(
        7, batches[0].digest))
    assert log.live() == [again] and again.seq == 6


@pytest.mark.parametrize("n", [0, 1, 37])
def test_batch_round_trip_is_bit_exact(log: EpochLog, rng, n: int) -> None:
    log.append_rotation(2, "/s", "ck", EpochIdentity.of_snapshot(2, "ck"))
    entry, batch, _ = Writer(log, rng).updates(n)
    blob = log.directory / entry.blob
    assert blob.stat().st_size == 16 + n * (8 + 1 + 4096)
    assert blob.read_bytes()[:16] == b"MGB1" + struct.pack("<IQ", 4096, n)
    got = log.load_batch(entry)
    assert got.pages.dtype == np.int64 and got.replace.dtype == np.bool_
    np.testing.assert_array_equal(got.pages, batch.pages)
    np.testing.assert_array_equal(got.replace, batch.replace)
    assert got.data == batch.data
    assert got.digest == batch.digest == entry.blob_digest
    assert not [p for p in log.directory.iterdir() if p.name.startswith(".")]


def test_reopened_log_sees_the_same_entries(tmp_path: Path, rng) -> None:
    first = EpochLog(tmp_path / "log")
    first.append_rotation(2, "/s", "ck", EpochIdentity.of_snapshot(2, "ck"))
    writer = Writer(first, rng)
    made = [writer.updates() for _ in range(4)]
    first.append_abort(6)
    again = EpochLog(tmp_path / "log", create=False)
    assert again.directory == tmp_path / "log"
    assert again.entries() == first.entries() and len(again.entries()) == 6
    assert again.live() == first.live() == [first.entries()[0]] + [m[0] for m in made[:3]]
    entry, batch, ident = made[2]
    assert again.head() == entry and entry.identity == ident.digest
    assert again.head().epoch_identity() == ident
    assert again.load_batch(entry).data == batch.data


def test_create_false_needs_the_directory(tmp_path: Path) -> None:
    with pytest.raises(EpochLogError, match="no epoch log directory"):
        EpochLog(tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()
    EpochLog(tmp_path / "made" / "deep")
    assert (tmp_path / "made" / "deep").is_dir()


def test_appends_that_do_not_follow_the_head_are_refused(log: EpochLog, rng) -> None:
    with pytest.raises(EpochLogConflict, match="abort of epoch 2 does not name an empty log"):
        log.append_abort(2)
    r2 = EpochIdentity.of_snapshot(2, "ck")
    log.append_rotation(2, "/s", "ck", r2)
    entry, _, i3 = Writer(log, rng).updates()
    before = (log.path.read_bytes(), sorted(os.listdir(log.directory)))
    b = _batch(rng, 1)
    with pytest.raises(EpochLogConflict, match="epoch 3 does not follow the head, epoch 3"):
        log.append_rotation(3, "/t", "ck2", EpochIdentity.of_snapshot(3, "ck2"))
    with pytest.raises(EpochLogConflict, match="made for epoch 2, not the head, epoch 3"):
        log.append_updates(4, 2, b, r2.after_updates(4, b.digest))
    with pytest.raises(EpochLogConflict, match="epoch 2 does not follow the head, epoch 3"):
        log.append_updates(2, 1, b, EpochIdentity.of_snapshot(1, "ck").after_updates(2, b.digest))
    # the right epochs, but computed from other data than the head's
    other = EpochIdentity.of_snapshot(3, "elsewhere").after_updates(4, b.digest)
    with pytest.raises(EpochLogConflict, match=f"identity {other.digest} of epoch 4 does not "
                       f"follow {i3.digest}"):
        log.append_updates(4, 3, b, other)
    with pytest.raises(EpochLogConflict, match="abort of epoch 2 does not name the head, epoch 3"):
        log.append_abort(2)
    with pytest.raises(ValueError, match="identity of epoch 3 given for epoch 4"):
        log.append_updates(4, 3, b, i3)
    with pytest.raises(ValueError, match="cannot apply to epoch 4"):
        log.append_updates(4, 4, b, i3.after_updates(4, b.digest))
    assert issubclass(EpochLogConflict, EpochLogError)
    # nothing written: no record, no blob, no temporary file
    assert (log.path.read_bytes(), sorted(os.listdir(log.directory))) == before
    assert log.head() == entry


def _three_records(log: EpochLog, rng) -> tuple[bytes, bytes]:
    """(the log's bytes after two records, the third record's frame)."""
    log.append_rotation(2, "/s", "ck", EpochIdentity.of_snapshot(2, "ck"))
    w = Writer(log, rng)
    w.updates()
    two = log.path.read_bytes()
    w.updates()
    three = log.path.read_bytes()
    return two, three[len(two):]


@pytest.mark.parametrize("cut", [1, 4, 11, 27, 28, 100, -1])
def test_torn_tail_is_ignored_then_truncated_by_the_next_writer(log: EpochLog, rng, caplog,
                                                                 cut: int) -> None:
    two, third = _three_records(log, rng)
    assert len(third) > 100
    log.path.write_bytes(two + third[:cut])
    kept = log.entries()
    assert [e.seq for e in kept] == [0, 1] and log.head() == kept[1]
    assert EpochLog(log.directory).live() == kept  # a fresh reader as well
    assert log.path.stat().st_size == len(two) + len(third[:cut])  # readers never write
    with caplog.at_level(logging.WARNING, logger="morphogen.epoch_log"):
        entry, _, _ = Writer(log, rng).updates()
    assert entry.seq == 2 and entry.epoch_id == 4
    assert [r.getMessage() for r in caplog.records] == [
        f"{log.path}: truncating an incomplete final record at byte {len(two)} "
        f"({len(third[:cut])} bytes, never acknowledged)"]
    raw = log.path.read_bytes()
    assert raw[:len(two)] == two and len(log.entries()) == 3


def test_zero_filled_tail_is_an_unsynced_append(log: EpochLog, rng) -> None:
    two, _ = _three_records(log, rng)
    log.path.write_bytes(two + bytes(300))
    assert [e.seq for e in log.entries()] == [0, 1]


@pytest.mark.parametrize("tail", [b"X", b"garbage that is no frame", b"\x00\x00junk"])
def test_a_tail_that_is_no_frame_is_refused(log: EpochLog, rng, tail: bytes) -> None:
    two, _ = _three_records(log, rng)
    log.path.write_bytes(two + tail)
    with pytest.raises(EpochLogError, match=f"byte {len(two)}: not a record"):
        log.entries()
    with pytest.raises(EpochLogError):  # a writer refuses to cut it as well
        log.append_abort(4)
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
    why = "bad magic or length" if where in ("magic", "length", "inverse") else "checksum"
    with pytest.raises(EpochLogError, match=f"{log.path}: byte {start}: .*{why}"):
        log.entries()
    for call in (log.live, log.head, lambda: Writer(log, rng).updates()):
        with pytest.raises(EpochLogError):
            call()
    assert log.path.read_bytes() == bytes(raw)


def _hand_made(log: EpochLog, *payloads: bytes) -> None:
    log.path.write_bytes(b"".join(_frame(p) for p in payloads))


def _json(entry: LogEntry, **changes) -> bytes:
    return json.dumps({**asdict(entry), **changes}).encode()


def test_complete_records_that_do_not_hold_together_are_refused(log: EpochLog, rng) -> None:
    r2, r3 = _rotation(0, 2), _rotation(1, 3)
    size0 = len(_frame(_json(r2)))
    b = _batch(rng, 1)
    i3 = r2.epoch_identity().after_updates(3, b.digest)
    upd = LogEntry(1, "updates", 3, i3.digest, base_epoch=2,
                   blob=f"updates-000000000003-{b.digest[:16]}.bin", blob_digest=b.digest,
                   count=1, snapshot_checksum="ck", chain=i3.chain)
    _hand_made(log, _json(r2), _json(upd))
    assert log.live() == [r2, upd]  # the hand-made records are valid as they are
    cases = [
        ([b"{not json"], 0, "undecodable record"),
        ([b"[1, 2]"], 0, "a record is a JSON object"),
        ([_json(r2, extra=1)], 0, r"unknown record fields \['extra'\]"),
        ([_json(r2, kind="fold")], 0, "record of unknown kind 'fold'"),
        ([_json(r2, path=None, checksum=None)], 0, "rotation record lacks path, checksum"),
        ([_json(r2, blob="x")], 0, r"rotation record with fields \['blob'\]"),
        ([_json(r2, epoch_id=-2)], 0, "bad value for field epoch_id"),
        ([_json(r2, seq=True)], 0, "bad value for field seq"),
        ([_json(r2, identity="0x" + "0" * 32)], 0, "is not the digest of its epoch"),
        ([_json(r2, chain="zz")], 0, "is not the digest of its epoch"),
        ([_json(r2, seq=1)], 0, "record seq 1 where 0 was due"),
        ([_json(r2), _json(r3, seq=0)], size0, "record seq 0 where 1 was due"),
        ([_json(r2), _json(r2, seq=1)], size0, "record 1: epoch 2 does not follow the head"),
        ([_json(r2), _json(upd, base_epoch=1)], size0, "made for epoch 1, not the head"),
        ([_json(r2), _json(upd, blob="../../etc/passwd")], size0, "blob name"),
        ([_json(r2), _json(upd, blob_digest="ab")], size0, "bad batch digest"),
        ([_json(r2), _json(LogEntry(1, "abort", 3, None))], size0,
         "record 1: abort of epoch 3 does not name the head, epoch 2"),
        ([_json(LogEntry(0, "abort", 3, "0x"))], 0, "abort record with fields"),
    ]
    for payloads, offset, message in cases:
        _hand_made(log, *payloads)
        with pytest.raises(EpochLogError, match=f"{log.path}: byte {offset}: .*{message}"):
            log.entries()
    # an updates record whose identity is self-consistent but not derived from the head's
    other = EpochIdentity.of_snapshot(2, "other").after_updates(3, b.digest)
    _hand_made(log, _json(r2), _json(upd, identity=other.digest, snapshot_checksum="other",
                                     chain=other.chain))
    with pytest.raises(EpochLogError, match=f"identity {other.digest} of epoch 3 does not follow"):
        log.head()


@pytest.mark.parametrize("damage", ["missing", "truncated", "flipped", "header", "magic",
                                    "longer", "flags"])
def test_a_damaged_blob_is_refused_naming_the_file(log: EpochLog, rng, damage: str) -> None:
    log.append_rotation(2, "/s", "ck", EpochIdentity.of_snapshot(2, "ck"))
    entry, _, _ = Writer(log, rng).updates(5)
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
        blob.write_bytes(b"MGB2" + raw[4:])
    elif damage == "longer":
        blob.write_bytes(bytes(raw) + bytes(4096))
    else:
        raw[16 + 8 * 5] = 7
        blob.write_bytes(bytes(raw))
    why = {"missing": "unreadable", "truncated": "bytes for 5 changes", "header": "bad header",
           "flipped": "batch digest does not match record 1", "longer": "bytes for 5 changes",
           "flags": "replace flags", "magic": "bad header"}[damage]
    with pytest.raises(EpochLogError, match=f"{blob}: .*{why}"):
        log.load_batch(entry)
    assert log.head() == entry  # the records themselves are intact


def test_load_batch_of_a_rotation_is_refused(log: EpochLog) -> None:
    entry = log.append_rotation(2, "/s", "ck", EpochIdentity.of_snapshot(2, "ck"))
    with pytest.raises(EpochLogError, match="record 0 is not an update batch"):
        log.load_batch(entry)


def test_compact_keeps_live_and_deletes_dead_blobs(tmp_path: Path, rng) -> None:
    log = EpochLog(tmp_path / "log")
    other_writer = EpochLog(tmp_path / "log")  # opened before the file is replaced
    log.append_rotation(2, "/a", "ck-a", EpochIdentity.of_snapshot(2, "ck-a"))
    w = Writer(log, rng)
    dead = [w.updates()[0], w.updates()[0]]  # epochs 3, 4
    log.append_abort(4)
    dead.append(w.updates()[0])  # 4 again
    log.append_rotation(5, "/b", "ck-b", EpochIdentity.of_snapshot(5, "ck-b"))
    kept, kept_batch, _ = w.updates()  # 6
    dead.append(w.updates()[0])  # 7
    log.append_abort(7)
    (log.directory / ".tmp-123456-updates-x.bin").write_bytes(b"left by a crash")
    (log.directory / "notes.txt").write_text("not the log's")
    live, head = log.live(), log.head()
    assert [(e.kind, e.epoch_id) for e in live] == [("rotation", 5), ("updates", 6)]
    assert all((log.directory / e.blob).exists() for e in dead)
    assert log.compact() == 9 - 2
    assert log.entries() == [replace(e, seq=i) for i, e in enumerate(live)]
    assert [replace(e, seq=0) for e in log.live()] == [replace(e, seq=0) for e in live]
    assert replace(log.head(), seq=0) == replace(head, seq=0)
    assert sorted(p.name for p in log.directory.iterdir()) == sorted(
        ["epochs.log", kept.blob, "notes.txt"])
    assert log.load_batch(log.head()).data == kept_batch.data
    assert log.compact() == 0  # nothing more to drop
    assert log.entries() == [replace(e, seq=i) for i, e in enumerate(live)]
    # both writer objects go on appending to the rewritten file
    e7, _, _ = Writer(other_writer, rng).updates()
    e8, _, _ = Writer(log, rng).updates()
    assert (e7.seq, e7.epoch_id, e8.seq, e8.epoch_id) == (2, 7, 3, 8)
    assert EpochLog(tmp_path / "log").entries()[2:] == [e7, e8]


def test_compact_of_an_all_aborted_log_leaves_it_empty(log: EpochLog, rng) -> None:
    ident = EpochIdentity.of_snapshot(1, "ck")
    b = _batch(rng, 1)
    log.append_updates(2, 1, b, ident.after_updates(2, b.digest))
    log.append_abort(2)
    assert log.compact() == 2
    assert log.path.read_bytes() == b"" and log.entries() == []
    assert sorted(os.listdir(log.directory)) == ["epochs.log"]


def test_two_writers_see_each_others_head(tmp_path: Path, rng) -> None:
    a, b = EpochLog(tmp_path / "log"), EpochLog(tmp_path / "log")
    ea = a.append_rotation(2, "/s", "ck", EpochIdentity.of_snapshot(2, "ck"))
    assert b.head() == ea
    eb, batch, ident = Writer(b, rng).updates()
    assert a.head() == eb and eb.seq == 1
    # a router that still believes the head is epoch 2
    stale = _batch(rng, 1)
    with pytest.raises(EpochLogConflict, match="epoch 3 does not follow the head, epoch 3"):
        a.append_updates(3, 2, stale, ea.epoch_identity().after_updates(3, stale.digest))
    ec = a.append_updates(4, 3, stale, ident.after_updates(4, stale.digest))
    assert b.head() == ec and ec.seq == 2
    assert b.append_abort(4).seq == 3 and a.head() == eb
    assert a.entries() == b.entries()


def test_concurrent_writers_serialise(tmp_path: Path) -> None:
    EpochLog(tmp_path / "log").append_rotation(1, "/s", "ck", EpochIdentity.of_snapshot(1, "ck"))
    errors: list[BaseException] = []

    def run(seed: int) -> None:
        w = Writer(EpochLog(tmp_path / "log"), np.random.default_rng(seed))
        done = 0
        try:
            while done < 8:
                try:
                    w.updates(1)
                    done += 1
                except EpochLogConflict:
                    pass  # another writer moved the head between our read and our append
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    log = EpochLog(tmp_path / "log")
    assert [e.epoch_id for e in log.live()] == list(range(1, 34))
    for e in log.live()[1:]:
        assert log.load_batch(e).digest == e.blob_digest


def test_a_writer_waiting_on_a_replaced_file_appends_to_the_new_one(log: EpochLog, rng) -> None:
    log.append_rotation(2, "/s", "ck", EpochIdentity.of_snapshot(2, "ck"))
    fd = os.open(log.path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a compaction holds it
    got: list[LogEntry] = []
    t = threading.Thread(target=lambda: got.append(log.append_abort(2)))
    t.start()
    time.sleep(0.2)
    assert not got  # waiting on the lock
    tmp = log.directory / "swap"
    tmp.write_bytes(log.path.read_bytes())
    os.replace(tmp, log.path)
    os.close(fd)
    t.join(5)
    assert got == [LogEntry(1, "abort", 2, None)]
    assert log.entries()[1] == got[0] and log.head() is None
