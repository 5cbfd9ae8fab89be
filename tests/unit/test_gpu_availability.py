"""Choosing the GPU engine where CuPy imports but cannot compile, and what its phase timings
mean. No CuPy needed: the CuPy backend is replaced by fakes whose compile fails the way CuPy's
does (a plain RuntimeError where NVRTC or the CUDA headers are missing, a CompileException
where NVRTC refuses the source).
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
from _gpu_fakes import FakeBackend, FakeCudaError, make_engine

import morphogen.engine as engines
from morphogen.constants import PAGE_SIZE
from morphogen.engine import gpu, gpu_plan, gpu_timings
from morphogen.engine.cpu import CpuEngine
from morphogen.engine.reference import ReferenceEngine
from morphogen.protocol import dpf

# What CuPy 14 raises at the first RawModule compile when cuda-pathfinder finds no headers,
# and what it raises when libnvrtc cannot be loaded.
NO_HEADERS = (
    "Failed to auto-detect CUDA root directory. Please specify `CUDA_PATH` environment "
    "variable if you are using CUDA versions not yet supported by CuPy."
)
NO_NVRTC = (
    "CuPy failed to load libnvrtc.so.12: OSError: libnvrtc.so.12: cannot open shared object "
    "file: No such file or directory"
)


class CannotCompile(FakeBackend):
    """CuPy imports and sees a device, but compiling raises a plain RuntimeError."""

    def __init__(self, message: str, **kw) -> None:
        super().__init__(**kw)
        self.message = message

    def compile(self, source, options, names):
        self.compiles += 1
        raise RuntimeError(self.message)


class CompileRefused(FakeBackend):
    """NVRTC runs and rejects the program (CuPy's CompileException, a backend error type)."""

    def compile(self, source, options, names):
        self.compiles += 1
        raise FakeCudaError("NVRTC_ERROR_COMPILATION (6)\nkernel.cu(1): error: incomplete type\n")


@pytest.fixture
def device_with(monkeypatch):
    """Makes the next CuPy backends the given fake, on a machine that 'has a GPU'."""

    def install(backend: FakeBackend) -> FakeBackend:
        monkeypatch.setattr(engines, "gpu_available", lambda: True)
        monkeypatch.setattr(gpu, "CupyBackend", lambda device: backend)
        return backend

    return install


def engine_warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name == "morphogen.engine" and r.levelno == logging.WARNING]


# ---------------------------------------------------------------------------------------------
# a CuPy that imports but cannot compile


@pytest.mark.parametrize("message", [NO_HEADERS, NO_NVRTC])
def test_auto_falls_back_to_cpu_and_logs_why(device_with, caplog, message):
    backend = device_with(CannotCompile(message))
    with caplog.at_level(logging.WARNING, logger="morphogen.engine"):
        chosen = engines.create("auto")
    assert isinstance(chosen, CpuEngine) and chosen.name == "cpu"
    assert backend.compiles == 1  # the probe is the real compile
    (record,) = engine_warnings(caplog)
    text = record.getMessage()
    assert "\n" not in text
    assert "using the cpu engine" in text
    assert message in text  # the reason, as CuPy gave it
    assert "gpu-cuda12" in text and "gpu-cuda13" in text  # and the fix


@pytest.mark.parametrize("message", [NO_HEADERS, NO_NVRTC])
def test_gpu_fails_at_creation_naming_cause_and_fix(device_with, message):
    device_with(CannotCompile(message))
    with pytest.raises(gpu.GpuError) as info:
        engines.create("gpu")
    text = str(info.value)
    assert "cannot compile its CUDA kernels" in text
    assert "NVRTC or the CUDA headers are missing" in text
    assert f"RuntimeError: {message}" in text
    assert "pip install 'morphogen[gpu-cuda12]'" in text
    assert "'morphogen[gpu-cuda13]'" in text and "uninstall" in text
    assert isinstance(info.value.__cause__, RuntimeError)
    assert isinstance(info.value, RuntimeError)


def test_gpu_fails_at_creation_not_at_the_first_load_or_scan():
    backend = CannotCompile(NO_HEADERS)
    with pytest.raises(gpu.GpuError, match="compile"):
        make_engine(backend)
    assert backend.compiles == 1 and not backend.launches and backend.allocated == 0


def test_a_rejected_program_also_fails_creation_with_the_hint(device_with, caplog):
    device_with(CompileRefused())
    with pytest.raises(gpu.GpuError, match="compiling scan_kernel.cu") as info:
        engines.create("gpu")
    assert "incomplete type" in str(info.value)  # NVRTC's log is kept
    assert "gpu-cuda12" in str(info.value)
    with caplog.at_level(logging.WARNING, logger="morphogen.engine"):
        assert engines.create("auto").name == "cpu"
    (record,) = engine_warnings(caplog)
    assert "\n" not in record.getMessage() and "incomplete type" in record.getMessage()


