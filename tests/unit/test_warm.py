"""A follower's start loads the kernels its blocks call: after `warm()`, a block's calls (a batch
packed from the pages it rewrote, from bytes and from an array, keys' buckets found in one
call, the key index's slots and the pages read ahead) compile nothing more."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import numpy as np
import tempfile
from morphogen.keyword import hashing, key_index, prefetch
from morphogen.protocol import sparse
from morphogen.storage import advice

kernels = (sparse._runs, sparse._gather, sparse._scatter_window, sparse._xor_runs,
           sparse._xor_gather, hashing._candidates_many, prefetch._data_pages,
           key_index._touch, advice._advise)
sparse.warm()
hashing.warm()
prefetch.warm()
before = [len(k.signatures) for k in kernels]
assert all(before), before
data = np.random.default_rng(1).integers(0, 2, 3 * 4096, np.uint8)
raw = sparse.pack(data.tobytes())
pages = data.reshape(3, 4096)  # as the owner's batch: pages, the rows they were, in a buffer
sparse.pack_xor(pages, np.concatenate([np.array([2]), np.arange(1)]), np.zeros((4, 4096), np.uint8),
                np.concatenate([np.fromiter([3], np.int64, 1), np.arange(1)]))
sparse.pack(data)
sparse.unpack(raw, len(data))
for _ in sparse.dense_chunks(raw, len(data), 4096):
    pass
keys = [bytes([i]) * 20 for i in range(50)] + [bytes([i]) * 52 for i in range(50)]
trios = hashing.candidates_many(*hashing.pack_keys(keys), (5, 6, 7), 1000)
found = np.empty(len(keys), np.int64)  # as a prefetch calls it: a slice of mapped pages
prefetch._data_pages(pages[1:], np.zeros((len(keys), 16), np.uint8), trios % 2, 1, 0, 48, 85,
                     found)
with tempfile.TemporaryDirectory() as folder:  # as a follower's working index is read ahead
    with key_index.KeyIndex.create(folder, 64) as index:
        index[bytes(range(16))] = b"key"
        asked = np.frombuffer(bytes(range(16)) * 3, np.uint8).reshape(3, 16)
        index.read_ahead(asked)
        assert index.touch(asked) == 3
prefetch.populate(pages, np.array([0, 2]))
after = [len(k.signatures) for k in kernels]
assert after == before, (before, after)
"""


def test_a_blocks_kernels_are_loaded_at_start() -> None:
    # a fresh interpreter: this one's kernels may have been compiled by other tests
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
