"""The GPU engine on a real device: the oracle's bytes for every shape that matters.

Skipped cleanly where CuPy or a CUDA device is missing. Workspace buffers are poisoned before
the scans, so an answer that relied on zeroed device or pinned memory fails here.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from morphogen import engine
from morphogen.constants import PAGE_SIZE
from morphogen.engine import gpu_available, sliced
from morphogen.engine.reference import ReferenceEngine
from morphogen.protocol import dpf
from morphogen.protocol.dpf import DomainError

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device"),
]


@pytest.fixture(scope="module", params=["fused", "sliced"])
def gpu_engine(request):
    return engine.create("gpu", pool_size=4, kernel=request.param)


@pytest.fixture(scope="module")
def cpu_engine():
    return engine.create("cpu")


def random_keys(rng, d, n):
    return [dpf.generate_keys(d, int(rng.integers(0, 1 << d)))[int(rng.integers(0, 2))]
            for _ in range(n)]


def poison(shard):
    """Fill every workspace's device and pinned buffers with garbage."""
    import cupy

    for ws in shard._pool.workspaces:
        ws.partial_dev.fill(0xAB)
        ws.out_dev.fill(0xCD)
        ws.out_host[:] = 0xEF
    # fill() ran on the default stream; the scans run on non-blocking streams
    cupy.cuda.Device().synchronize()


def test_auto_picks_the_gpu():
    assert engine.create("auto").name == "gpu"


@pytest.mark.parametrize(
    "num_pages,first_page,extra_bits,queries",
    [
        (1, 0, 0, 1),
        (3, 0, 1, 2),
        (37, 5, 0, 4),
        (1000, 0, 0, 8),
        (1023, 1, 2, 3),
        (4097, 123, 0, 16),
        (5000, 7000, 1, 32),
    ],
)
def test_matches_reference(gpu_engine, num_pages, first_page, extra_bits, queries):
    rng = np.random.default_rng(num_pages + queries)
    pages = rng.integers(0, 256, (num_pages, PAGE_SIZE), dtype=np.uint8)
    d = max(1, (first_page + num_pages - 1).bit_length()) + extra_bits
    keys = random_keys(rng, d, 3 * queries)
    shard = gpu_engine.load(pages, first_page)
    try:
        poison(shard)
        got = shard.scan(keys)
        want = ReferenceEngine().load(pages, first_page).scan(keys[:6])
        np.testing.assert_array_equal(got[:6], want)
        if len(keys) > 6:
            cpu = engine.create("cpu").load(pages, first_page)
            np.testing.assert_array_equal(got, cpu.scan(keys))
    finally:
        shard.close()


@pytest.mark.parametrize("queries", [1, 2, 3, 4, 5, 8, 11, 16, 24, 32])
def test_every_query_count_against_cpu(gpu_engine, cpu_engine, queries):
    rng = np.random.default_rng(queries)
    n, first, d = 70_001, 12_345, 17
    pages = rng.integers(0, 256, (n, PAGE_SIZE), dtype=np.uint8)
    keys = random_keys(rng, d, 3 * queries)
    shard = gpu_engine.load(pages, first)
    try:
        poison(shard)
        got, timings = shard.scan_timed(keys)
        np.testing.assert_array_equal(got, cpu_engine.load(pages, first).scan(keys))
        assert timings.kernel_ms > 0 and timings.launches == 1
    finally:
        shard.close()


def test_more_than_96_keys_and_deep_domain(gpu_engine, cpu_engine):
    rng = np.random.default_rng(1)
    n, first, d = 3000, (1 << 32) - 3000, 32
    pages = rng.integers(0, 256, (n, PAGE_SIZE), dtype=np.uint8)
    keys = random_keys(rng, d, 200)
    shard = gpu_engine.load(pages, first)
    try:
        poison(shard)
        np.testing.assert_array_equal(shard.scan(keys), cpu_engine.load(pages, first).scan(keys))
        with pytest.raises(DomainError):
            shard.scan(random_keys(rng, 20, 1))
    finally:
        shard.close()


