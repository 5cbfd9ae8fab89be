"""A compaction of a directory log killed (SIGKILL, in a process of its own) at every step
that writes: after its fold's batch is written, after the sweep before the rename, right
after the rename, and amid the sweep after it. Each time the log in place is whole: every
acknowledged update is still replayed from it, publications go on, and the next compaction
folds them and leaves no batch that no record names."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from morphogen.publication import compaction
from morphogen.publication.log import EpochLog
from morphogen.publication.records import BLOB_NAME
from tests.unit.test_epoch_log import Writer
from tests.unit.test_log_fold import KEEP, _model_after

_CHILD = r"""
import os, signal, sys
from pathlib import Path
from morphogen.publication import compaction, directory
from morphogen.publication.log import EpochLog
from morphogen.publication.records import BLOB_NAME

where, point = Path(sys.argv[1]), sys.argv[2]
compaction.FOLD_KEEP, compaction.COMPACT_AFTER = int(sys.argv[3]), 16
renamed = False

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
    global renamed
    records = Path(dst).name == directory.LOG_FILE
    if point == "swept" and records:
        die()
    replace(src, dst)
    renamed = renamed or records
    if point == "renamed" and records:
        die()
os.replace = replaced

unlink = Path.unlink
def unlinked(self, missing_ok=False):
    unlink(self, missing_ok=missing_ok)
    if point == "dropping" and renamed and BLOB_NAME.fullmatch(self.name):
        die()
Path.unlink = unlinked

log.compact()
print("compaction finished without being killed")
"""

POINTS = ("fold-written", "swept", "renamed", "dropping")


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
    assert folded == (point in ("renamed", "dropping"))
    if not folded:
        assert fresh.entries() == before
    assert orphan not in _blobs(where) or point == "fold-written"
    # every acknowledged update is replayed from the log in place, each batch checked
    assert _model_after([fresh.load_batch(e) for e in fresh.live()[1:]]) == _model_after(sent)

    # publications go on, through a writer that had the log open before the crash too
    x = Writer(log, np.random.default_rng(42), "X")
    more = [x.updates(n=2)[1] for _ in range(3)]
    assert fresh.compact() > 0
    again = EpochLog(where, create=False)
    assert _model_after([again.load_batch(e) for e in again.live()[1:]]) == \
        _model_after(sent + more)
    named = {e.blob for e in again.entries() if e.blob is not None}
    assert _blobs(where) == named
