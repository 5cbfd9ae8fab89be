"""Table scans on a GPU shard's device copy, through the real .cu program compiled as host C++
(tests/unit/cuda_emu): sliced_table_kernel.cu at every offset and size class against the
reference engine over exactly the table's pages.

A table starts anywhere in the sliced layout's 256-page chunks (shift 0, odd, even, 255), lies
inside one chunk, straddles several, or ends at the shard's end; a shard may hold only part of
it (its keys then start at a leaf past 0). Every case runs each key count class of the table
kernels (n1, n2 with prefetch, n2 without) and several page blocks, so a block's first chunk
(which expands the subtree before it) and the chunks after it both run.
"""

from __future__ import annotations

import numpy as np
import pytest
from _gpu_fakes import FakeBackend, emulator_compiler, make_engine

from morphogen.constants import PAGE_SIZE
from morphogen.engine import sliced
from morphogen.engine.reference import ReferenceEngine
from morphogen.protocol import dpf
from morphogen.snapshot.layout import domain_bits_for

pytestmark = pytest.mark.skipif(
    emulator_compiler() is None, reason="no C++ compiler to build the kernel emulator"
)

SHARD_FIRST = 3 * 256 + 100  # the shard itself starts mid-chunk
SHARD_PAGES = 1400


@pytest.fixture(scope="module")
def world():
    rng = np.random.default_rng(41)
    pages = rng.integers(0, 256, (SHARD_PAGES, PAGE_SIZE), dtype=np.uint8)
    backend = FakeBackend(mode="emulator", sm_count=2, blocks_per_sm_value=1)
    engine = make_engine(backend, kernel="sliced", pool_size=1, max_keys=48)
    shard = engine.load(pages, SHARD_FIRST)
    yield pages, shard, backend
    shard.close()


def keys_for(rng, d, n, count):
    return [dpf.generate_keys(d, int(rng.integers(0, n)))[int(rng.integers(0, 2))]
            for _ in range(count)]


# (table's first page, table pages, the part this shard scans: (first, stop) global or None,
#  key counts: 3 runs the n1 kernel, 12 n2 with prefetch, 40 n2 in three key groups)
EVERY_KERNEL = (3, 12, 40)
CASES = [
    (SHARD_FIRST, 1, None, (3,)),  # one page at the shard's start, domain 2^1
    (1024, 30, None, (3,)),  # shift 0, inside one chunk
    (1024 + 7, 200, None, (3,)),  # odd shift, inside one chunk
    (1024 + 100, 300, None, EVERY_KERNEL),  # even shift, straddling two chunks
    (1024 + 255, 2, None, (3,)),  # shift 255: its two pages in two chunks
    (1024 + 33, 900, None, (3,)),  # several chunks, several page blocks
    (SHARD_FIRST + SHARD_PAGES - 77, 77, None, (3,)),  # ends at the shard's end
    (500, 2000, (SHARD_FIRST, SHARD_FIRST + 700), EVERY_KERNEL),  # a shard's part of a table
    (SHARD_FIRST + 1001, 5000, (SHARD_FIRST + 1001, SHARD_FIRST + SHARD_PAGES), (3,)),
]


@pytest.mark.parametrize("table_first,table_pages,part,counts", CASES)
def test_table_scan_matches_reference(world, table_first, table_pages, part, counts):
    pages, shard, backend = world
    lo, hi = part or (table_first, table_first + table_pages)
    rng = np.random.default_rng(table_first * 31 + table_pages)
    d = domain_bits_for(table_pages)
    scanner = shard.table_scanner(lo, hi - lo, lo - table_first)
    ref = ReferenceEngine().load(pages[lo - SHARD_FIRST : hi - SHARD_FIRST], lo - table_first)
    used = set()
    for count in counts:
        keys = keys_for(rng, d, table_pages, count)
        np.testing.assert_array_equal(scanner.scan(keys), ref.scan(keys))
        used.add(backend.launches[-2].kernel)
    if counts == EVERY_KERNEL:
        assert used == set(sliced.TABLE_KERNELS)


def test_pir_roundtrip_over_a_shifted_table(world):
    """Both parties' answers XOR to the page asked, at each edge of a shifted table."""
    pages, shard, _ = world
    first, n = 1024 + 129, 400
    scanner = shard.table_scanner(first, n, 0)
    d = domain_bits_for(n)
    for target in (0, 126, 127, 255, 256, n - 1):
        k0, k1 = dpf.generate_keys(d, target)
        got = scanner.scan([k0]) ^ scanner.scan([k1])
        np.testing.assert_array_equal(got[0], pages[first - SHARD_FIRST + target])


def test_thread_order_does_not_change_a_table_answer():
    """Threads resumed in reverse and shuffled order at every barrier: an answer that changes
    is an intra-block race (a missing barrier around the two mask buffers)."""
    rng = np.random.default_rng(7)
    pages = rng.integers(0, 256, (300, PAGE_SIZE), dtype=np.uint8)
    keys = keys_for(rng, 8, 200, 3)
    want = ReferenceEngine().load(pages[50:250], 0).scan(keys)
    for order in (1, 2):  # reversed, shuffled (forward: every other test)
        backend = FakeBackend(mode="emulator", sm_count=1, blocks_per_sm_value=2, order=order)
        shard = make_engine(backend, kernel="sliced", pool_size=1, max_keys=3).load(pages, 200)
        try:
            np.testing.assert_array_equal(shard.table_scanner(250, 200, 0).scan(keys), want)
        finally:
            shard.close()


def test_table_scanner_refuses_a_range_outside_the_shard(world):
    _, shard, _ = world
    with pytest.raises(ValueError):
        shard.table_scanner(SHARD_FIRST - 1, 10, 0)
    with pytest.raises(ValueError):
        shard.table_scanner(SHARD_FIRST + SHARD_PAGES - 5, 10, 0)
    with pytest.raises(ValueError):
        shard.table_scanner(SHARD_FIRST, 10, SHARD_FIRST + 1)


def test_every_page_of_a_straddling_table_is_retrieved(world):
    """A 40-page table across a chunk boundary (shift 230): each of its pages, both parties'
    answers XORed, is that page."""
    pages, shard, _ = world
    first, n = 1024 + 230, 40
    scanner = shard.table_scanner(first, n, 0)
    pairs = [dpf.generate_keys(domain_bits_for(n), t) for t in range(n)]
    a = scanner.scan([p[0] for p in pairs])
    b = scanner.scan([p[1] for p in pairs])
    np.testing.assert_array_equal(a ^ b, pages[first - SHARD_FIRST : first - SHARD_FIRST + n])
