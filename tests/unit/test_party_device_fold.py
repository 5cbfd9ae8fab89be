"""A GPU shard's page updates go into its device copy at commit (morphogen.party.device_fold):
after a commit nothing is pending (no answer pays the CPU pass over the updates), no page is
uploaded again, answers of the whole range and of tables match the updated matrix, page writes
after a fold see the written bytes, and a scan in flight during the commit answers on the epoch
it started on; a rotation to the same range writes only the pages that differ. The device is the
CuPy fakes' model of the real kernels (tests/unit/_gpu_fakes)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _gpu_fakes import FakeBackend, make_engine

from morphogen.constants import PAGE_SIZE
from morphogen.engine import cpu, sliced
from morphogen.party.epoch import ShardState
from morphogen.party.tables import TableSlice
from morphogen.protocol import dpf
from morphogen.protocol.changes import PageUpdate, PageWrite
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages
from morphogen.snapshot.tables import Table
from morphogen.snapshot.writer import write_snapshot

N = 600
TABLE = Table("t", 133, 300)


@pytest.fixture
def world(tmp_path, monkeypatch):
    def no_host_engine(*args, **kwargs):
        raise AssertionError("a GPU shard built a host engine")

    monkeypatch.setattr(cpu.CpuEngine, "__init__", no_host_engine)
    build_synthetic(tmp_path / "s", N, seed=5, epoch_id=1, progress=False,
                    tables=[{"name": "t", "first_page": 133, "num_pages": 300}])
    backend = FakeBackend()
    state = ShardState(make_engine(backend, kernel="sliced", pool_size=2), Snapshot.open(
        tmp_path / "s"), 0, N)
    yield state, backend, synthetic_pages(5, 0, N).copy()
    state.close()


def answers(state, model, targets, table=None):
    d = table.domain_bits if table else 10
    base = table.first_page if table else 0
    pairs = [dpf.generate_keys(d, t) for t in targets]
    part = TableSlice(table, 0, N) if table else None
    ident_a, a = state.scan(dpf.KeyBatch.from_keys([p[0] for p in pairs]), part)
    ident_b, b = state.scan(dpf.KeyBatch.from_keys([p[1] for p in pairs]), part)
    assert ident_a == ident_b
    for i, t in enumerate(targets):
        np.testing.assert_array_equal(a[i] ^ b[i], model[base + t])


def changed(rng, model, page, write, size):
    """A random diff of `page`, or a write of `size` random bytes to it, applied to `model`
    as well."""
    if not write:
        diff = rng.integers(0, 256, PAGE_SIZE, dtype=np.uint8)
        model[page] ^= diff
        return PageUpdate(page, diff.tobytes())
    data = rng.integers(0, 256, size, dtype=np.uint8)
    model[page] = 0
    model[page, :size] = data
    return PageWrite(page, data.tobytes())


def test_commits_write_updates_into_the_device_copy(world):
    state, backend, model = world
    rng = np.random.default_rng(1)
    loads = sum(x.kernel == sliced.SLICE_KERNEL for x in backend.launches)
    host = state.current.segments[0].pages
    touched = [0, 5, 133, 134, 255, 256, 432, 599]
    epoch = 1
    for step in range(3):
        changes = [changed(rng, model, p, not (p + step) % 2, 1000) for p in touched]
        epoch += 1
        state.prepare_updates(epoch, changes)
        state.commit(epoch)
        assert len(state.current.pending) == 0  # in device memory: no CPU pass per answer
        # the host copy took the same writes in place: the same array, the same bytes as the
        # device, and no other host copy of a changed page is kept
        (seg,) = state.current.segments
        assert seg.pages is host and not host.flags.writeable
        np.testing.assert_array_equal(host, model)
        answers(state, model, touched + [1, 300])
        answers(state, model, [0, 1, 122, 123, 299], TABLE)
        for p in touched:
            np.testing.assert_array_equal(state.current.page(p), model[p])
    # no page uploaded or sliced again; only the patch kernel ran
    assert sum(x.kernel == sliced.SLICE_KERNEL for x in backend.launches) == loads
    assert any(x.kernel == "morphogen_patch_sliced" for x in backend.launches)


def test_a_page_changed_several_times_in_one_batch_is_written_once_as_their_sum(world):
    """Diffs and a write of one page in one batch reach the device copy as one write of the
    page they leave, as do pages changed once beside them."""
    state, backend, model = world
    rng = np.random.default_rng(3)
    changes = [changed(rng, model, p, write, 77) for p, write in [
        (140, False), (7, False), (140, True), (140, False), (599, True), (7, False)]]
    before = len(backend.launches)
    state.prepare_updates(2, changes)
    state.commit(2)
    assert len(state.current.pending) == 0
    assert sum(x.kernel == "morphogen_patch_sliced" for x in backend.launches[before:]) >= 1
    answers(state, model, [7, 140, 599, 8])
    answers(state, model, [7, 8, 299], TABLE)
    for p in (7, 140, 599):
        np.testing.assert_array_equal(state.current.page(p), model[p])


def test_a_scan_in_flight_during_a_commit_answers_on_its_epoch(world):
    state, backend, model = world
    key0, key1 = dpf.generate_keys(10, 7)
    diff = np.full(PAGE_SIZE, 0x5A, np.uint8)
    state.prepare_updates(2, [PageUpdate(7, diff.tobytes())])
    real_launch = backend.launch
    in_scan, release = threading.Event(), threading.Event()

    def slow_launch(kernel, *args):
        if kernel.name in sliced.SLICED_KERNELS and not in_scan.is_set():
            in_scan.set()
            release.wait(10)
        return real_launch(kernel, *args)

    backend.launch = slow_launch
    got: list = []
    scan = threading.Thread(target=lambda: got.append(state.scan([key0])))
    scan.start()
    assert in_scan.wait(10)
    committer = threading.Thread(target=state.commit, args=(2,))
    committer.start()
    committer.join(0.3)
    assert committer.is_alive()  # the device write waits for the scan in flight
    np.testing.assert_array_equal(state.current.segments[0].pages[7], model[7])  # so the host's
    release.set()
    scan.join(10)
    committer.join(10)
    backend.launch = real_launch
    (identity, a), = got
    assert identity.epoch_id == 1
    _, b = state.scan([key1])  # epoch 2 (written), the other party's key: XOR is no page
    assert state.epoch_id == 2 and len(state.current.pending) == 0
    old = state.scan([key0])[1]
    np.testing.assert_array_equal(old ^ b, (model[7] ^ diff)[None])
    assert not np.array_equal(a ^ b, (model[7] ^ diff)[None])  # epoch 1's answer was older


def test_a_rotation_to_the_same_range_writes_only_the_pages_that_differ(world, tmp_path):
    """Rotating to a snapshot of the range that differs from the device copy in a few pages
    writes those pages at commit (the updates already written are not), keeps the device shard
    and brings the new snapshot's tables; an aborted one changes nothing."""
    state, backend, model = world
    rng = np.random.default_rng(9)
    state.prepare_updates(2, [PageUpdate(10, rng.bytes(PAGE_SIZE)), PageUpdate(300,
                          rng.bytes(PAGE_SIZE))])
    state.commit(2)
    for p in (10, 300):
        model[p] = state.current.page(p)
    new = model.copy()
    for p in (0, 256, 599):
        new[p] = rng.integers(0, 256, PAGE_SIZE, dtype=np.uint8)
    write_snapshot(tmp_path / "next", new, epoch_id=3, source="test", progress=None,
                   tables=[{"name": "n", "first_page": 250, "num_pages": 100}])
    loads = sum(x.kernel == sliced.SLICE_KERNEL for x in backend.launches)
    shard = state.current.segments[0].scanner
    # an aborted rotation leaves the device copy and its holder count as they were
    state.prepare_snapshot(3, Snapshot.open(tmp_path / "next"), 0, N)
    state.abort(3)
    answers(state, model, [0, 10, 256])
    patches = sum(x.kernel == "morphogen_patch_sliced" for x in backend.launches)
    state.prepare_snapshot(3, Snapshot.open(tmp_path / "next"), 0, N)
    assert state.current.epoch_id == 2
    answers(state, model, [0, 256, 599])  # staged, not yet written: the old epoch answers
    state.commit(3)
    assert state.epoch_id == 3 and state.current.segments[0].scanner is shard
    patch = [x for x in backend.launches if x.kernel == "morphogen_patch_sliced"]
    assert len(patch) == patches + 1 and int(patch[-1].args[2]) == 3  # three pages
    assert sum(x.kernel == sliced.SLICE_KERNEL for x in backend.launches) == loads
    answers(state, new, [0, 10, 256, 300, 599, 5])
    answers(state, new, [0, 6, 99], Table("n", 250, 100))
    np.testing.assert_array_equal(state.current.page(300), new[300])


def test_a_rotation_that_changes_most_pages_loads_afresh(world, tmp_path):
    state, backend, _ = world
    build_synthetic(tmp_path / "other", N, seed=8, epoch_id=2, progress=False)
    old = state.current.segments[0].scanner
    loads = sum(x.kernel == sliced.SLICE_KERNEL for x in backend.launches)
    state.prepare_snapshot(2, Snapshot.open(tmp_path / "other"), 0, N)
    state.commit(2)
    assert state.current.segments[0].scanner is not old
    assert sum(x.kernel == sliced.SLICE_KERNEL for x in backend.launches) > loads
    answers(state, synthetic_pages(8, 0, N), [0, 300, 599])
    with pytest.raises(RuntimeError, match="closed"):
        old.scan([dpf.generate_keys(10, 1)[0]])  # the old copy was freed
