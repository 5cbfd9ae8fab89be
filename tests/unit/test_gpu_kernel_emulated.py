"""The real scan_kernel.cu, compiled as host C++ (tests/unit/cuda_emu), against the oracle.

No GPU needed: every CUDA thread is a fiber, __syncthreads a real barrier, shared memory and
device buffers start poisoned. Each case also runs with the threads of every barrier phase in
reverse and shuffled order; an answer that depends on that order is an intra-block race.
What this cannot see: timing, concurrency, occupancy, and device-only faults (an out-of-bounds
access lands in host memory here); tests/gpu covers those on a device.
"""

from __future__ import annotations

import numpy as np
import pytest
from _gpu_fakes import (
    FakeBackend,
    FakeDeviceArray,
    emulated_prg,
    emulator_compiler,
    load_emulator,
    make_engine,
    run_emulated,
)

from morphogen.constants import PAGE_SIZE
from morphogen.engine.gpu_kernels import READ_BW_KERNEL, READ_BW_THREADS
from morphogen.engine.gpu_keys import pack_keys
from morphogen.engine.gpu_plan import (
    LANES_PER_PAGE,
    REDUCE_KERNEL,
    REDUCE_LANES,
    REDUCE_SLICES,
    SCAN_THREADS,
    plan_launch,
)
from morphogen.engine.reference import ReferenceEngine
from morphogen.protocol import dpf, prg
from morphogen.protocol.dpf import KeyBatch

pytestmark = pytest.mark.skipif(
    emulator_compiler() is None, reason="no C++ compiler to build the kernel emulator"
)


@pytest.fixture(scope="module")
def emu():
    return load_emulator()


def poisoned(nbytes, value=0xCD):
    buf = np.empty(max(nbytes, 16), np.uint8)
    buf[:] = value
    return FakeDeviceArray(buf)


def emulated_scan(emu, pages, first_page, keys, *, key_group_max=16, page_blocks=None,
                  order=0):
    """One scan launch + one reduce launch, geometry from gpu_plan.plan_launch, as GpuShard
    does."""
    batch = keys if isinstance(keys, KeyBatch) else KeyBatch.from_keys(keys)
    k, n, d = len(batch), pages.shape[0], batch.domain_bits
    plan = plan_launch(k, n, d, sm_count=2, blocks_per_sm=lambda name, smem: 2,
                       key_group_max=key_group_max, page_blocks=page_blocks)
    pages_dev = FakeDeviceArray(np.ascontiguousarray(pages).reshape(-1))
    keys_dev = FakeDeviceArray(pack_keys(batch).reshape(-1).view(np.uint8).copy())
    partial = poisoned(plan.partial_bytes + PAGE_SIZE, 0xAB)
    out = poisoned(k * PAGE_SIZE, 0xCD)
    args = (pages_dev, np.uint64(n), np.uint64(first_page), keys_dev, np.uint32(k),
            np.uint32(d), np.uint32(plan.tile_bits), np.uint32(plan.num_groups), partial)
    run_emulated(emu, plan.kernel, plan.grid, SCAN_THREADS, args, plan.smem_bytes, order)
    run_emulated(emu, REDUCE_KERNEL, plan.reduce_grid, REDUCE_LANES * REDUCE_SLICES,
                 (partial, out, np.uint32(plan.page_blocks), np.uint32(k * LANES_PER_PAGE)),
                 0, order)
    assert (out.buf[k * PAGE_SIZE :] == 0xCD).all()  # nothing written past the answer
    assert (partial.buf[plan.partial_bytes :] == 0xAB).all()  # nor past the partial rows
    return out.buf[: k * PAGE_SIZE].reshape(k, PAGE_SIZE).copy(), plan


def random_keys(rng, d, n):
    return [dpf.generate_keys(d, int(rng.integers(0, 1 << d)))[int(rng.integers(0, 2))]
            for _ in range(n)]


