"""The epoch log on object storage (a loopback S3 server): write-once records, the next
sequence number as the lock, compaction by a seal record, publishers racing for records."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace

import numpy as np
import obstore
import pytest

from morphogen.publication.log import EpochLog, EpochLogConflict, EpochLogError, LogEntry
from morphogen.storage import open_location
from tests.unit.test_epoch_log import Writer, _batch, updates


def _keys(uri: str) -> list[str]:
    loc = open_location(uri)
    return sorted(m["path"][len(loc.prefix) + 1:]
                  for m in obstore.list(loc.store, prefix=loc.prefix).collect())


def test_records_are_write_once_objects_and_replicas_check_the_marker(s3_bucket) -> None:
    uri = f"s3://{s3_bucket}/a/log"
    log = EpochLog(uri)
    w = Writer(log, np.random.default_rng(1))
    w.rotation(2)
    p, batch = w.updates()
    keys = _keys(uri)
    assert keys[-1] == "records/g000000/000000000003" and "log.json" in keys
    assert f"blobs/{p.blob}" in keys
    replica = EpochLog(uri, create=False, log_id=log.log_id)
    assert replica.entries() == log.entries()
    assert replica.load_batch(replica.head()).digest == batch.digest
    with pytest.raises(EpochLogError, match=f"node {socket.gethostname()}: {uri}: the epoch "
                                            "log here is .* the party's is other"):
        EpochLog(uri, create=False, log_id="other")
    with pytest.raises(EpochLogError, match=f"s3://{s3_bucket}/b/log: not an epoch log"):
        EpochLog(f"s3://{s3_bucket}/b/log", create=False)
    # a record another writer would append at a taken seq is refused by the store itself
    loc = open_location(uri)
    with pytest.raises(Exception, match="already exists"):
        obstore.put(loc.store, loc.key("records/g000000/000000000003"), b"x", mode="create")


def test_a_compaction_seals_the_generation_and_drops_the_one_before(s3_bucket) -> None:
    uri = f"s3://{s3_bucket}/log"
    log = EpochLog(uri)
    w = Writer(log, np.random.default_rng(2))
    w.rotation(2)
    u, _ = w.updates()
    w.rotation(4)
    assert log.compact() == 6 - 3
    assert _keys(uri)[-1] == "records/g000000/000000000006"  # the seal
    w.updates()
    assert _keys(uri)[-1] == "records/g000001/000000000004"
    w.rotation(6)
    log.compact()
    keys = _keys(uri)
    assert not [k for k in keys if k.startswith("records/g000000/")]  # dropped
    assert not [k for k in keys if k == f"blobs/{u.blob}"]  # its record was dropped
    fresh = EpochLog(uri, create=False)
    assert fresh.entries() == log.entries() and fresh.head().epoch_id == 6
    assert fresh.propose("W-2", "x", "B", 60, None).epoch_id == 3  # still answered


@pytest.mark.parametrize("lease_s", [30.0, 0.002])
def test_racing_publishers_serialise_through_the_object_store(s3_bucket, lease_s) -> None:
    uri = f"s3://{s3_bucket}/race"
    Writer(EpochLog(uri), np.random.default_rng(0), "R").rotation(1)
    errors: list[BaseException] = []
    deadline = time.monotonic() + 120

    def run(seed: int) -> None:
        log = EpochLog(uri, create=False)  # each its own reader and writer, as on other nodes
        rng = np.random.default_rng(seed)
        done = 0
        try:
            while done < 5:
                assert time.monotonic() < deadline, "no progress"
                pub = f"T{seed}-{done}"
                try:
                    p = log.propose(pub, f"req-{pub}", f"T{seed}", lease_s,
                                    updates(_batch(rng, 1)))
                    assert isinstance(p, LogEntry), p
                    log.decide(p, "commit")
                    done += 1
                except EpochLogConflict:  # busy, or our expired proposal was aborted
                    time.sleep(0.002)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    def compactor() -> None:
        log = EpochLog(uri, create=False)
        try:
            while any(t.is_alive() for t in threads):
                log.compact()
                time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(3)]
    extra = threading.Thread(target=compactor)
    for t in threads:
        t.start()
    extra.start()
    for t in threads:
        t.join()
    extra.join()
    assert errors == []
    log = EpochLog(uri, create=False)
    st = log.state()
    assert st.pending is None
    assert [e.epoch_id for e in st.committed] == list(range(1, 17))
    assert sorted(st.pubs) == sorted(["R-1"] + [f"T{s}-{i}" for s in range(3) for i in range(5)])
    # a proposal and its decision each, after the history record of a compaction that dropped
    # aborted attempts (short leases make them), and no record twice
    compacted = st.entries[0].kind == "history"
    assert len(st.entries) == compacted + 2 * 16 + 2 * st.aborted
    if lease_s == 30.0:
        assert st.aborted == 0
    for e in log.live()[1:]:
        assert log.load_batch(e).digest == e.blob_digest


def test_a_writer_stalled_across_two_compactions_does_not_append_into_a_dead_generation(
        s3_bucket) -> None:
    """A router that read the log, then stalled (a pause, a slow network) while compactions
    sealed its generation and deleted it, finds its record's key free again: its create must
    not count, or the proposal it acknowledges sits where no reader looks."""
    uri = f"s3://{s3_bucket}/stall"
    rng = np.random.default_rng(3)
    other = Writer(EpochLog(uri), rng, "B")
    other.rotation(1)
    stalled = EpochLog(uri, create=False)
    assert stalled._objects is not None
    real_create = stalled._objects.create
    reached, go = threading.Event(), threading.Event()

    def create(name: str, data: bytes) -> bool:
        if name.startswith("records/") and not reached.is_set():
            reached.set()  # the state is read, the record built: stall here
            assert go.wait(60)
        return real_create(name, data)

    stalled._objects.create = create  # type: ignore[method-assign]
    got: dict = {}
    thread = threading.Thread(target=lambda: got.update(p=stalled.propose(
        "S-1", "req-S-1", "S", 60, updates(_batch(rng, 1)))))
    thread.start()
    assert reached.wait(60)
    for rotation_to in (3, 5):  # each compaction seals a generation; the second drops the first
        other.updates()
        other.rotation(rotation_to)
        assert other.log.compact() > 0
    keys = _keys(uri)
    assert not [k for k in keys if k.startswith("records/g000000/")]
    # the batch it uploaded for epoch 2 before its record is named by no record, for an epoch
    # the log has passed: the compactions swept it with the dropped records' batches
    assert not [k for k in keys if k.startswith("blobs/updates-000000000002-")]
    go.set()
    thread.join(60)
    p = got["p"]
    assert p.epoch_id == 6  # decided again on the live state (head: rotation 5)
    assert EpochLog(uri, create=False).state().pending == p
    stalled.decide(p, "commit")
    assert EpochLog(uri, create=False).state().pubs["S-1"].epoch_id == 6


def test_a_writer_lists_only_the_records_it_has_not_seen(s3_bucket) -> None:
    """Every append lists the log (to read it, then to confirm its record): from the last key
    it knows, so a long log costs each publication what a short one does."""
    uri = f"s3://{s3_bucket}/long"
    log = EpochLog(uri)
    w = Writer(log, np.random.default_rng(4))
    w.rotation(1)
    for _ in range(30):
        w.updates()
    assert log._objects is not None
    listed: list[int] = []

    class Counting:  # the obstore module, each listing's length recorded
        def __getattr__(self, name: str):
            return getattr(obstore, name)

        def list(self, *args, **kwargs):
            items = obstore.list(*args, **kwargs).collect()
            listed.append(len(items))
            return SimpleNamespace(collect=lambda: items)

    log._objects._ob = Counting()
    p, _ = w.updates()  # records 62 and 63 of a 64-record generation
    assert listed == [0, 1, 0, 1]  # nothing new before each record, then its own
    fresh = EpochLog(uri, create=False)
    assert fresh.head() == p and len(fresh.entries()) == 64


def test_a_stalled_compaction_never_deletes_the_batch_of_an_update_committed_meanwhile(
        s3_bucket) -> None:
    """Hole 3 of issue 28: a compaction seals the log, then stalls before its sweep; meanwhile
    the admin re-sends an update whose first attempt was aborted. The re-send has the same
    epoch and digest, hence the same batch name, and is committed and acknowledged. The
    sweep, resumed, must not delete that batch: every replica that restarts replays it."""
    uri = f"s3://{s3_bucket}/stalled-sweep"
    rng = np.random.default_rng(5)
    w = Writer(EpochLog(uri), rng, "A")
    w.rotation(1)
    w.updates()
    w.rotation(3)  # a committed rotation: a compaction has records to drop
    batch = _batch(rng, 3)
    first = w.log.propose("U", "req-U", "A", 60, updates(batch))
    w.log.decide(first, "abort")  # its prepare failed; the admin will re-send it
    compactor = EpochLog(uri, create=False)
    assert compactor._objects is not None
    real_delete = compactor._objects.delete
    reached, go = threading.Event(), threading.Event()

    def delete(names: list[str]) -> None:
        if not reached.is_set():
            reached.set()  # sealed: stall before the sweep
            assert go.wait(60)
        real_delete(names)

    compactor._objects.delete = delete  # type: ignore[method-assign]
    done: dict = {}
    thread = threading.Thread(target=lambda: done.update(n=compactor.compact()))
    thread.start()
    assert reached.wait(60)
    again = w.log.propose("U", "req-U", "A", 60, updates(batch))  # the re-send
    assert isinstance(again, LogEntry) and again.blob == first.blob
    w.log.decide(again, "commit")  # acknowledged
    go.set()
    thread.join(60)
    assert done["n"] > 0
    fresh = EpochLog(uri, create=False)  # a replica that restarts
    assert [e.pub for e in fresh.live()] == ["A-3", "U"]
    assert fresh.load_batch(fresh.head()).digest == batch.digest
    # once the head has passed that epoch and no record names it, a compaction sweeps it: the
    # first after the rotation drops the record, the next the batch
    w.rotation(7)
    assert fresh.compact() > 0
    assert f"blobs/{first.blob}" in _keys(uri)
    w.rotation(9)
    assert fresh.compact() > 0
    assert f"blobs/{first.blob}" not in _keys(uri)
