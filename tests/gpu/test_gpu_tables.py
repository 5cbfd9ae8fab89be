"""Tables and page writes on a real device: sliced_table_kernel.cu and patch_kernel.cu against
the reference engine (the same cases the CPU emulation runs in tests/unit, larger)."""

from __future__ import annotations

import numpy as np
import pytest

from morphogen import engine
from morphogen.constants import PAGE_SIZE
from morphogen.engine import gpu_available, sliced
from morphogen.engine.reference import ReferenceEngine
from morphogen.protocol import dpf
from morphogen.snapshot.layout import domain_bits_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device"),
]

FIRST, N = 3 * 256 + 100, 6000


@pytest.fixture(scope="module", params=["fused", "sliced"])
def loaded(request):
    rng = np.random.default_rng(11)
    pages = rng.integers(0, 256, (N, PAGE_SIZE), dtype=np.uint8)
    shard = engine.create("gpu", pool_size=2, kernel=request.param).load(pages, FIRST)
    yield shard, pages
    shard.close()


@pytest.mark.parametrize("table_first,table_pages,part", [
    (FIRST, 1, None), (1024, 30, None), (1024 + 7, 200, None), (1024 + 100, 300, None),
    (1024 + 255, 2, None), (1024 + 33, 4000, None), (FIRST + N - 77, 77, None),
    (500, 9000, (FIRST, FIRST + 3000)),
])
@pytest.mark.parametrize("keys", [3, 24, 100])
def test_table_scans_match_reference(loaded, table_first, table_pages, part, keys):
    shard, pages = loaded
    lo, hi = part or (table_first, table_first + table_pages)
    rng = np.random.default_rng(table_first + keys)
    d = domain_bits_for(table_pages)
    batch = [dpf.generate_keys(d, int(t))[int(rng.integers(2))]
             for t in rng.integers(0, table_pages, keys)]
    want = ReferenceEngine().load(pages[lo - FIRST : hi - FIRST], lo - table_first).scan(batch)
    got = shard.table_scanner(lo, hi - lo, lo - table_first).scan(batch)
    np.testing.assert_array_equal(got, want)


def test_writes_then_scans_match_reference():
    rng = np.random.default_rng(12)
    pages = rng.integers(0, 256, (N, PAGE_SIZE), dtype=np.uint8)
    shard = engine.create("gpu", pool_size=2, kernel="sliced").load(pages, FIRST)
    try:
        for step in range(3):
            where = np.unique(rng.integers(FIRST, FIRST + N, 500))
            diffs = rng.integers(0, 256, (where.size, PAGE_SIZE), dtype=np.uint8)
            assert shard.write_pages(where, diffs) == step + 1
            pages[where - FIRST] ^= diffs
        keys = [dpf.generate_keys(13, int(t))[0] for t in where[:24]]
        np.testing.assert_array_equal(shard.scan(keys), ReferenceEngine().load(pages, FIRST)
                                      .scan(keys))
        # the device copy is the layout of the written pages, every byte
        import cupy

        got = cupy.asnumpy(shard._pages_dev)
        np.testing.assert_array_equal(got, sliced.slice_pages(pages, FIRST).view(np.uint8))
    finally:
        shard.close()
