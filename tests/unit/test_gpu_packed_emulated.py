"""Packed keys on a GPU shard, through the real .cu program compiled as host C++
(tests/unit/cuda_emu): the packed scan kernels of both layouts (packed_scan_kernel.cu,
sliced_packed_kernel.cu) against the reference engine, page range for page range, at every
offset and size class.

Whole shards starting at a leaf boundary, inside a leaf and mid-chunk, of one page (a domain of
2^1: the root is the only leaf) up to several leaf tiles; table ranges inside a leaf, straddling
leaves and chunks, ending at the shard's end, and a shard's part of a larger table (its keys
start past leaf 0). Each with 1, 3, 24 and 96 keys, which between them run every kernel
variant of each layout (fused: key groups of 1, 3, 12 and 16; sliced: n1, n2 with prefetch,
n2); several page blocks so a block's first tile or chunk (a whole path walk) and the ones
after it (the cached path) both run.
"""

from __future__ import annotations

import numpy as np
import pytest
from _gpu_fakes import FakeBackend, emulator_compiler, make_engine

from morphogen.constants import KEY_FORMATS, PAGE_SIZE
from morphogen.engine import sliced
from morphogen.engine.base import key_formats
from morphogen.engine.reference import ReferenceEngine
from morphogen.protocol.packed import PackedKeyBatch, generate_packed_keys
from morphogen.snapshot.layout import domain_bits_for

pytestmark = pytest.mark.skipif(
    emulator_compiler() is None, reason="no C++ compiler to build the kernel emulator"
)

SHARD_FIRST = 3 * 256 + 100  # mid-chunk and mid-leaf
SHARD_PAGES = 1400
KEY_COUNTS = (1, 3, 24, 96)


def packed_batch(rng, d, n, count):
    keys = [generate_packed_keys(d, int(rng.integers(0, n)))[int(rng.integers(0, 2))]
            for _ in range(count)]
    return PackedKeyBatch.from_keys(keys)


@pytest.fixture(scope="module")
def pages():
    return np.random.default_rng(45).integers(0, 256, (SHARD_PAGES, PAGE_SIZE), dtype=np.uint8)


LAYOUTS = ("fused", "sliced")
KERNELS = {
    "fused": {"morphogen_packed_k1", "morphogen_packed_k3", "morphogen_packed_k12",
              "morphogen_packed_k16"},
    "sliced": set(sliced.SLICED_PACKED_KERNELS),
}


@pytest.fixture(scope="module", params=LAYOUTS)
def world(request, pages):
    backend = FakeBackend(mode="emulator", sm_count=2, blocks_per_sm_value=2)
    engine = make_engine(backend, kernel=request.param, pool_size=1, max_keys=96)
    shard = engine.load(pages, SHARD_FIRST)
    yield engine, shard, backend
    shard.close()


def test_both_layouts_advertise_packed_keys(world):
    engine, _, _ = world
    assert key_formats(engine) == KEY_FORMATS


def test_whole_shard_matches_reference(world, pages):
    engine, shard, backend = world
    rng = np.random.default_rng(1)
    d = domain_bits_for(SHARD_FIRST + SHARD_PAGES)
    ref = ReferenceEngine().load(pages, SHARD_FIRST)
    used = set()
    for count in KEY_COUNTS:
        batch = packed_batch(rng, d, SHARD_FIRST + SHARD_PAGES, count)
        np.testing.assert_array_equal(shard.scan(batch), ref.scan(batch))
        used.add(backend.launches[-2].kernel)
    assert used == KERNELS[engine.layout]


