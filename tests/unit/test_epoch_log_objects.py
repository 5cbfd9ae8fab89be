"""The epoch log on object storage (a loopback S3 server): write-once records, the next
sequence number as the lock, compaction by a seal record, publishers racing for records."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import obstore
import pytest

from morphogen.epoch_log import EpochLog, EpochLogConflict, EpochLogError, LogEntry
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
    assert len(st.entries) == 2 * 16 + 2 * st.aborted
    if lease_s == 30.0:
        assert st.aborted == 0
    for e in log.live()[1:]:
        assert log.load_batch(e).digest == e.blob_digest