def test_prg_known_answers(emu):
    left, right, tl, tr = emulated_prg(emu, bytes(16))
    assert left.hex() == "3e00ef2f895f40d67f5bb8e81f09a5a1"
    assert right.hex() == "2c840ec3ce9a7f3b181be188ef711a1e"
    assert (tl, tr) == (0, 0)
    left, right, tl, tr = emulated_prg(emu, bytes(range(16)))
    assert left.hex() == "5cd42678f7d0ce4acbc573af6a2eea6b"
    assert right.hex() == "b34ba37416497417a183cc5bcfb96027"
    assert (tl, tr) == (0, 1)
    rng = np.random.default_rng(0)
    for _ in range(50):
        seed = rng.bytes(16)
        assert emulated_prg(emu, seed) == prg.expand(seed)


def test_protocol_worked_example(emu):
    k0, k1 = dpf.generate_keys(4, 5, seeds=(bytes(range(16)), bytes(range(16, 32))))
    i, j = np.meshgrid(np.arange(16), np.arange(PAGE_SIZE), indexing="ij")
    pages = ((31 * i + j) & 0xFF).astype(np.uint8)
    a, _ = emulated_scan(emu, pages, 0, [k0])
    b, _ = emulated_scan(emu, pages, 0, [k1])
    assert a[0, :32].tobytes().hex() == (
        "f0ba319f19a530567f651face14a6f60" "20ca317f09a5f0361ff50f5ce10a7f60"
    )
    np.testing.assert_array_equal(a[0] ^ b[0], pages[5])


# (num_pages, first_page, domain_bits, num_keys, key_group_max, page_blocks)
CASES = [
    (1, 0, 1, 1, 16, None),  # one page, the smallest domain: tile = whole tree
    (2, 0, 1, 3, 16, None),
    (3, 1, 2, 2, 16, 5),  # more page blocks than pages: empty blocks still write zeros
    (37, 0, 6, 3, 16, None),
    (100, 28, 7, 4, 16, 3),  # shard offset, tiles cut at both ends
    (300, 5, 9, 6, 16, 4),
    (513, 511, 11, 8, 16, 2),  # one page before a tile edge, then a whole tile and more
    (700, 1000, 12, 12, 16, 3),
    (1000, 1234, 12, 16, 16, 4),
    (333, 0, 10, 17, 16, 2),  # two key groups, the last one padded
    (250, 3, 8, 33, 8, 2),  # five groups of 8 (k8), padding in the last
    (200, 40, 9, 7, 4, 3),  # two groups of k4
    (150, 0, 8, 5, 2, 2),  # three groups of k2
    (90, 9, 7, 2, 1, 2),  # k1, two groups
    (300, (1 << 32) - 300, 32, 3, 16, 2),  # the top of a 32-bit domain
    (70, (1 << 25) - 1000, 25, 4, 16, None),  # d=25 as served, deep tile-root path
]


@pytest.mark.parametrize("n,first,d,k,kg_max,blocks", CASES)
def test_kernel_matches_reference(emu, n, first, d, k, kg_max, blocks):
    rng = np.random.default_rng(n * 7919 + k)
    pages = rng.integers(0, 256, (n, PAGE_SIZE), dtype=np.uint8)
    keys = random_keys(rng, d, k)
    want = ReferenceEngine().load(pages, first).scan(keys)
    got, plan = emulated_scan(emu, pages, first, keys, key_group_max=kg_max, page_blocks=blocks)
    np.testing.assert_array_equal(got, want)
    assert plan.key_group <= kg_max


@pytest.mark.parametrize("order", [1, 2])
def test_answer_does_not_depend_on_thread_order(emu, order):
    rng = np.random.default_rng(order)
    n, first, d = 400, 100, 10
    pages = rng.integers(0, 256, (n, PAGE_SIZE), dtype=np.uint8)
    keys = random_keys(rng, d, 10)
    want = ReferenceEngine().load(pages, first).scan(keys)
    got, _ = emulated_scan(emu, pages, first, keys, key_group_max=8, page_blocks=3, order=order)
    np.testing.assert_array_equal(got, want)


