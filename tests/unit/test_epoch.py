"""Versioned shard state: pending updates, folding, two-phase publication, rotation."""

import numpy as np
import pytest

from morphogen import engine
from morphogen.party.epoch import EpochError, ShardState, StagingConflict
from morphogen.protocol import dpf
from morphogen.protocol.changes import ChangeBatch, PageUpdate, PageWrite
from morphogen.protocol.dpf import DomainError
from morphogen.snapshot.layout import domain_bits_for, shard_ranges
from morphogen.snapshot.manifest import SnapshotError
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages

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


def apply(model, changes):
    """The changes applied to `model` in order, as a shard must apply them."""
    for c in changes:
        if isinstance(c, PageWrite):
            model[c.page] = 0
            model[c.page, :len(c.data)] = np.frombuffer(c.data, np.uint8)
        else:
            model[c.page] ^= np.frombuffer(c.diff, np.uint8)


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
        apply(model, changes)
        e, acc = state.scan(keys)
        assert e.epoch_id == epoch
        assert np.array_equal(acc, expected(model, lo, hi, keys))
        if step % 2:
            assert state.fold_pending() > 0
            assert len(state.current.pending) == 0
            e2, acc2 = state.scan(keys)
            assert e2 == e and np.array_equal(acc2, acc)  # a fold keeps the identity
    for p in (lo, 100, hi - 1):
        assert np.array_equal(state.current.page(p), model[p])
    # the snapshot file itself is never written
    assert np.array_equal(snap.pages(0, NUM_PAGES), synthetic_pages(1, 0, NUM_PAGES))


@pytest.mark.parametrize("packed", [False, True])
def test_writes_and_diffs_of_one_page_in_one_batch_apply_in_order(snapshots, packed):
    """A page written, XORed, written again and XORed again in one batch, beside pages of
    other shards, on a shard that holds updates pending from the batch before: every change
    applies in the batch's order, as the model's bytes say, before and after a fold."""
    snap, _ = snapshots
    rng = np.random.default_rng(11)
    lo, hi = 100, 200
    state = ShardState(engine.create("cpu"), snap, lo, hi, chunk_pages=16)
    model = synthetic_pages(1, 0, NUM_PAGES).copy()
    keys = keys_for([120, 150, 199, 101])
    first = random_updates(rng, 3, lo, hi) + [PageUpdate(150, rng.bytes(4096))]
    second = [PageUpdate(50, rng.bytes(4096)), PageUpdate(150, rng.bytes(4096)),
              PageWrite(150, b"\x0b" * 70), PageUpdate(150, rng.bytes(4096)),
              PageUpdate(250, rng.bytes(4096)), PageWrite(120, b"\x0c" * 9),
              PageWrite(150, b"\x0d" * 4096), PageUpdate(150, rng.bytes(4096))]
    for epoch, changes in ((2, first), (3, second)):
        batch = ChangeBatch.from_changes(changes)
        if packed:
            from morphogen.protocol import sparse

            batch = ChangeBatch.from_packed(batch.pages, batch.replace, sparse.pack(batch.data))
        assert state.prepare_updates(epoch, batch) == sum(lo <= c.page < hi for c in changes)
        state.commit(epoch)
        apply(model, changes)
    assert len(state.current.pending) == 10
    before = state.scan(keys)[1]
    assert np.array_equal(before, expected(model, lo, hi, keys))
    for p in (120, 150):
        assert np.array_equal(state.current.page(p), model[p])
    assert state.fold_pending() == 10
    assert np.array_equal(state.scan(keys)[1], before)
    assert np.array_equal(state.current.page(150), model[150])


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
    with state.lease() as before:  # what an in-flight scan holds
        state.prepare_snapshot(2, snap_b, 0, NUM_PAGES)
        assert state.info()["rotation_in_progress"] is True
        assert state.scan(keys)[0].epoch_id == 1
        state.commit(2)
        assert state.info()["rotation_in_progress"] is False
        e, acc = state.scan(keys)
        assert e.epoch_id == 2
        assert e.snapshot_checksum == snap_b.manifest.checksum
        assert np.array_equal(acc, expected(synthetic_pages(2, 0, NUM_PAGES), 0, NUM_PAGES, keys))
        old = before.scan(dpf.KeyBatch.from_keys(keys))
        assert before.epoch_id == 1
        assert np.array_equal(old, expected(synthetic_pages(1, 0, NUM_PAGES), 0, NUM_PAGES, keys))
        assert before.segments[0].lease.retired and not before.segments[0].lease.closed
    assert before.segments[0].lease.closed  # by the end of the last scan on it


