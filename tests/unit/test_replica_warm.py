"""A shard replica loads the kernel that unpacks a publication's changed bytes as it starts
(`sparse.warm`, from `ShardReplica.start`): its first publication then loads nothing on its
path."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import asyncio, tempfile
import numpy as np
from morphogen.party.replica import ShardReplica
from morphogen.party.shard import ShardCore
from morphogen.protocol import sparse
from morphogen.protocol.changes import ChangeBatch
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic

kernel = sparse._scatter_window
assert not kernel.signatures, kernel.signatures
with tempfile.TemporaryDirectory() as out:
    build_synthetic(out, 40, seed=2, epoch_id=1, progress=False)
    replica = ShardReplica.start(ShardCore.open(Snapshot.open(out), 0, 1, "cpu"))
    loaded = list(kernel.signatures)
    assert len(loaded) == 1, loaded
    diffs = np.zeros((3, 4096), np.uint8)
    diffs[:, 100:140] = 7
    sent = ChangeBatch(np.array([3, 9, 30]), np.zeros(3, bool), diffs.tobytes())
    # as a router hands it on: the changed bytes, read-only
    batch = ChangeBatch.from_packed(sent.pages, sent.replace, sent.packed)
    assert asyncio.run(replica.prepare_updates(2, batch, 1, "op")) == 3
    asyncio.run(replica.commit(2, "op"))
    assert kernel.signatures == loaded, kernel.signatures
"""


def test_a_first_publication_loads_no_kernel_after_start() -> None:
    # a fresh interpreter: this one's kernels may have been loaded by other tests
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
