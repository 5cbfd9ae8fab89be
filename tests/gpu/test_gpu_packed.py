"""Packed keys on a real device: packed_scan_kernel.cu and sliced_packed_kernel.cu against the
reference engine (the cases the CPU emulation runs in tests/unit, larger), whole shards, tables
at any offset, and after page writes into the device copy."""

from __future__ import annotations

import numpy as np
import pytest

from morphogen import engine
from morphogen.constants import KEY_FORMATS, PAGE_SIZE
from morphogen.engine import gpu_available
from morphogen.engine.base import key_formats
from morphogen.engine.reference import ReferenceEngine
from morphogen.protocol.packed import PackedKeyBatch, generate_packed_keys
from morphogen.snapshot.layout import domain_bits_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device"),
]

FIRST, N = 3 * 256 + 100, 6000


def batch(rng, d, n, count):
    return PackedKeyBatch.from_keys(
        [generate_packed_keys(d, int(t))[int(rng.integers(2))] for t in rng.integers(0, n, count)])


@pytest.fixture(scope="module", params=["fused", "sliced"])
def loaded(request):
    rng = np.random.default_rng(45)
    pages = rng.integers(0, 256, (N, PAGE_SIZE), dtype=np.uint8)
    gpu = engine.create("gpu", pool_size=2, kernel=request.param)
    assert key_formats(gpu) == KEY_FORMATS
    shard = gpu.load(pages, FIRST)
    yield shard, pages
    shard.close()


@pytest.mark.parametrize("keys", [1, 3, 24, 96, 100])
def test_whole_shard_matches_reference(loaded, keys):
    shard, pages = loaded
    rng = np.random.default_rng(keys)
    b = batch(rng, domain_bits_for(FIRST + N), FIRST + N, keys)
    np.testing.assert_array_equal(shard.scan(b), ReferenceEngine().load(pages, FIRST).scan(b))


@pytest.mark.parametrize("table_first,table_pages,part", [
    (FIRST, 1, None), (1024, 30, None), (1024 + 7, 200, None), (1024 + 100, 300, None),
    (1024 + 127, 2, None), (1024 + 255, 2, None), (1024 + 33, 4000, None),
    (FIRST + N - 77, 77, None), (500, 9000, (FIRST, FIRST + 3000)),
])
@pytest.mark.parametrize("keys", [1, 3, 24, 96])
def test_table_scans_match_reference(loaded, table_first, table_pages, part, keys):
    shard, pages = loaded
    lo, hi = part or (table_first, table_first + table_pages)
    rng = np.random.default_rng(table_first + keys)
    b = batch(rng, domain_bits_for(table_pages), table_pages, keys)
    want = ReferenceEngine().load(pages[lo - FIRST : hi - FIRST], lo - table_first).scan(b)
    got = shard.table_scanner(lo, hi - lo, lo - table_first).scan(b)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("layout", ["fused", "sliced"])
def test_writes_then_packed_scans_match_reference(layout):
    rng = np.random.default_rng(46)
    pages = rng.integers(0, 256, (N, PAGE_SIZE), dtype=np.uint8)
    shard = engine.create("gpu", pool_size=2, kernel=layout).load(pages, FIRST)
    try:
        for _ in range(2):
            where = np.unique(rng.integers(FIRST, FIRST + N, 500))
            diffs = rng.integers(0, 256, (where.size, PAGE_SIZE), dtype=np.uint8)
            shard.write_pages(where, diffs)
            pages[where - FIRST] ^= diffs
            b = batch(rng, domain_bits_for(FIRST + N), FIRST + N, 24)
            np.testing.assert_array_equal(shard.scan(b),
                                          ReferenceEngine().load(pages, FIRST).scan(b))
    finally:
        shard.close()
