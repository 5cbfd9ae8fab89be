"""Versioned shard state: pending updates, folding, two-phase publication, rotation."""

import numpy as np
import pytest

from morphogen import dpf, engine
from morphogen.epoch import EpochError, PageUpdate, PageWrite, ShardState
from morphogen.matrix import Snapshot, build_synthetic, domain_bits_for, synthetic_pages

NUM_PAGES = 300


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory):
    root = tmp_path_factory.mktemp("snaps")
    a = build_synthetic(root / "a", NUM_PAGES, seed=1, epoch_id=1, progress=False)
    b = build_synthetic(root / "b", NUM_PAGES, seed=2, epoch_id=9, progress=False)
    assert a.num_pages == b.num_pages == NUM_PAGES
    return Snapshot.open(root / "a"), Snapshot.open(root / "b")


def keys_for(targets, party=0):
    d = domain_bits_for(NUM_PAGES)
    return [dpf.generate_keys(d, t)[party] for t in targets]


def expected(model, lo, hi, keys):
    return engine.create("reference").load(np.ascontiguousarray(model[lo:hi]), lo).scan(keys)


def random_updates(rng, n, lo=0, hi=NUM_PAGES):
    return [
        PageUpdate(int(rng.integers(lo, hi)), rng.integers(0, 256, 4096, np.uint8).tobytes())
        for _ in range(n)
    ]


@pytest.mark.parametrize("name", ["cpu", "reference"])
def test_pending_updates_and_folds_give_the_model_bytes(snapshots, name):
    snap, _ = snapshots
    rng = np.random.default_rng(4)
    lo, hi = 40, 260
    state = ShardState(engine.create(name), snap, lo, hi, chunk_pages=32)
    model = synthetic_pages(1, 0, NUM_PAGES).copy()
    keys = keys_for([0, 41, 100, 259, 299])
    epoch = state.epoch_id
    assert epoch == 1
    for step in range(6):
        changes = random_updates(rng, 5)
        changes.append(PageWrite(int(rng.integers(lo, hi)), b"\x07" * 100))
        epoch += 1
        mine = state.prepare_updates(epoch, changes)
        assert mine == sum(lo <= c.page < hi for c in changes)
        assert state.epoch_id == epoch - 1  # staged, not yet visible
        state.commit(epoch)
        for c in changes:
            if isinstance(c, PageWrite):
                model[c.page] = 0
                model[c.page, :100] = 7
            else:
                model[c.page] ^= np.frombuffer(c.diff, np.uint8)
        e, acc = state.scan(keys)
        assert e == epoch
        assert np.array_equal(acc, expected(model, lo, hi, keys))
        if step % 2:
            assert state.fold_pending() > 0
            assert state.current.pending == ()
            e2, acc2 = state.scan(keys)
            assert e2 == epoch and np.array_equal(acc2, acc)
    for p in (lo, 100, hi - 1):
        assert np.array_equal(state.current.page(p), model[p])
    # the snapshot file itself is never written
    assert np.array_equal(snap.pages(0, NUM_PAGES), synthetic_pages(1, 0, NUM_PAGES))


def test_transitions_are_checked(snapshots):
    snap, _ = snapshots
    state = ShardState(engine.create("cpu"), snap, 0, NUM_PAGES)
    with pytest.raises(EpochError):
        state.prepare_updates(1, [])  # not after the current epoch
    with pytest.raises(EpochError):
        state.commit(5)  # nothing staged
    with pytest.raises(ValueError):
        state.prepare_updates(2, [PageUpdate(NUM_PAGES, bytes(4096))])
    with pytest.raises(ValueError):
        PageUpdate(3, bytes(10))
    with pytest.raises(ValueError):
        PageWrite(3, bytes(4097))
    state.prepare_updates(2, [PageUpdate(3, b"\x01" * 4096)])
    state.abort(2)
    assert state.epoch_id == 1 and state.info()["staged_epoch_id"] is None
    state.prepare_updates(2, [PageUpdate(3, b"\x01" * 4096)])
    state.commit(2)
    state.commit(2)  # a retried commit is harmless
    assert state.info()["pending_updates"] == 1


def test_rotation_switches_whole_and_in_flight_versions_keep_their_epoch(snapshots):
    snap_a, snap_b = snapshots
    state = ShardState(engine.create("cpu"), snap_a, 0, NUM_PAGES)
    keys = keys_for([5, 200])
    before = state.current  # what an in-flight scan holds
    state.prepare_snapshot(2, snap_b, 0, NUM_PAGES)
    assert state.info()["rotation_in_progress"] is True
    assert state.scan(keys)[0] == 1
    state.commit(2)
    assert state.info()["rotation_in_progress"] is False
    e, acc = state.scan(keys)
    assert e == 2
    assert np.array_equal(acc, expected(synthetic_pages(2, 0, NUM_PAGES), 0, NUM_PAGES, keys))
    old = before.scan(dpf.KeyBatch.from_keys(keys))
    assert before.epoch_id == 1
    assert np.array_equal(old, expected(synthetic_pages(1, 0, NUM_PAGES), 0, NUM_PAGES, keys))
