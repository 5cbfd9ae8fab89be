"""The bit-sliced layout of the tensor-core scan and the engine's sliced path, without a GPU.

`sliced.slice_chunk` is the layout's reference; here it is checked bit by bit against its
definition, inverted, and used by the fake backend's models of morphogen_slice_pages and the
sliced scan, so the host side (batched upload through staging buffers, chunk alignment at shard
offsets, launch planning, argument types, the read digest) runs end to end against the
reference engine. The kernels themselves run in tests/gpu.
"""

from __future__ import annotations

import numpy as np
import pytest
from _gpu_fakes import FakeBackend, make_engine, unslice_chunk

from morphogen.constants import PAGE_SIZE
from morphogen.engine import sliced
from morphogen.engine.gpu import GpuEngine
from morphogen.engine.reference import ReferenceEngine
from morphogen.protocol import dpf


def random_pages(rng, n):
    return rng.integers(0, 256, (n, PAGE_SIZE), dtype=np.uint8)


def random_keys(rng, d, lo, hi, n):
    return [dpf.generate_keys(d, int(rng.integers(lo, hi)))[int(rng.integers(0, 2))]
            for _ in range(n)]


def test_chunk_page_order_is_a_permutation_in_leaf_order():
    order = sliced.chunk_page_order()
    assert sorted(order) == list(range(256))
    # K-word 2q holds the left children (even pages), 2q + 1 the right ones, of nodes 32q + j
    for q in range(4):
        assert list(order[64 * q : 64 * q + 32]) == [64 * q + 2 * j for j in range(32)]
        assert list(order[64 * q + 32 : 64 * q + 64]) == [64 * q + 2 * j + 1 for j in range(32)]


