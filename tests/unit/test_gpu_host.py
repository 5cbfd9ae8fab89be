"""The GPU engine's host side against a fake backend: packing, planning, the workspace pool
and its streams, concurrent scans through the pool, chunking, error translation.

The fake keeps device memory in (poisoned) numpy arrays and runs a NumPy model of each
kernel's contract; test_gpu_kernel_emulated.py runs the real kernel source instead.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest
from _gpu_fakes import FakeBackend, FakeCudaError, make_engine, unpack_key

from morphogen.constants import MAX_KEYS_PER_SCAN, PAGE_SIZE
from morphogen.engine import gpu, gpu_kernels, gpu_keys, gpu_plan, gpu_pool
from morphogen.engine.base import EngineUnavailable
from morphogen.engine.reference import ReferenceEngine
from morphogen.protocol import dpf
from morphogen.protocol.dpf import DomainError, KeyBatch


def random_keys(rng, d, n):
    return [dpf.generate_keys(d, int(rng.integers(0, 1 << d)))[int(rng.integers(0, 2))]
            for _ in range(n)]


def random_pages(rng, n):
    return rng.integers(0, 256, (n, PAGE_SIZE), dtype=np.uint8)


def scan_launches(backend):
    return [x for x in backend.launches if x.kernel in gpu_plan.SCAN_KERNELS]


# ---------------------------------------------------------------------------------------------
# key records


def test_pack_keys_layout_matches_key_batch():
    rng = np.random.default_rng(0)
    for d in (1, 5, 25, 32):
        keys = random_keys(rng, d, 7)
        batch = KeyBatch.from_keys(keys)
        rec = gpu_keys.pack_keys(batch)
        assert rec.dtype == np.uint32 and rec.shape == (7, gpu_keys.key_words(d))
        assert rec.flags.c_contiguous
        np.testing.assert_array_equal(rec[:, 0:4], batch.root_seed)
        np.testing.assert_array_equal(rec[:, 4:8], batch.final_cw)
        np.testing.assert_array_equal(rec[:, 8], batch.root_t)
        for i in range(d):
            np.testing.assert_array_equal((rec[:, 9] >> i) & 1, batch.tcw[:, i, 0])
            np.testing.assert_array_equal((rec[:, 10] >> i) & 1, batch.tcw[:, i, 1])
        assert not rec[:, 11].any()
        np.testing.assert_array_equal(rec[:, 12:].reshape(7, d, 4), batch.cw)
        for k, key in enumerate(keys):  # and nothing is lost: the record gives the key back
            assert unpack_key(rec[k], d).to_bytes() == key.to_bytes()


def test_pack_keys_into_a_flat_buffer():
    rng = np.random.default_rng(1)
    batch = KeyBatch.from_keys(random_keys(rng, 9, 3))
    buf = np.full(1000, 0xFFFFFFFF, np.uint32)
    rec = gpu_keys.pack_keys(batch, buf[21:])
    assert np.shares_memory(rec, buf)
    np.testing.assert_array_equal(buf[21 : 21 + rec.size].reshape(rec.shape),
                                  gpu_keys.pack_keys(batch))
    assert (buf[21 + rec.size :] == 0xFFFFFFFF).all()
    with pytest.raises(ValueError):
        gpu_keys.pack_keys(batch, np.zeros(5, np.uint32))


# ---------------------------------------------------------------------------------------------
# launch planning


@pytest.mark.parametrize(
    "k,kg_max,kg,groups",
    [
        (1, 16, 1, 1), (3, 16, 3, 1), (5, 16, 6, 1), (6, 16, 6, 1), (12, 16, 12, 1),
        (16, 16, 16, 1), (17, 16, 12, 2), (24, 16, 12, 2), (48, 16, 16, 3), (96, 16, 16, 6),
        (24, 8, 8, 3), (96, 8, 8, 12), (7, 4, 4, 2), (96, 1, 1, 96),
    ],
)
def test_key_groups(k, kg_max, kg, groups):
    assert gpu_plan.choose_key_group(k, kg_max) == (kg, groups)
    assert kg * groups >= k and kg * (groups - 1) < k  # no group is all padding


def test_plan_shapes():
    occ = {}

    def blocks_per_sm(name, smem):
        occ[name] = smem
        return 3

    for k in range(1, MAX_KEYS_PER_SCAN + 1):
        for d in (1, 3, 10, 22, 32):
            p = gpu_plan.plan_launch(k, 1 << 20, d, sm_count=132, blocks_per_sm=blocks_per_sm)
            assert p.kernel == f"morphogen_scan_k{p.key_group}"
            assert p.smem_bytes == gpu_plan.scan_smem_bytes(p.key_group, p.tile_bits)
            assert p.smem_bytes <= gpu_plan.SMEM_BUDGET
            assert 1 <= p.tile_bits <= min(d, gpu_plan.MAX_TILE_BITS)
            assert p.grid == p.num_groups * p.page_blocks <= 132 * 3  # one wave
            assert p.page_blocks == 132 * 3 // p.num_groups
            assert p.reduce_grid * gpu_plan.REDUCE_LANES >= k * gpu_plan.LANES_PER_PAGE
    # few pages: no block gets less than MIN_PAGES_PER_BLOCK pages' worth
    p = gpu_plan.plan_launch(3, 100, 7, sm_count=132, blocks_per_sm=lambda n, s: 4)
    assert p.page_blocks == 2
    p = gpu_plan.plan_launch(3, 1, 1, sm_count=132, blocks_per_sm=lambda n, s: 4)
    assert p.page_blocks == 1 and p.tile_bits == 1
    # the partial buffer caps the blocks; an explicit count wins over the occupancy
    p = gpu_plan.plan_launch(96, 1 << 20, 20, sm_count=132, blocks_per_sm=lambda n, s: 4,
                             max_partial_rows=960)
    assert p.page_blocks * 96 <= 960
    p = gpu_plan.plan_launch(8, 10, 4, sm_count=132, blocks_per_sm=lambda n, s: 4,
                             page_blocks=13)
    assert p.page_blocks == 13


def test_plan_rejects_bad_input():
    kw = dict(sm_count=1, blocks_per_sm=lambda n, s: 1)
    with pytest.raises(ValueError):
        gpu_plan.plan_launch(0, 10, 4, **kw)
    with pytest.raises(ValueError):
        gpu_plan.plan_launch(1, 0, 4, **kw)
    with pytest.raises(ValueError):
        gpu_plan.plan_launch(1, 10, 33, **kw)
    with pytest.raises(ValueError):
        gpu_plan.plan_launch(1, 10, 4, key_group_max=5, **kw)


def test_tile_fits_shared_memory_for_every_key_group():
    for kg in gpu_plan.KEY_GROUP_SIZES:
        for d in range(1, 33):
            h = gpu_plan.choose_tile_bits(kg, d)
            assert h <= d and gpu_plan.scan_smem_bytes(kg, h) <= gpu_plan.SMEM_BUDGET
            assert h == gpu_plan.MAX_TILE_BITS or h == d or gpu_plan.scan_smem_bytes(kg, h + 1) > (
                gpu_plan.SMEM_BUDGET
            )


# ---------------------------------------------------------------------------------------------
# pool size: validated, clamped, read once


@pytest.mark.parametrize("value,expected", [(1, 1), (5, 5), (0, 1), (-3, 1), (1000, 32),
                                            ("7", 7), (" 2 ", 2), (np.int64(4), 4)])
def test_pool_size_clamped(value, expected):
    assert gpu_pool.clamp_pool_size(value) == expected


@pytest.mark.parametrize("value", ["x", "2.5", 2.5, None, True, [3]])
def test_pool_size_rejected(value):
    with pytest.raises((TypeError, ValueError)):
        gpu_pool.clamp_pool_size(value)


def test_pool_size_env_read_once(monkeypatch):
    monkeypatch.setenv(gpu_pool.POOL_SIZE_ENV, "3")
    engine = make_engine(FakeBackend())
    monkeypatch.setenv(gpu_pool.POOL_SIZE_ENV, "9")
    shard = engine.load(random_pages(np.random.default_rng(0), 4))
    assert engine.pool_size == 3 and shard.pool_size == 3
    monkeypatch.setenv(gpu_pool.POOL_SIZE_ENV, "lots")
    with pytest.raises(ValueError):
        make_engine(FakeBackend())
    assert make_engine(FakeBackend(), pool_size=2).pool_size == 2  # the option beats the env


def test_engine_options_validated():
    with pytest.raises(ValueError):
        make_engine(FakeBackend(), key_group_max=5)
    with pytest.raises(ValueError):
        make_engine(FakeBackend(), max_keys=97)
    with pytest.raises(ValueError):
        make_engine(FakeBackend(), load_chunk_bytes=100)


def test_each_workspace_has_its_own_non_blocking_stream():
    backend = FakeBackend()
    shard = make_engine(backend, pool_size=5).load(random_pages(np.random.default_rng(0), 8))
    workspaces = shard._pool.workspaces
    assert len(workspaces) == 5
    streams = [ws.stream for ws in workspaces]
    assert len({id(s) for s in streams}) == 5
    assert all(s.non_blocking for s in streams)
    for ws in workspaces:  # and its own buffers
        others = [w for w in workspaces if w is not ws]
        assert all(ws.partial_dev is not o.partial_dev and ws.out_host is not o.out_host
                   for o in others)
        assert ws.keys_host.dtype == np.uint32
        assert ws.keys_host.size >= MAX_KEYS_PER_SCAN * gpu_keys.key_words(32)


def test_pool_shrinks_to_device_memory_and_fails_when_nothing_fits():
    pages = random_pages(np.random.default_rng(0), 8)
    probe = make_engine(FakeBackend(), pool_size=1).load(pages)
    per = gpu_pool.Workspace.device_bytes(MAX_KEYS_PER_SCAN, probe._partial_rows)
    base = pages.nbytes + gpu_pool.DEVICE_RESERVE_BYTES + 16
    shard = make_engine(FakeBackend(free_bytes=base + 3 * per), pool_size=8).load(pages)
    assert shard.pool_size == 3
    with pytest.raises(gpu.GpuError, match="no device memory"):
        make_engine(FakeBackend(free_bytes=base + per // 2), pool_size=8).load(pages)


# ---------------------------------------------------------------------------------------------
# loading


def test_upload_in_bounded_chunks_keeps_every_byte():
    rng = np.random.default_rng(3)
    pages = random_pages(rng, 23)
    backend = FakeBackend()
    shard = make_engine(backend, pool_size=1, load_chunk_bytes=5 * PAGE_SIZE).load(pages, 7)
    np.testing.assert_array_equal(shard._pages_dev.buf[: pages.nbytes], pages.reshape(-1))
    load_stream = backend.streams[0]
    assert load_stream.ops.count("h2d") == 5  # ceil(23 / 5) chunks through the staging buffers
    staging = 2 * 5 * PAGE_SIZE
    ws_pinned = MAX_KEYS_PER_SCAN * (gpu_keys.key_words(32) * 4 + PAGE_SIZE)
    assert backend.pinned_allocated <= staging + ws_pinned + 64


def test_load_from_a_memmap(tmp_path):
    rng = np.random.default_rng(4)
    pages = random_pages(rng, 9)
    path = tmp_path / "pages.bin"
    pages.tofile(path)
    mm = np.memmap(path, np.uint8, "r", shape=(9, PAGE_SIZE))
    keys = random_keys(rng, 5, 4)
    shard = make_engine(FakeBackend(), pool_size=1, load_chunk_bytes=2 * PAGE_SIZE).load(mm, 3)
    np.testing.assert_array_equal(shard.scan(keys), ReferenceEngine().load(pages, 3).scan(keys))


def test_load_rejects_bad_pages():
    engine = make_engine(FakeBackend())
    with pytest.raises(ValueError):
        engine.load(np.zeros((3, 100), np.uint8))
    with pytest.raises(ValueError):
        engine.load(np.zeros((3, PAGE_SIZE), np.uint16))
    with pytest.raises(ValueError):
        engine.load(np.zeros((3, PAGE_SIZE), np.uint8), first_page=-1)


def test_empty_shard_answers_zeros():
    rng = np.random.default_rng(18)
    shard = make_engine(FakeBackend(), pool_size=1).load(np.zeros((0, PAGE_SIZE), np.uint8), 5)
    got = shard.scan(random_keys(rng, 3, 2))
    assert got.shape == (2, PAGE_SIZE) and not got.any()


def test_compiled_once_per_engine_and_warmed():
    backend = FakeBackend()
    engine = make_engine(backend, pool_size=1)
    pages = random_pages(np.random.default_rng(5), 6)
    engine.load(pages)
    engine.load(pages, 6)
    assert backend.compiles == 1
    warmed = {x.kernel for x in scan_launches(backend)}
    assert warmed == set(gpu_plan.SCAN_KERNELS)  # every variant a scan can pick ran at load


# ---------------------------------------------------------------------------------------------
# scanning through the pool


@pytest.mark.parametrize("num_pages,first_page,d", [(1, 0, 1), (13, 0, 4), (50, 77, 8),
                                                     (129, 1000, 11)])
def test_scan_matches_reference(num_pages, first_page, d):
    rng = np.random.default_rng(num_pages)
    pages = random_pages(rng, num_pages)
    keys = random_keys(rng, d, 10)
    backend = FakeBackend()
    shard = make_engine(backend, pool_size=2).load(pages, first_page)
    got, timings = shard.scan_timed(keys)
    assert got.dtype == np.uint8 and got.shape == (10, PAGE_SIZE)
    np.testing.assert_array_equal(got, ReferenceEngine().load(pages, first_page).scan(keys))
    np.testing.assert_array_equal(shard.scan(KeyBatch.from_keys(keys)), got)
    assert timings.launches == 1 and timings.shared_launches == 0
    assert timings.total_ms >= timings.kernel_ms >= 0 and timings.wait_ms >= 0


def test_more_than_96_keys_are_chunked():
    rng = np.random.default_rng(6)
    pages = random_pages(rng, 10)
    keys = random_keys(rng, 4, 203)
    backend = FakeBackend()
    shard = make_engine(backend, pool_size=1).load(pages)
    before = len(backend.launches)
    got, timings = shard.scan_timed(keys)
    sizes = [int(x.args[4]) for x in scan_launches(backend)[-3:]]
    assert sizes == [96, 96, 11] and len(backend.launches) - before == 6  # scan + reduce each
    assert timings.launches == 3
    np.testing.assert_array_equal(got, ReferenceEngine().load(pages).scan(keys))


def test_smaller_max_keys_chunks_smaller():
    rng = np.random.default_rng(7)
    pages = random_pages(rng, 5)
    keys = random_keys(rng, 3, 10)
    backend = FakeBackend()
    shard = make_engine(backend, pool_size=1, max_keys=4).load(pages)
    got = shard.scan(keys)
    assert [int(x.args[4]) for x in scan_launches(backend)[-3:]] == [4, 4, 2]
    np.testing.assert_array_equal(got, ReferenceEngine().load(pages).scan(keys))


def test_domain_is_checked():
    rng = np.random.default_rng(8)
    shard = make_engine(FakeBackend(), pool_size=1).load(random_pages(rng, 9), 10)
    with pytest.raises(DomainError):
        shard.scan(random_keys(rng, 4, 1))  # 2^4 < 10 + 9
    with pytest.raises(DomainError):
        shard.scan([*random_keys(rng, 5, 1), *random_keys(rng, 6, 1)])
    with pytest.raises(ValueError):
        shard.scan([])


def run_concurrently(fn, n):
    results, errors = [None] * n, []
    barrier = threading.Barrier(n)

    def worker(i):
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


def test_concurrent_scans_use_distinct_workspaces_and_overlap():
    rng = np.random.default_rng(9)
    pages = random_pages(rng, 16)
    keysets = [random_keys(rng, 5, 3) for _ in range(4)]
    backend = FakeBackend()
    shard = make_engine(backend, pool_size=4).load(pages)
    backend.launch_delay_s = 0.15  # after the warm-up launches
    backend.launches.clear()
    backend.max_active_launches = 0
    results = run_concurrently(lambda i: shard.scan(keysets[i]), 4)
    ref = ReferenceEngine().load(pages)
    for got, keys in zip(results, keysets, strict=True):
        np.testing.assert_array_equal(got, ref.scan(keys))
    scans = scan_launches(backend)
    assert len(scans) == 4
    assert len({x.stream for x in scans}) == 4  # four workspaces, four streams
    assert backend.max_active_launches >= 3  # they ran side by side, not behind a lock


def test_pool_bounds_launches_in_flight():
    rng = np.random.default_rng(10)
    pages = random_pages(rng, 8)
    keysets = [random_keys(rng, 4, 2) for _ in range(6)]
    backend = FakeBackend()
    shard = make_engine(backend, pool_size=2).load(pages)
    backend.launch_delay_s = 0.05  # after the warm-up launches
    backend.launches.clear()
    backend.max_active_launches = 0
    run_concurrently(lambda i: shard.scan(keysets[i]), 6)
    assert backend.max_active_launches <= 2
    scans = scan_launches(backend)
    assert len(scans) == 6 and len({x.stream for x in scans}) <= 2


def test_concurrent_callers_are_never_merged():
    # merging concurrent queries is the router's coalescer's job: the engine runs each call's
    # keys in launches of their own, the callers beyond the pool waiting for a workspace
    rng = np.random.default_rng(11)
    pages = random_pages(rng, 12)
    keysets = [random_keys(rng, 6, 3) for _ in range(8)]
    backend = FakeBackend()
    shard = make_engine(backend, pool_size=1).load(pages)
    backend.launch_delay_s = 0.05  # after the warm-up launches
    backend.launches.clear()
    results = run_concurrently(lambda i: shard.scan_timed(keysets[i]), 8)
    ref = ReferenceEngine().load(pages)
    for (got, t), keys in zip(results, keysets, strict=True):
        np.testing.assert_array_equal(got, ref.scan(keys))
        assert t.launches == 1 and t.shared_launches == 0  # one workspace: nothing overlaps
    assert [int(x.args[4]) for x in scan_launches(backend)] == [3] * 8
    waits = sorted(t.wait_ms for _, t in results)
    assert waits[-1] >= 300  # the last caller waited for seven scans (100 ms each) to end


def test_a_call_keeps_its_workspace_for_all_its_launches():
    rng = np.random.default_rng(12)
    pages = random_pages(rng, 4)
    sets = [random_keys(rng, 3, 150), random_keys(rng, 4, 5), random_keys(rng, 3, 100),
            random_keys(rng, 5, 97)]
    backend = FakeBackend()
    shard = make_engine(backend, pool_size=2).load(pages)
    backend.launch_delay_s = 0.02  # after the warm-up launches
    backend.launches.clear()
    results = run_concurrently(lambda i: shard.scan_timed(sets[i]), 4)
    ref = ReferenceEngine().load(pages)
    for (got, t), keys in zip(results, sets, strict=True):
        np.testing.assert_array_equal(got, ref.scan(keys))
        assert t.launches == -(-len(keys) // MAX_KEYS_PER_SCAN)
    scans = scan_launches(backend)
    assert sorted(int(x.args[4]) for x in scans) == sorted([96, 54, 5, 96, 4, 96, 1])
    by_thread: dict[int, set[int]] = {}
    for x in scans:
        by_thread.setdefault(x.thread, set()).add(x.stream)
    assert all(len(streams) == 1 for streams in by_thread.values())  # one workspace per call


def test_cuda_errors_become_gpu_errors_and_the_pool_survives():
    rng = np.random.default_rng(13)
    pages = random_pages(rng, 6)
    keys = random_keys(rng, 3, 3)
    backend = FakeBackend()
    shard = make_engine(backend, pool_size=1).load(pages)
    backend.fail_next_launch = "an illegal memory access was encountered"
    with pytest.raises(gpu.GpuError, match="illegal memory access") as info:
        shard.scan(keys)
    causes, e = [], info.value
    while e is not None:
        causes.append(e)
        e = e.__cause__
    assert any(isinstance(c, FakeCudaError) for c in causes)  # the driver's error is kept
    np.testing.assert_array_equal(shard.scan(keys), ReferenceEngine().load(pages).scan(keys))


def test_a_failed_launch_fails_only_its_caller():
    rng = np.random.default_rng(14)
    pages = random_pages(rng, 4)
    backend = FakeBackend()
    shard = make_engine(backend, pool_size=1).load(pages)
    backend.launch_delay_s = 0.05  # after the warm-up launches

    def call(i):
        if i == 0:
            backend.fail_next_launch = "launch failed"
        time.sleep(0.02 * i)
        try:
            shard.scan(random_keys(np.random.default_rng(i), 3, 1))
            return "ok"
        except gpu.GpuError:
            return "error"

    outcomes = run_concurrently(call, 4)
    assert sorted(outcomes) == ["error", "ok", "ok", "ok"]  # nobody hangs, one launch failed


def test_compile_and_load_errors_are_gpu_errors():
    class BrokenCompile(FakeBackend):
        def compile(self, source, options, names):
            raise FakeCudaError("NVRTC_ERROR_COMPILATION")

    with pytest.raises(gpu.GpuError, match="compiling"):
        make_engine(BrokenCompile()).load(random_pages(np.random.default_rng(0), 2))

    class NoMemory(FakeBackend):
        def alloc(self, nbytes):
            raise FakeCudaError("out of memory")

    with pytest.raises(gpu.GpuError, match="out of memory"):
        make_engine(NoMemory()).load(random_pages(np.random.default_rng(0), 2))


def test_close_waits_and_refuses_later_scans():
    rng = np.random.default_rng(15)
    pages = random_pages(rng, 4)
    keys = random_keys(rng, 3, 2)
    backend = FakeBackend()
    shard = make_engine(backend, pool_size=1).load(pages)
    backend.launch_delay_s = 0.2  # after the warm-up launches
    t = threading.Thread(target=shard.scan, args=(keys,))
    t.start()
    time.sleep(0.05)
    shard.close()  # returns only after the scan in flight
    t.join(5)
    assert not t.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        shard.scan(keys)
    shard.close()


def test_close_fails_queued_callers_instead_of_stranding_them():
    rng = np.random.default_rng(17)
    pages = random_pages(rng, 4)
    backend = FakeBackend()
    shard = make_engine(backend, pool_size=1).load(pages)
    backend.launch_delay_s = 0.3  # after the warm-up launches
    outcomes = []

    def call():
        try:
            shard.scan(random_keys(rng, 3, 1))
            outcomes.append("ok")
        except RuntimeError:
            outcomes.append("closed")

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    shard.close()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    assert len(outcomes) == 3 and "ok" in outcomes


def test_read_pages_timed_checksum():
    rng = np.random.default_rng(16)
    pages = random_pages(rng, 7)
    shard = make_engine(FakeBackend(sm_count=1), pool_size=1).load(pages)
    ms, digest = shard.read_pages_timed(repeats=2)
    expect = np.bitwise_xor.reduce(pages.view(np.uint64).reshape(-1, 2), axis=0).tobytes()
    assert digest == expect and ms >= 0


def test_default_kernel_is_sliced_and_the_environment_picks_another(monkeypatch):
    monkeypatch.delenv(gpu.LAYOUT_ENV, raising=False)
    assert gpu.GpuEngine(backend=FakeBackend()).layout == "sliced"
    monkeypatch.setenv(gpu.LAYOUT_ENV, "fused")
    assert gpu.GpuEngine(backend=FakeBackend()).layout == "fused"
    assert gpu.GpuEngine(backend=FakeBackend(), kernel="sliced").layout == "sliced"
    monkeypatch.setenv(gpu.LAYOUT_ENV, "tensor")
    with pytest.raises(ValueError, match="kernel must be one of"):
        gpu.GpuEngine(backend=FakeBackend())


def test_engine_unavailable_without_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy now raises ImportError
    with pytest.raises(EngineUnavailable):
        gpu.GpuEngine()


def test_kernel_argument_types_documented_in_both_places():
    # the table in gpu_kernels.py and the kernel's comment agree on every scalar's width
    src = gpu_kernels.KERNEL_SOURCE.read_text()
    for c_decl in ("const u64 num_pages", "const u64 first_page", "const u32 num_keys",
                   "const u32 domain_bits", "const u32 tile_bits", "const u32 num_groups",
                   "const u32 num_partials", "const u32 row_lanes", "const u64 n16"):
        assert c_decl in src
    assert "typedef unsigned int u32;" in src and "typedef unsigned long long u64;" in src
    assert np.dtype(gpu_kernels.U32).itemsize == 4 and np.dtype(gpu_kernels.U64).itemsize == 8