def test_shards_xor_to_the_page(gpu_engine):
    rng = np.random.default_rng(2)
    n, d = 20_000, 15
    pages = rng.integers(0, 256, (n, PAGE_SIZE), dtype=np.uint8)
    cuts = [0, 6_999, 13_000, n]
    shards = [gpu_engine.load(pages[a:b], a) for a, b in zip(cuts, cuts[1:], strict=False)]
    try:
        for target in (0, 6_998, 6_999, 19_999):
            k0, k1 = dpf.generate_keys(d, target)
            a = np.bitwise_xor.reduce([s.scan([k0]) for s in shards])
            b = np.bitwise_xor.reduce([s.scan([k1]) for s in shards])
            np.testing.assert_array_equal((a ^ b)[0], pages[target])
    finally:
        for s in shards:
            s.close()


def test_concurrent_scans(gpu_engine, cpu_engine):
    rng = np.random.default_rng(3)
    n, d = 30_000, 15
    pages = rng.integers(0, 256, (n, PAGE_SIZE), dtype=np.uint8)
    keysets = [random_keys(rng, d, 3 * (1 + i % 4)) for i in range(16)]
    shard = gpu_engine.load(pages)
    results, errors = [None] * 16, []

    def worker(i):
        try:
            results[i] = shard.scan(keysets[i])
        except BaseException as exc:  # reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        cpu = cpu_engine.load(pages)
        for got, keys in zip(results, keysets, strict=True):
            np.testing.assert_array_equal(got, cpu.scan(keys))
    finally:
        shard.close()


def test_read_kernel_checksum(gpu_engine):
    rng = np.random.default_rng(4)
    pages = rng.integers(0, 256, (4321, PAGE_SIZE), dtype=np.uint8)
    shard = gpu_engine.load(pages, 77)
    try:
        ms, digest = shard.read_pages_timed(repeats=2)
        if gpu_engine.layout == "sliced":
            want = sliced.sliced_digest(pages, 77)
        else:
            want = np.bitwise_xor.reduce(pages.view(np.uint64).reshape(-1, 2), axis=0).tobytes()
        assert digest == want and ms > 0
    finally:
        shard.close()


@pytest.mark.parametrize("num_pages,first_page", [(1, 0), (300, 0), (1000, 200), (3000, 70_000)])
def test_slice_kernel_writes_the_reference_layout(num_pages, first_page):
    """The device's sliced buffer, byte for byte, against sliced.slice_pages."""
    rng = np.random.default_rng(num_pages)
    pages = rng.integers(0, 256, (num_pages, PAGE_SIZE), dtype=np.uint8)
    eng = engine.create("gpu", pool_size=1, kernel="sliced", load_chunk_bytes=2 << 20)
    shard = eng.load(pages, first_page)
    try:
        got = shard._pages_dev.get().view("<u4")
        np.testing.assert_array_equal(got, sliced.slice_pages(pages, first_page))
    finally:
        shard.close()


@pytest.mark.parametrize("d,num_pages,first_page", [(1, 2, 0), (3, 5, 2), (7, 100, 20),
                                                    (8, 256, 0), (9, 300, 200)])
def test_sliced_small_domains(d, num_pages, first_page):
    """Domains under one chunk (d < 8): fewer leaves than the chunk has pages."""
    rng = np.random.default_rng(d)
    pages = rng.integers(0, 256, (num_pages, PAGE_SIZE), dtype=np.uint8)
    eng = engine.create("gpu", pool_size=1, kernel="sliced")
    shard = eng.load(pages, first_page)
    try:
        for q in (1, 3, 9, 17):
            keys = [dpf.generate_keys(d, int(rng.integers(first_page, first_page + num_pages)))[
                int(rng.integers(2))] for _ in range(q)]
            want = ReferenceEngine().load(pages, first_page).scan(keys)
            np.testing.assert_array_equal(shard.scan(keys), want)
    finally:
        shard.close()


def test_compile_error_is_a_gpu_error():
    from morphogen.engine import gpu_backend, gpu_errors, gpu_kernels

    backend = gpu_backend.CupyBackend(0)
    with pytest.raises(gpu_errors.GpuError):
        with gpu_errors.cuda_errors(backend, "compiling"):
            backend.compile("this is not CUDA", gpu_kernels.COMPILE_OPTIONS, ("nothing",))