def test_staging_slot_belongs_to_one_operation(snapshots):
    snap, _ = snapshots
    state = ShardState(engine.create("reference"), snap, 0, NUM_PAGES, stale_stage_s=60)
    diff = PageUpdate(3, b"\x01" * 4096)
    state.prepare_updates(2, [diff], op="one")
    with pytest.raises(StagingConflict):
        state.prepare_updates(2, [diff], op="two")  # another operation's version is staged
    with pytest.raises(StagingConflict):
        state.commit(2, op="two")
    state.abort(2, op="two")  # not its version: nothing happens
    assert state.info()["staged_epoch_id"] == 2
    state.prepare_updates(2, [diff, diff], op="one")  # the owner may re-stage
    state.commit(2, op="one")
    assert state.epoch_id == 2 and state.info()["pending_updates"] == 2
    # a staged version whose operation died expires
    stale = ShardState(engine.create("reference"), snap, 0, NUM_PAGES, stale_stage_s=0.0)
    stale.prepare_updates(2, [diff], op="dead")
    stale.prepare_updates(2, [], op="alive")
    stale.commit(2, op="alive")
    assert stale.info()["pending_updates"] == 0


def test_updates_are_refused_on_another_base_epoch(snapshots):
    snap, _ = snapshots
    state = ShardState(engine.create("reference"), snap, 0, NUM_PAGES)
    with pytest.raises(EpochError, match="made for epoch 4"):
        state.prepare_updates(5, [], base_epoch=4)
    state.prepare_updates(2, [], base_epoch=1)


def test_change_batch_gives_the_same_bytes_as_objects(snapshots):
    snap, _ = snapshots
    rng = np.random.default_rng(8)
    changes = random_updates(rng, 6) + [PageWrite(150, b"\x05" * 33), PageWrite(10, b"")]
    keys = keys_for([10, 150, 151, 299] + [c.page for c in changes])
    by_obj = ShardState(engine.create("cpu"), snap, 100, 300)
    by_batch = ShardState(engine.create("cpu"), snap, 100, 300)
    assert by_obj.prepare_updates(2, changes) == by_batch.prepare_updates(
        2, ChangeBatch.from_changes(changes)
    )
    by_obj.commit(2)
    by_batch.commit(2)
    assert np.array_equal(by_obj.scan(keys)[1], by_batch.scan(keys)[1])
    with pytest.raises(ValueError, match="outside the matrix"):
        by_batch.prepare_updates(3, ChangeBatch.from_changes([PageUpdate(300, bytes(4096))]))


def test_many_pending_updates_and_many_keys(snapshots):
    """The pending-update pass in several steps (many keys x many updates)."""
    snap, _ = snapshots
    rng = np.random.default_rng(9)
    state = ShardState(engine.create("cpu"), snap, 0, NUM_PAGES)
    model = synthetic_pages(1, 0, NUM_PAGES).copy()
    changes = random_updates(rng, 40)
    state.prepare_updates(2, changes)
    state.commit(2)
    apply(model, changes)
    keys = keys_for([int(t) for t in rng.integers(0, NUM_PAGES, 96)])
    assert np.array_equal(state.scan(keys)[1], expected(model, 0, NUM_PAGES, keys))
    state.fold_pending()
    assert all(not s.pages.flags.writeable for s in state.current.segments)
    assert np.array_equal(state.scan(keys)[1], expected(model, 0, NUM_PAGES, keys))


def test_keys_of_another_domain_are_refused(snapshots):
    snap, _ = snapshots
    state = ShardState(engine.create("reference"), snap, 0, NUM_PAGES)
    d = domain_bits_for(NUM_PAGES)
    with pytest.raises(DomainError):
        state.scan([dpf.generate_keys(d + 1, 3)[0]])


