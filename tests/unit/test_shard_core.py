"""The Ray-free shard core: ranges, self-test, normalised keys, partials that XOR to pages."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from morphogen.dpf import KeyBatch, generate_keys
from morphogen.shard import ShardCore, owned, warm_up
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory) -> Snapshot:
    out = tmp_path_factory.mktemp("snap")
    build_synthetic(out, 50, seed=4, epoch_id=9, progress=False)
    with Snapshot.open(out) as snap:
        yield snap


def test_owned_makes_keys_writable() -> None:
    one = KeyBatch.from_keys([generate_keys(6, 1)[0]])
    back = pickle.loads(pickle.dumps(KeyBatch.from_keys([generate_keys(6, 2)[0]] * 2)))
    for batch in (one, back):
        fixed = owned(batch)
        for f in ("root_seed", "root_t", "cw", "tcw", "final_cw"):
            arr = getattr(fixed, f)
            assert arr.flags.writeable and arr.flags.c_contiguous
            assert np.array_equal(arr, getattr(batch, f))
    fresh = owned(back)
    assert owned(fresh) is fresh


@pytest.mark.parametrize("engine", ["reference", "cpu"])
def test_three_shards_xor_to_the_page(snapshot: Snapshot, engine: str) -> None:
    cores = [ShardCore.open(snapshot, i, 3, engine) for i in range(3)]
    assert [(c.first_page, c.stop_page) for c in cores] == [(0, 17), (17, 34), (34, 50)]
    assert all(c.epoch_id == 9 and c.domain_bits == 6 for c in cores)
    pages = synthetic_pages(4, 0, 50)
    targets = [0, 33, 49]
    pairs = [generate_keys(6, t) for t in targets]
    for c in cores:
        c.self_test()
    parts_a = [c.scan(KeyBatch.from_keys([p[0] for p in pairs])) for c in cores]
    parts_b = [c.scan(KeyBatch.from_keys([p[1] for p in pairs])) for c in cores]
    assert {e.epoch_id for e, _ in parts_a + parts_b} == {9}
    assert len({e for e, _ in parts_a + parts_b}) == 1  # one identity across the shards
    acc_a = np.bitwise_xor.reduce([acc for _, acc in parts_a])
    acc_b = np.bitwise_xor.reduce([acc for _, acc in parts_b])
    assert np.array_equal(acc_a ^ acc_b, pages[targets])
    for c in cores:
        c.close()


def test_wrong_domain_refused(snapshot: Snapshot) -> None:
    core = ShardCore.open(snapshot, 0, 2, "reference")
    with pytest.raises(ValueError):
        core.scan(KeyBatch.from_keys([generate_keys(7, 1)[0]]))
    with pytest.raises(ValueError):
        ShardCore(snapshot, 10, 10, "reference")


def test_warm_up_runs(snapshot: Snapshot) -> None:
    assert warm_up(snapshot, "cpu", pages=8) == "cpu"
