"""The Ray-free shard core: ranges, self-test, read-only key batches, partials that XOR to pages."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from morphogen.engine import _cpu_kernel
from morphogen.party.shard import ShardCore, warm_up
from morphogen.protocol.dpf import KeyBatch, generate_keys
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory) -> Snapshot:
    out = tmp_path_factory.mktemp("snap")
    build_synthetic(out, 50, seed=4, epoch_id=9, progress=False)
    with Snapshot.open(out) as snap:
        yield snap


def test_a_shard_scans_key_batches_as_received_in_one_jitted_signature(snapshot) -> None:
    """However a batch was made (parsed, unpickled from Ray, sliced, merged), its arrays are
    read-only and C-contiguous: the shard scans them without a copy, and the CPU kernel is
    compiled for that one form."""
    made = KeyBatch.from_keys([generate_keys(6, t)[0] for t in (1, 2, 3)])
    forms = [made, pickle.loads(pickle.dumps(made)), made.select(1, 3),
             KeyBatch.concat([made, made.select(0, 1)])]
    core = ShardCore.open(snapshot, 0, 1, "cpu")
    try:
        for batch in forms:
            for f in ("root_seed", "root_t", "cw", "tcw", "final_cw"):
                arr = getattr(batch, f)
                assert not arr.flags.writeable and arr.flags.c_contiguous, f
            core.scan(batch)
    finally:
        core.close()
    key_args = [sig[3:8] for sig in _cpu_kernel.scan_pages.signatures]
    assert key_args and not any(t.mutable for args in key_args for t in args)
    assert len(set(key_args)) == 1


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
