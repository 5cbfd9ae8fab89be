"""Packed keys on a party's GPU shard of either layout (the packed kernels, through the real .cu
program under the CPU emulation, tests/unit/cuda_emu): the shard says it scans them, and
both parties' answers read the pages of the whole range and of a table, before and after
commits that write updates into the device copy, as v1 keys' do."""

from __future__ import annotations

import numpy as np
import pytest
from _gpu_fakes import FakeBackend, emulator_compiler, make_engine

from morphogen.constants import KEY_FORMATS, PAGE_SIZE
from morphogen.engine import base as engines
from morphogen.engine import gpu_plan, sliced
from morphogen.party.epoch import ShardState
from morphogen.party.tables import TableSlice
from morphogen.protocol.changes import PageUpdate
from morphogen.protocol.packed import PackedKeyBatch, generate_packed_keys
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages
from morphogen.snapshot.tables import Table

pytestmark = pytest.mark.skipif(
    emulator_compiler() is None, reason="no C++ compiler to build the kernel emulator"
)

N = 600
TABLE = Table("t", 133, 300)


@pytest.fixture(params=["fused", "sliced"])
def world(request, tmp_path):
    build_synthetic(tmp_path / "s", N, seed=5, epoch_id=1, progress=False,
                    tables=[{"name": "t", "first_page": 133, "num_pages": 300}])
    backend = FakeBackend(mode="emulator", sm_count=2, blocks_per_sm_value=1)
    gpu = make_engine(backend, kernel=request.param, pool_size=1, max_keys=8)
    state = ShardState(gpu, Snapshot.open(tmp_path / "s"), 0, N)
    yield state, gpu, backend, synthetic_pages(5, 0, N).copy()
    state.close()


def read(state, model, targets, table=None):
    d = table.domain_bits if table else 10
    base = table.first_page if table else 0
    pairs = [generate_packed_keys(d, t) for t in targets]
    part = TableSlice(table, 0, N) if table else None
    _, a = state.scan(PackedKeyBatch.from_keys([p[0] for p in pairs]), part)
    _, b = state.scan(PackedKeyBatch.from_keys([p[1] for p in pairs]), part)
    for i, t in enumerate(targets):
        np.testing.assert_array_equal(a[i] ^ b[i], model[base + t])


def test_a_gpu_shard_answers_packed_keys_through_commits_and_tables(world):
    state, gpu, backend, model = world
    assert engines.key_formats(gpu) == KEY_FORMATS
    read(state, model, [0, 127, 128, 599])
    read(state, model, [0, 1, 122, 299], TABLE)
    rng = np.random.default_rng(2)
    touched = [0, 5, 133, 255, 256, 432, 599]
    for epoch in (2, 3):
        changes = []
        for p in touched:
            diff = rng.integers(0, 256, PAGE_SIZE, dtype=np.uint8)
            changes.append(PageUpdate(p, diff.tobytes()))
            model[p] ^= diff
        state.prepare_updates(epoch, changes)
        state.commit(epoch)
        assert len(state.current.pending) == 0  # written into the device copy
        read(state, model, touched + [1])
        read(state, model, [0, 122, 123, 299], TABLE)
    packed = set(gpu_plan.PACKED_KERNELS + sliced.SLICED_PACKED_KERNELS)
    assert any(x.kernel in packed for x in backend.launches)