# (shard's first page, pages): aligned to a leaf, inside one leaf, one page at page 0 (levels 0),
# across many leaf tiles, and a domain just above 2^7
SHARDS = [(0, 1), (128, 128), (5, 100), (1000, 3000), (0, 129), (383, 300)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("first,n", SHARDS)
def test_shard_offsets_match_reference(first, n, layout):
    rng = np.random.default_rng(first * 7 + n)
    data = rng.integers(0, 256, (n, PAGE_SIZE), dtype=np.uint8)
    backend = FakeBackend(mode="emulator", sm_count=3, blocks_per_sm_value=1)
    shard = make_engine(backend, kernel=layout, pool_size=1, max_keys=24).load(data, first)
    try:
        d = domain_bits_for(first + n)
        ref = ReferenceEngine().load(data, first)
        # many chunks under emulation are slow: the big shard's sliced case with 3 keys
        counts = (3,) if layout == "sliced" and n > 1000 else (1, 3, 24)
        for count in counts:
            batch = packed_batch(rng, d, first + n, count)
            np.testing.assert_array_equal(shard.scan(batch), ref.scan(batch))
    finally:
        shard.close()


# (table's first page, table pages, the part this shard scans or None, key counts)
CASES = [
    (SHARD_FIRST, 1, None, (1, 3)),  # one page at the shard's start: levels 0
    (1024, 30, None, (3,)),  # inside one leaf, leaf-aligned
    (1024 + 7, 200, None, (3, 24)),  # straddling two leaves
    (1024 + 100, 300, None, KEY_COUNTS),  # straddling leaves and a chunk
    (1024 + 127, 2, None, (1,)),  # its two pages in two leaves
    (1024 + 33, 900, None, (3,)),  # several leaf tiles, several page blocks
    (SHARD_FIRST + SHARD_PAGES - 77, 77, None, (3, 96)),  # ends at the shard's end
    (500, 2000, (SHARD_FIRST, SHARD_FIRST + 700), KEY_COUNTS),  # a shard's part of a table
    (SHARD_FIRST + 1001, 5000, (SHARD_FIRST + 1001, SHARD_FIRST + SHARD_PAGES), (3,)),
]


@pytest.mark.parametrize("table_first,table_pages,part,counts", CASES)
def test_table_scan_matches_reference(world, pages, table_first, table_pages, part, counts):
    _, shard, _ = world
    lo, hi = part or (table_first, table_first + table_pages)
    rng = np.random.default_rng(table_first * 31 + table_pages)
    d = domain_bits_for(table_pages)
    scanner = shard.table_scanner(lo, hi - lo, lo - table_first)
    ref = ReferenceEngine().load(pages[lo - SHARD_FIRST : hi - SHARD_FIRST], lo - table_first)
    for count in counts:
        batch = packed_batch(rng, d, table_pages, count)
        np.testing.assert_array_equal(scanner.scan(batch), ref.scan(batch))


def test_both_parties_recover_every_edge_page(world, pages):
    """Both parties' answers XOR to the page asked, at each edge of a leaf and of a table."""
    _, shard, _ = world
    first, n = 1024 + 129, 400
    scanner = shard.table_scanner(first, n, 0)
    d = domain_bits_for(n)
    targets = (0, 126, 127, 128, 255, 256, n - 1)
    pairs = [generate_packed_keys(d, t) for t in targets]
    a = scanner.scan(PackedKeyBatch.from_keys([p[0] for p in pairs]))
    b = scanner.scan(PackedKeyBatch.from_keys([p[1] for p in pairs]))
    want = np.stack([pages[first - SHARD_FIRST + t] for t in targets])
    np.testing.assert_array_equal(a ^ b, want)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_thread_order_does_not_change_an_answer(pages, layout):
    """Threads resumed in reverse and shuffled order at every barrier: an answer that changes
    is an intra-block race (a missing barrier between the expansion, the final correction and
    the page loop)."""
    rng = np.random.default_rng(8)
    data = pages[:700]
    batch = packed_batch(rng, 10, 900, 3)
    want = ReferenceEngine().load(data, 200).scan(batch)
    for order in (1, 2):
        backend = FakeBackend(mode="emulator", sm_count=1, blocks_per_sm_value=2, order=order)
        shard = make_engine(backend, kernel=layout, pool_size=1, max_keys=3).load(data, 200)
        try:
            np.testing.assert_array_equal(shard.scan(batch), want)
            table = shard.table_scanner(300, 400, 33)  # a table from page 267, mid-chunk
            tbatch = packed_batch(rng, 9, 433, 3)
            np.testing.assert_array_equal(
                table.scan(tbatch), ReferenceEngine().load(data[100:500], 33).scan(tbatch))
        finally:
            shard.close()


def test_v1_and_packed_scans_interleave(world, pages):
    """A workspace serves either format in turn; each answer is its own format's."""
    from morphogen.protocol import dpf

    _, shard, _ = world
    d = domain_bits_for(SHARD_FIRST + SHARD_PAGES)
    ref = ReferenceEngine().load(pages, SHARD_FIRST)
    rng = np.random.default_rng(3)
    for _ in range(2):
        v1 = [dpf.generate_keys(d, int(rng.integers(0, SHARD_FIRST + SHARD_PAGES)))[0]
              for _ in range(3)]
        packed = packed_batch(rng, d, SHARD_FIRST + SHARD_PAGES, 3)
        np.testing.assert_array_equal(shard.scan(v1), ref.scan(v1))
        np.testing.assert_array_equal(shard.scan(packed), ref.scan(packed))
