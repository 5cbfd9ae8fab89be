"""A compaction of a directory log killed (SIGKILL, in a process of its own) at every step
that writes: after its fold's batch is written, after its sweep, right after the rename of
the new records. Each time the log in place is whole: every acknowledged update is still
replayed from it, publications go on, and the next compaction folds them and sweeps what the
dead one left. And a reader that read the records just before a compaction (a replica
replaying as it starts) still finds every batch they name, on every backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from morphogen.publication import compaction
from morphogen.publication.log import EpochLog, EpochLogError
from morphogen.publication.records import BLOB_NAME
from tests.unit.test_epoch_log import Writer
from tests.unit.test_log_fold import KEEP, _model_after

_CHILD = r"""
import os, signal, sys
from pathlib import Path
from morphogen.publication import compaction, directory
from morphogen.publication.log import EpochLog, EpochLogError

where, point = Path(sys.argv[1]), sys.argv[2]
compaction.FOLD_KEEP, compaction.COMPACT_AFTER = int(sys.argv[3]), 16
def die():
    os.kill(os.getpid(), signal.SIGKILL)

log = EpochLog(where, create=False)
write_file = log._store.write_file
def write(name, parts):
    write_file(name, parts)
    if point == "fold-written" and name.startswith("fold-"):
        die()
log._store.write_file = write

replace = os.replace
def replaced(src, dst):
    records = Path(dst).name == directory.LOG_FILE
    if point == "swept" and records:
        die()
    replace(src, dst)
    if point == "renamed" and records:
        die()
os.replace = replaced

log.compact()
print("compaction finished without being killed")
"""

POINTS = ("fold-written", "swept", "renamed")


def _blobs(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir() if BLOB_NAME.fullmatch(p.name)}


@pytest.mark.parametrize("point", POINTS)
def test_a_compaction_killed_at_any_step_loses_no_acknowledged_update(
        tmp_path: Path, point: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compaction, "FOLD_KEEP", KEEP)
    monkeypatch.setattr(compaction, "COMPACT_AFTER", 16)
    where = tmp_path / "log"
    log = EpochLog(where)
    w = Writer(log, np.random.default_rng(41))
    w.rotation(1)
    sent = [w.updates(n=3)[1] for _ in range(KEEP + 5)]
    w.updates(n=2, outcome="abort")  # a dropped record whose batch the compaction deletes
    sent += [w.updates(n=3)[1]]
    # a batch no record names (a publisher that died between its upload and its record)
    orphan = "updates-000000000099-00000000000000ff.bin"
    (where / orphan).write_bytes(b"never named")
    before = log.entries()

    child = subprocess.run([sys.executable, "-c", _CHILD, str(where), point, str(KEEP)],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr

    fresh = EpochLog(where, create=False)
    folded = any(e.kind == "fold" for e in fresh.entries())
    assert folded == (point == "renamed")
    if not folded:
        assert fresh.entries() == before
    assert orphan not in _blobs(where) or point == "fold-written"
    # every acknowledged update is replayed from the log in place, each batch checked
    assert _model_after([fresh.load_batch(e) for e in fresh.live()[1:]]) == _model_after(sent)

    # publications go on, through a writer that had the log open before the crash too
    x = Writer(log, np.random.default_rng(42), "X")
    more = [x.updates(n=2)[1] for _ in range(3)]
    named_before = {e.blob for e in fresh.entries() if e.blob is not None}
    assert fresh.compact() > 0
    again = EpochLog(where, create=False)
    assert _model_after([again.load_batch(e) for e in again.live()[1:]]) == \
        _model_after(sent + more)
    # what the dead compaction left is swept; what this one dropped stays until the next
    named = {e.blob for e in again.entries() if e.blob is not None}
    assert named <= _blobs(where) <= named | named_before
    assert orphan not in _blobs(where)


@pytest.fixture(params=["dir", "memory", "s3"])
def plog(request: pytest.FixtureRequest, tmp_path: Path) -> EpochLog:
    if request.param == "s3":
        return EpochLog(f"s3://{request.getfixturevalue('s3_bucket')}/crash/log")
    return EpochLog(tmp_path / "log") if request.param == "dir" else EpochLog.in_memory()


def test_a_replay_that_read_the_records_before_a_compaction_finds_every_batch(
        plog: EpochLog, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compaction, "FOLD_KEEP", KEEP)
    monkeypatch.setattr(compaction, "COMPACT_AFTER", 16)
    w = Writer(plog, np.random.default_rng(43))
    w.rotation(1)
    sent = [w.updates(n=3)[1] for _ in range(KEEP + 5)]
    w.updates(n=2, outcome="abort")
    live = plog.live()  # a replica that starts reads the records ...
    assert plog.compact() > 0 and any(e.kind == "fold" for e in plog.entries())
    # ... and replays them after the compaction folded most of them
    assert _model_after(list(plog.load_batches(live[1:]))) == _model_after(sent)
    # the next compaction sweeps them: none of its records names them
    w.rotation(20)
    assert plog.compact() > 0
    with pytest.raises(EpochLogError, match="unreadable"):
        plog.load_batch(live[1])