def test_shard_core_rotates_to_another_page_count_and_domain(tmp_path, snapshots):
    from morphogen.party.shard import ShardCore

    snap, _ = snapshots
    bigger = tmp_path / "bigger"
    build_synthetic(bigger, 700, seed=5, epoch_id=4, progress=False)
    cores = [ShardCore.open(snap, i, 3, "cpu") for i in range(3)]
    for c in cores:
        assert c.prepare_snapshot(4, bigger, op="rot") == shard_ranges(700, 3)[c.index]
        assert c.info()["rotation_in_progress"]
        assert c.epoch_id == 1  # staged only
    for c in cores:
        c.commit(4, op="rot")
        c.self_test()
    d = domain_bits_for(700)
    assert d != domain_bits_for(NUM_PAGES) and all(c.domain_bits == d for c in cores)
    pairs = [dpf.generate_keys(d, t) for t in (0, 350, 699)]
    parts = [c.scan(dpf.KeyBatch.from_keys([p[0] for p in pairs])) for c in cores]
    parts += [c.scan(dpf.KeyBatch.from_keys([p[1] for p in pairs])) for c in cores]
    assert {e.epoch_id for e, _ in parts} == {4} and len({e for e, _ in parts}) == 1
    acc = np.bitwise_xor.reduce([a for _, a in parts])
    assert np.array_equal(acc, synthetic_pages(5, 0, 700)[[0, 350, 699]])
    # a snapshot replaced after its verification is refused, the epoch stays
    with pytest.raises(SnapshotError, match="changed since"):
        cores[0].prepare_snapshot(5, bigger, checksum="blake2b-256:" + "0" * 64)
    assert cores[0].epoch_id == 4 and cores[0].info()["staged_epoch_id"] is None
    # more shards than pages
    tiny = tmp_path / "tiny"
    build_synthetic(tiny, 2, seed=5, progress=False)
    with pytest.raises(SnapshotError):
        cores[2].prepare_snapshot(6, tiny)
    assert not cores[2].info()["rotation_in_progress"]
    for c in cores:
        c.close()


@pytest.mark.parametrize("name", ["cpu", "reference"])
def test_a_fold_writes_the_updates_into_the_pages_scans_read_and_nothing_else(snapshots, name):
    """The in-place fold: the same segments and arrays before and after (nothing copied, no
    scanner rebuilt), the pages the model's, read-only again; a page updated twice, and a
    replacement, fold as applying them in order would."""
    snap, _ = snapshots
    state = ShardState(engine.create(name), snap, 0, NUM_PAGES, chunk_pages=32)
    model = synthetic_pages(1, 0, NUM_PAGES).copy()
    rng = np.random.default_rng(12)
    d1, d2 = (rng.integers(0, 256, 4096, np.uint8) for _ in range(2))
    state.prepare_updates(2, [PageUpdate(7, d1.tobytes()), PageWrite(150, b"\x09" * 10)])
    state.commit(2)
    # a block's diff: a few changed bytes (the first and the last of the page), the rest zero
    sparse = np.zeros(4096, np.uint8)
    sparse[[0, 1000, 4095]] = (0x81, 0x01, 0xFE)
    state.prepare_updates(3, [PageUpdate(7, d2.tobytes()), PageUpdate(299, d1.tobytes()),
                              PageUpdate(40, sparse.tobytes())])
    state.commit(3)
    model[7] ^= d1 ^ d2
    model[40] ^= sparse
    model[150] = 0
    model[150, :10] = 9
    model[299] ^= d1
    before = state.current
    arrays = [s.pages for s in before.segments]
    assert state.fold_pending() == 5
    after = state.current
    assert len(after.pending) == 0 and after.identity == before.identity
    assert after.segments == before.segments  # the same Segment objects: no copy, no split
    assert all(s.pages is a for s, a in zip(after.segments, arrays, strict=True))
    got = np.concatenate([np.asarray(s.pages) for s in after.segments])
    assert np.array_equal(got, model)
    assert all(not s.pages.flags.writeable for s in after.segments)
    assert after.folded == {0, 40 // 32, 150 // 32, 299 // 32}
    keys = keys_for([7, 40, 150, 299, 0])
    assert np.array_equal(state.scan(keys)[1], expected(model, 0, NUM_PAGES, keys))
    assert state.fold_pending() == 0