def test_every_variant_through_the_engine(emu):
    """GpuShard end to end on the emulator: 1..32 queries of 3 keys, an offset shard."""
    rng = np.random.default_rng(42)
    n, first, d = 200, 56, 9
    pages = rng.integers(0, 256, (n, PAGE_SIZE), dtype=np.uint8)
    backend = FakeBackend(mode="emulator", sm_count=2)
    shard = make_engine(backend, pool_size=2).load(pages, first)
    ref = ReferenceEngine().load(pages, first)
    used = set()
    for queries in (1, 2, 4, 8, 16, 32):
        keys = random_keys(rng, d, 3 * queries)
        np.testing.assert_array_equal(shard.scan(keys), ref.scan(keys))
        used.add(backend.launches[-2].kernel)
    assert len(used) >= 4


def test_pir_roundtrip_through_the_engine(emu):
    """Both parties' answers XOR to the target page, across a two-shard split."""
    rng = np.random.default_rng(5)
    n, d = 150, 8
    pages = rng.integers(0, 256, (n, PAGE_SIZE), dtype=np.uint8)
    engine = make_engine(FakeBackend(mode="emulator", sm_count=2), pool_size=1)
    shards = [engine.load(pages[:70], 0), engine.load(pages[70:], 70)]
    for target in (0, 69, 70, 149):
        k0, k1 = dpf.generate_keys(d, target)
        a = shards[0].scan([k0]) ^ shards[1].scan([k0])
        b = shards[0].scan([k1]) ^ shards[1].scan([k1])
        np.testing.assert_array_equal((a ^ b)[0], pages[target])


def test_reduce_overwrites_poisoned_output(emu):
    rng = np.random.default_rng(6)
    parts, k = 37, 5
    partial = rng.integers(0, 256, (parts, k * PAGE_SIZE), dtype=np.uint8)
    out = poisoned(k * PAGE_SIZE + 64, 0xEE)
    grid = -(-k * LANES_PER_PAGE // REDUCE_LANES)
    run_emulated(emu, REDUCE_KERNEL, grid, REDUCE_LANES * REDUCE_SLICES,
                 (FakeDeviceArray(partial.reshape(-1)), out, np.uint32(parts),
                  np.uint32(k * LANES_PER_PAGE)), 0)
    np.testing.assert_array_equal(out.buf[: k * PAGE_SIZE], np.bitwise_xor.reduce(partial, 0))
    assert (out.buf[k * PAGE_SIZE :] == 0xEE).all()


def test_read_bandwidth_kernel_checksum(emu):
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 16 * 5000, dtype=np.uint8)
    grid = 3
    sink = poisoned(grid * READ_BW_THREADS * 16)
    run_emulated(emu, READ_BW_KERNEL, grid, READ_BW_THREADS,
                 (FakeDeviceArray(data), np.uint64(5000), sink), 0)
    folded = np.bitwise_xor.reduce(sink.buf.view(np.uint64).reshape(-1, 2), axis=0)
    np.testing.assert_array_equal(folded, np.bitwise_xor.reduce(data.view(np.uint64).reshape(-1, 2),
                                                                axis=0))


@pytest.mark.parametrize("n,first,d,count", [(300, 100, 10, 3), (600, 256, 10, 12)])
def test_sliced_kernel_matches_reference(n, first, d, count):
    """The tensor-core scan (sliced_scan_kernel.cu: the slicing at load, the leaf transposes,
    the MMAs, emulated as warp collectives) through GpuShard, against the oracle."""
    rng = np.random.default_rng(n + count)
    pages = rng.integers(0, 256, (n, PAGE_SIZE), dtype=np.uint8)
    backend = FakeBackend(mode="emulator", sm_count=1, blocks_per_sm_value=2)
    shard = make_engine(backend, kernel="sliced", pool_size=1, max_keys=count).load(pages, first)
    try:
        keys = [dpf.generate_keys(d, int(rng.integers(first, first + n)))[0]
                for _ in range(count)]
        np.testing.assert_array_equal(shard.scan(keys), ReferenceEngine().load(pages, first)
                                      .scan(keys))
    finally:
        shard.close()
