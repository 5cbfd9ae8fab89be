"""A GPU shard's page updates go into its device copy at commit (morphogen.party.device_fold):
after a commit nothing is pending (no answer pays the CPU pass over the updates), no page is
uploaded again, answers of the whole range and of tables match the updated matrix, page writes
after a fold see the written bytes, and a scan in flight during the commit answers on the epoch
it started on. The device is the CuPy fakes' model of the real kernels (tests/unit/_gpu_fakes)."""

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


def test_commits_write_updates_into_the_device_copy(world):
    state, backend, model = world
    rng = np.random.default_rng(1)
    loads = sum(x.kernel == sliced.SLICE_KERNEL for x in backend.launches)
    touched = [0, 5, 133, 134, 255, 256, 432, 599]
    epoch = 1
    for step in range(3):
        changes = []
        for p in touched:
            if (p + step) % 2:
                diff = rng.integers(0, 256, PAGE_SIZE, dtype=np.uint8)
                changes.append(PageUpdate(p, diff.tobytes()))
                model[p] ^= diff
            else:
                data = rng.integers(0, 256, 1000, dtype=np.uint8)
                changes.append(PageWrite(p, data.tobytes()))
                model[p] = 0
                model[p, :1000] = data
        epoch += 1
        state.prepare_updates(epoch, changes)
        state.commit(epoch)
        assert state.current.pending == ()  # in device memory: no CPU pass per answer
        answers(state, model, touched + [1, 300])
        answers(state, model, [0, 1, 122, 123, 299], TABLE)
        for p in touched:
            np.testing.assert_array_equal(state.current.page(p), model[p])
    # no page uploaded or sliced again; only the patch kernel ran
    assert sum(x.kernel == sliced.SLICE_KERNEL for x in backend.launches) == loads
    assert any(x.kernel == "morphogen_patch_sliced" for x in backend.launches)


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
    release.set()
    scan.join(10)
    committer.join(10)
    backend.launch = real_launch
    (identity, a), = got
    assert identity.epoch_id == 1
    _, b = state.scan([key1])  # epoch 2 (written), the other party's key: XOR is no page
    assert state.epoch_id == 2 and state.current.pending == ()
    old = state.scan([key0])[1]
    np.testing.assert_array_equal(old ^ b, (model[7] ^ diff)[None])
    assert not np.array_equal(a ^ b, (model[7] ^ diff)[None])  # epoch 1's answer was older
