"""A shard loads its fold's kernel as it starts (`host_fold.warm`, from `ShardReplica.start`):
after it, a first fold of a published batch (its diffs read-only, as a version holds them)
compiles or loads nothing more on the publication's path."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys, tempfile
import numpy as np
from morphogen import engine
from morphogen.party import host_fold
from morphogen.party.epoch import ShardState
from morphogen.protocol.changes import ChangeBatch, PageUpdate
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic

host_fold.warm()
before = len(host_fold._xor_changed_words.signatures)
assert before == 1, before
with tempfile.TemporaryDirectory() as out:
    build_synthetic(out, 40, seed=2, epoch_id=1, progress=False)
    with Snapshot.open(out) as snap:
        state = ShardState(engine.create("cpu"), snap, 0, 40)
        diff = np.zeros(4096, np.uint8)
        diff[100:140] = 7
        batch = ChangeBatch.from_changes([PageUpdate(p, diff.tobytes()) for p in (3, 9, 30)])
        state.prepare_updates(2, batch)
        state.commit(2)
        assert state.fold_pending() == 3
        state.close()
assert len(host_fold._xor_changed_words.signatures) == before, \\
    host_fold._xor_changed_words.signatures
"""


def test_a_first_fold_loads_no_kernel_after_warm() -> None:
    # a fresh interpreter: this one's kernels may have been loaded by other tests
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
