"""Host side of the GPU engine's packed-key scans, no kernels run: the key records, the launch
plans of both layouts, the shared memory the kernels are allowed, the engine's formats."""

from __future__ import annotations

import numpy as np
import pytest
from _gpu_fakes import FakeBackend, make_engine

from morphogen.constants import KEY_FORMATS, MAX_DOMAIN_BITS, packed_levels
from morphogen.engine import gpu_plan, sliced
from morphogen.engine.base import key_formats
from morphogen.engine.gpu_keys import KEY_HEADER_WORDS, key_words, pack_keys
from morphogen.protocol.packed import PackedKeyBatch, generate_packed_keys


@pytest.mark.parametrize("d", [1, 7, 8, 12, 25])
def test_packed_records_hold_the_keys_levels(d):
    keys = [generate_packed_keys(d, t)[i] for t, i in ((0, 0), ((1 << d) - 1, 1))]
    batch = PackedKeyBatch.from_keys(keys)
    levels = packed_levels(d)
    rec = pack_keys(batch)
    assert rec.shape == (2, key_words(levels))
    for r, k in zip(rec, keys, strict=True):
        assert r[0:4].tobytes() == k.root_seed and r[4:8].tobytes() == k.final_cw
        assert r[8] == k.root_t
        assert r[9] == sum(b << i for i, b in enumerate(k.tcw_left))
        assert r[10] == sum(b << i for i, b in enumerate(k.tcw_right))
        assert r[KEY_HEADER_WORDS:].tobytes() == b"".join(k.cw)


@pytest.mark.parametrize("kg", gpu_plan.KEY_GROUP_SIZES)
@pytest.mark.parametrize("levels", [0, 1, 3, 18, MAX_DOMAIN_BITS - 7])
def test_leaf_tiles_give_every_thread_a_prg_call_within_shared_memory(kg, levels):
    h = gpu_plan.choose_leaf_tile_bits(kg, levels)
    assert 0 <= h <= min(levels, gpu_plan.MAX_TILE_BITS)
    assert gpu_plan.scan_smem_bytes(kg, h) <= gpu_plan.SMEM_BUDGET
    assert kg << h >= gpu_plan.SCAN_THREADS or h == min(levels, gpu_plan.MAX_TILE_BITS)


@pytest.mark.parametrize("keys", [1, 3, 24, 96])
def test_plans_name_the_packed_kernels(keys):
    fused = gpu_plan.plan_launch(keys, 1 << 20, 20, sm_count=132, blocks_per_sm=lambda *_: 2,
                                 packed=True)
    assert fused.kernel in gpu_plan.PACKED_KERNELS
    assert fused.tile_bits <= 13 and fused.smem_bytes == gpu_plan.scan_smem_bytes(
        fused.key_group, fused.tile_bits)
    plan = sliced.plan_sliced_launch(keys, 4096, 20, sm_count=132, blocks_per_sm=lambda *_: 1,
                                     packed=True, table=True)
    assert plan.kernel in sliced.SLICED_PACKED_KERNELS  # the same kernel for tables
    assert plan.smem_bytes == sliced.sliced_packed_smem_bytes(plan.n_tiles)


def test_engines_allow_the_packed_kernels_their_shared_memory():
    backend = FakeBackend()
    for layout in ("fused", "sliced"):
        engine = make_engine(backend, kernel=layout, pool_size=1)
        assert key_formats(engine) == KEY_FORMATS
    for (nt, _), name in zip(sliced.SLICED_VARIANTS, sliced.SLICED_PACKED_KERNELS, strict=True):
        assert backend.max_dynamic_smem[name] == sliced.sliced_packed_smem_bytes(nt)


def test_a_shard_of_a_layout_without_packed_kernels_refuses_them(monkeypatch):
    from morphogen.engine import gpu

    monkeypatch.setattr(gpu, "PACKED_LAYOUTS", ("fused",))
    engine = make_engine(FakeBackend(), kernel="sliced", pool_size=1)
    assert key_formats(engine) == ("v1",)
    shard = engine.load(np.zeros((4, 4096), np.uint8))
    monkeypatch.setattr(shard, "packed_layouts", ("fused",))
    with pytest.raises(ValueError, match="does not scan packed keys"):
        shard.scan(PackedKeyBatch.from_keys([generate_packed_keys(2, 1)[0]]))
    shard.close()