def test_a_long_reason_is_cut_in_the_middle(device_with, caplog):
    device_with(CannotCompile("x" * 20_000))
    with caplog.at_level(logging.WARNING, logger="morphogen.engine"):
        engines.create("auto")
    (record,) = engine_warnings(caplog)
    text = record.getMessage()
    assert len(text) < engines.MAX_REASON_CHARS + 200
    assert "cannot compile its CUDA kernels" in text and "CUDA_PATH to a local CUDA toolkit" in text


def test_auto_takes_a_gpu_that_compiles_without_a_warning(device_with, caplog):
    backend = device_with(FakeBackend())
    with caplog.at_level(logging.WARNING, logger="morphogen.engine"):
        chosen = engines.create("auto", pool_size=1)
    assert isinstance(chosen, gpu.GpuEngine) and chosen.name == "gpu"
    assert backend.compiles == 1 and not engine_warnings(caplog)
    pages = np.random.default_rng(0).integers(0, 256, (5, PAGE_SIZE), dtype=np.uint8)
    keys = list(dpf.generate_keys(3, 2))
    np.testing.assert_array_equal(chosen.load(pages).scan(keys),
                                  ReferenceEngine().load(pages).scan(keys))
    assert backend.compiles == 1  # compiled at creation, not again at load


def test_no_gpu_is_the_cpu_engine_without_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(engines, "gpu_available", lambda: False)
    with caplog.at_level(logging.WARNING, logger="morphogen.engine"):
        assert engines.create("auto").name == "cpu"
    assert not engine_warnings(caplog)
    with pytest.raises(engines.EngineUnavailable):
        engines.create("gpu")


def test_options_errors_are_not_swallowed_by_the_fallback(device_with):
    device_with(FakeBackend())
    with pytest.raises(ValueError, match="key_group_max"):
        engines.create("auto", key_group_max=5)


# ---------------------------------------------------------------------------------------------
# phase timings


class RecordingBackend(FakeBackend):
    """Also logs event records on their stream, to check where the phase boundaries are."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.event_names: dict[int, str] = {}

    def record(self, event, stream):
        super().record(event, stream)
        stream.ops.append(f"record:{self.event_names.get(id(event), '?')}")


def test_events_bracket_copy_kernels_and_copy_on_the_workspace_stream():
    backend = RecordingBackend()
    shard = make_engine(backend, pool_size=1).load(np.zeros((6, PAGE_SIZE), np.uint8))
    (ws,) = shard._pool.workspaces
    for i, event in enumerate(ws.events):
        backend.event_names[id(event)] = f"e{i}"
    ws.stream.ops.clear()
    shard.scan([dpf.generate_keys(3, 1)[0]])
    # e1 after the key copy, right before the scan: kernel_ms starts once the keys are there
    assert ws.stream.ops == [
        "record:e0", "h2d", "record:e1", "morphogen_scan_k1", gpu_plan.REDUCE_KERNEL, "record:e2",
        "d2h", "record:e3", "sync",
    ]


def test_lone_launches_are_not_shared():
    rng = np.random.default_rng(1)
    pages = rng.integers(0, 256, (8, PAGE_SIZE), dtype=np.uint8)
    shard = make_engine(FakeBackend(), pool_size=2).load(pages)
    for _ in range(3):
        _, t = shard.scan_timed(list(dpf.generate_keys(3, 4)))
        assert t.launches == 1 and t.shared_launches == 0
        assert t.kernel_ms >= 0 and t.h2d_ms >= 0 and t.d2h_ms >= 0
    _, t = shard.scan_timed([dpf.generate_keys(3, 4)[0]] * 200)  # one caller: one at a time
    assert t.launches == 3 and t.shared_launches == 0


def test_overlapping_launches_are_counted_as_shared():
    rng = np.random.default_rng(2)
    pages = rng.integers(0, 256, (8, PAGE_SIZE), dtype=np.uint8)
    backend = FakeBackend()
    shard = make_engine(backend, pool_size=2).load(pages)
    backend.launch_delay_s = 0.05  # after the warm-up launches
    barrier = threading.Barrier(4)
    results: list[gpu_timings.PhaseTimings] = []
    lock = threading.Lock()

    def call():
        barrier.wait()
        _, t = shard.scan_timed(list(dpf.generate_keys(3, 5)))
        with lock:
            results.append(t)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 4
    assert all(t.shared_launches <= t.launches == 1 for t in results)
    assert sum(t.shared_launches for t in results) >= 2  # two workspaces ran side by side
    # a fake launch's delay is inside its own e1 -> e2 span: scan and reduce, 50 ms each
    assert all(t.kernel_ms >= 90 for t in results)
    # two workspaces, four callers: two of them waited for a workspace, the others did not
    waits = sorted(t.wait_ms for t in results)
    assert waits[-2] >= 50 and waits[0] < 50


def test_phase_timings_keep_their_positional_shape():
    t = gpu_timings.PhaseTimings(1.0, 2.0, 3.0, 4.0, 5.0, 1)
    assert t.shared_launches == 0 and t.kernel_ms == 2.0 and t.launches == 1
    assert gpu_timings.PhaseTimings(1.0, 2.0, 3.0, 4.0, 5.0, 2, 1).shared_launches == 1
