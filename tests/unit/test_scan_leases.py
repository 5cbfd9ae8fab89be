"""Scan leases: folds, commits and rotations under continuous scanning never fail a scan, and a
retired segment is closed only when its last scan ends (the GPU engine refuses scans on a closed
shard, so without leases these tests fail there)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _gpu_fakes import FakeBackend, make_engine

from morphogen import engine
from morphogen.party.epoch import ShardState
from morphogen.protocol import dpf
from morphogen.protocol.changes import PageUpdate
from morphogen.snapshot.layout import domain_bits_for
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages

NUM_PAGES = 200


@pytest.fixture(scope="module")
def snaps(tmp_path_factory):
    root = tmp_path_factory.mktemp("lease")
    build_synthetic(root / "a", NUM_PAGES, seed=1, epoch_id=1, progress=False)
    build_synthetic(root / "b", NUM_PAGES, seed=2, epoch_id=1, progress=False)
    return Snapshot.open(root / "a"), Snapshot.open(root / "b")


def _engine(name):
    if name == "gpu-fake":
        return make_engine(FakeBackend(), pool_size=2)
    return engine.create(name)


def _reference(pages: np.ndarray, keys) -> np.ndarray:
    return engine.create("reference").load(pages, 0).scan(keys)


@pytest.mark.parametrize("name", ["gpu-fake", "cpu", "reference"])
def test_fold_commit_and_rotation_under_load_never_fail_a_scan(snaps, name):
    snap_a, snap_b = snaps
    state = ShardState(_engine(name), snap_a, 0, NUM_PAGES, chunk_pages=16)
    d = domain_bits_for(NUM_PAGES)
    targets = [0, 17, 99, 150, 199]
    keys = [dpf.generate_keys(d, t)[0] for t in targets]
    models = {state.identity: synthetic_pages(1, 0, NUM_PAGES).copy()}
    lock = threading.Lock()
    answers: list[tuple[object, np.ndarray]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def scanner() -> None:
        while not stop.is_set():
            try:
                got = state.scan(keys)
            except BaseException as exc:  # noqa: BLE001 - collected, asserted below
                errors.append(exc)
                return
            with lock:
                answers.append(got)

    threads = [threading.Thread(target=scanner) for _ in range(3)]
    for t in threads:
        t.start()
    rng = np.random.default_rng(3)
    try:
        epoch = 1
        model = models[state.identity]
        for step in range(12):
            epoch += 1
            if step == 6:  # a rotation: the old segments retire while scans still run
                state.prepare_snapshot(epoch, snap_b, 0, NUM_PAGES)
                state.commit(epoch)
                model = synthetic_pages(2, 0, NUM_PAGES).copy()
            else:
                page = int(rng.integers(0, NUM_PAGES))
                diff = rng.integers(0, 256, 4096, np.uint8)
                state.prepare_updates(epoch, [PageUpdate(page, diff.tobytes())])
                state.commit(epoch)
                model = model.copy()
                model[page] ^= diff
                if name == "gpu-fake":
                    # a GPU shard's commit wrote the update into the device copy, under scans
                    assert len(state.current.pending) == 0 and state.fold_pending() == 0
                elif step % 2:
                    assert state.fold_pending() >= 1  # splits and retires segments
            with lock:
                models[state.identity] = model
            n = len(answers)
            while len(answers) < n + 2 and not errors:
                stop.wait(0.001)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    assert len(answers) > 20
    expected = {ident: _reference(m, keys) for ident, m in models.items()}
    for ident, acc in answers:
        assert np.array_equal(acc, expected[ident])  # every answer is its epoch's bytes
    assert len({ident for ident, _ in answers}) > 3
    state.close()


def test_retired_segment_closes_when_its_last_scan_ends(snaps):
    snap_a, snap_b = snaps
    backend = FakeBackend()
    state = ShardState(make_engine(backend, pool_size=1), snap_a, 0, NUM_PAGES)
    keys = [dpf.generate_keys(domain_bits_for(NUM_PAGES), 5)[1]]
    with state.lease() as held:
        seg = held.segments[0]
        state.prepare_snapshot(2, snap_b, 0, NUM_PAGES)
        state.commit(2)
        assert seg.lease.retired and not seg.lease.closed
        # the retired GPU shard still answers the scan that holds it
        acc = held.scan(dpf.KeyBatch.from_keys(keys))
        assert np.array_equal(acc, _reference(synthetic_pages(1, 0, NUM_PAGES), keys))
    assert seg.lease.closed
    with pytest.raises(RuntimeError, match="closed"):
        seg.scanner.scan(dpf.KeyBatch.from_keys(keys))
    assert state.scan(keys)[0].epoch_id == 2
    state.close()
    assert state.current.segments[0].lease.closed


@pytest.mark.parametrize("name", ["gpu-fake", "cpu"])
def test_a_scan_waiting_at_the_gate_while_a_write_fails_is_refused(snaps, name, monkeypatch):
    """A write into the pages that fails partway (the GPU shard's device fold as it commits,
    the CPU shard's fold of pending updates) leaves them undefined: the shard stops serving,
    and a scan that was already waiting at the gate when it failed is refused too, never
    answered from what the write left under the version's label."""
    import contextlib

    snap_a, _ = snaps
    state = ShardState(_engine(name), snap_a, 0, NUM_PAGES, chunk_pages=16)
    d = domain_bits_for(NUM_PAGES)
    rng = np.random.default_rng(5)
    state.prepare_updates(2, [PageUpdate(17, rng.integers(0, 256, 4096, np.uint8).tobytes())])
    if name == "cpu":
        state.commit(2)  # pending until the fold: the write is the fold
    waiting, held, outcome = threading.Event(), threading.Event(), {}
    gate_scan, gate_write = state._gate.scan, state._gate.write

    @contextlib.contextmanager
    def arriving():
        waiting.set()  # past the first check, at the gate
        with gate_scan():
            yield

    @contextlib.contextmanager
    def writing():
        with gate_write():
            held.set()  # the scan is let go once the write holds the gate
            yield

    real_write = state._write_under_gate

    def failing_write(action):
        def fails():
            action()  # the pages changed
            assert waiting.wait(30)
            raise MemoryError("a write that failed partway")
        return real_write(fails)

    monkeypatch.setattr(state._gate, "scan", arriving)
    monkeypatch.setattr(state._gate, "write", writing)
    monkeypatch.setattr(state, "_write_under_gate", failing_write)

    def scanner():
        assert held.wait(30)
        try:
            outcome["answer"] = state.scan([dpf.generate_keys(d, 17)[0]])
        except RuntimeError as exc:
            outcome["refused"] = exc

    thread = threading.Thread(target=scanner)
    thread.start()
    with pytest.raises(MemoryError):
        state.fold_pending() if name == "cpu" else state.commit(2)
    thread.join(30)
    assert "answer" not in outcome and "undefined" in str(outcome["refused"])
    with pytest.raises(RuntimeError, match="undefined after a failed write"):
        state.scan([dpf.generate_keys(d, 17)[0]])