def test_slice_chunk_places_every_bit_where_the_kernel_reads_it():
    rng = np.random.default_rng(0)
    chunk = random_pages(rng, 256)
    words = sliced.slice_chunk(chunk)
    assert words.shape == (sliced.SLICE_BYTES // 4,)
    order = sliced.chunk_page_order()
    lanes = chunk.view("<u4").reshape(256, 256, 4)
    for _ in range(3000):
        b, grp, g, tig, r, j = (int(rng.integers(m)) for m in (128, 16, 8, 4, 4, 32))
        word = int(words[((b * 16 + grp) * 32 + 4 * g + tig) * 4 + r])
        lane = 16 * grp + g + 8 * (r & 1)
        page = order[32 * (tig + 4 * (r >> 1)) + j]
        assert (word >> j) & 1 == (int(lanes[page, lane, b // 32]) >> (b % 32)) & 1


def test_unslice_inverts_slice():
    rng = np.random.default_rng(1)
    chunk = random_pages(rng, 256)
    np.testing.assert_array_equal(unslice_chunk(sliced.slice_chunk(chunk)), chunk)


@pytest.mark.parametrize("n,first", [(1, 0), (3, 5), (256, 0), (300, 100), (700, 123),
                                     (257, 255), (1000, 1 << 20)])
def test_chunks_are_global_aligned_and_zero_outside_the_shard(n, first):
    rng = np.random.default_rng(n)
    pages = random_pages(rng, n)
    c0, count = sliced.chunk_range(first, n)
    assert c0 == first // 256 and (c0 + count) * 256 >= first + n > (c0 + count - 1) * 256
    natural = sliced.natural_chunks(pages, first).reshape(-1, PAGE_SIZE)
    at = first - c0 * 256
    np.testing.assert_array_equal(natural[at : at + n], pages)
    assert not natural[:at].any() and not natural[at + n :].any()
    words = sliced.slice_pages(pages, first)
    digest = np.bitwise_xor.reduce(words.reshape(-1, 4), axis=0).astype("<u4").tobytes()
    assert sliced.sliced_digest(pages, first, step_chunks=1) == digest


def test_plan_splits_keys_evenly_and_fills_one_wave():
    def occ(name, smem):
        nt = int(name.removeprefix("morphogen_sliced_scan_n").removesuffix("_prefetch"))
        assert smem == sliced.sliced_smem_bytes(nt)
        return 2

    p = sliced.plan_sliced_launch(3, 10_000, 22, sm_count=132, blocks_per_sm=occ)
    assert (p.kernel, p.num_groups, p.page_blocks) == ("morphogen_sliced_scan_n1", 1, 264)
    assert not p.prefetch  # groups of 8 keys, two blocks an SM: L2 would not hold the lines
    p = sliced.plan_sliced_launch(24, 10_000, 22, sm_count=132, blocks_per_sm=occ)
    assert (p.n_tiles, p.num_groups, p.page_blocks) == (2, 2, 132)  # 12 + 12 keys
    assert (p.kernel, p.prefetch) == ("morphogen_sliced_scan_n2_prefetch", True)
    p = sliced.plan_sliced_launch(12, 10_000, 22, sm_count=132, blocks_per_sm=occ)
    assert (p.kernel, p.num_groups) == ("morphogen_sliced_scan_n2_prefetch", 1)
    p = sliced.plan_sliced_launch(96, 10_000, 22, sm_count=132, blocks_per_sm=occ)
    assert (p.n_tiles, p.num_groups) == (2, 6)
    assert (p.kernel, p.prefetch) == ("morphogen_sliced_scan_n2", False)  # L2 holds the chunk
    p = sliced.plan_sliced_launch(17, 3, 22, sm_count=132, blocks_per_sm=occ)
    assert (p.n_tiles, p.num_groups, p.page_blocks) == (2, 2, 3)  # no more blocks than chunks
    p = sliced.plan_sliced_launch(5, 10_000, 22, sm_count=132, blocks_per_sm=occ,
                                  max_partial_rows=50)
    assert p.page_blocks == 10 and p.partial_bytes == 50 * PAGE_SIZE
    with pytest.raises(ValueError):
        sliced.plan_sliced_launch(0, 10, 22, sm_count=1, blocks_per_sm=occ)
    with pytest.raises(ValueError):
        sliced.plan_sliced_launch(1, 0, 22, sm_count=1, blocks_per_sm=occ)
    # one block's shared memory: two n2 blocks fit an H100 SM (228 KiB)
    assert 2 * (sliced.sliced_smem_bytes(2) + 1024) <= 228 * 1024


@pytest.mark.parametrize(
    "num_pages,first_page,d,queries",
    [(1, 0, 1, 1), (5, 2, 3, 2), (300, 0, 9, 3), (700, 123, 10, 6), (600, 4000, 13, 11)],
)
def test_sliced_engine_matches_reference(num_pages, first_page, d, queries):
    rng = np.random.default_rng(num_pages + d)
    pages = random_pages(rng, num_pages)
    backend = FakeBackend()
    engine = make_engine(backend, kernel="sliced", load_chunk_bytes=sliced.SLICE_BYTES)
    shard = engine.load(pages, first_page)
    keys = random_keys(rng, d, first_page, first_page + num_pages, 3 * queries)
    try:
        got = shard.scan(keys)
        want = ReferenceEngine().load(pages, first_page).scan(keys)
        np.testing.assert_array_equal(got, want)
        names = {x.kernel for x in backend.launches}
        assert sliced.SLICE_KERNEL in names
        assert names & set(sliced.SLICED_KERNELS)
        # above 48 KiB a kernel must have asked for its shared memory
        for (nt, _), name in zip(sliced.SLICED_VARIANTS, sliced.SLICED_KERNELS, strict=True):
            assert backend.max_dynamic_smem[name] == sliced.sliced_smem_bytes(nt)
    finally:
        shard.close()


def test_sliced_upload_batches_and_read_digest():
    rng = np.random.default_rng(7)
    n, first = 1500, 300  # 7 chunks, uploaded 2 at a time through the two staging slots
    pages = random_pages(rng, n)
    backend = FakeBackend()
    engine = make_engine(backend, kernel="sliced", load_chunk_bytes=2 * sliced.SLICE_BYTES)
    shard = engine.load(pages, first)
    try:
        slices = [x for x in backend.launches if x.kernel == sliced.SLICE_KERNEL]
        assert [int(x.args[1]) for x in slices] == [2, 2, 2, 1]
        _, digest = shard.read_pages_timed()
        assert digest == sliced.sliced_digest(pages, first)
    finally:
        shard.close()


def test_unknown_kernel_rejected(monkeypatch):
    with pytest.raises(ValueError):
        make_engine(FakeBackend(), kernel="tensor")
    monkeypatch.setenv("MORPHOGEN_GPU_KERNEL", "fused")
    assert GpuEngine(backend=FakeBackend()).layout == "fused"
