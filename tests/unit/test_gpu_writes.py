"""Page updates written into a GPU shard's device copy (GpuShard.write_pages, patch_kernel.cu).

The kernels run through the CUDA emulation (tests/unit/cuda_emu): after a write the whole
device buffer must equal the layout of the updated pages (every page compared, and the zero
padding outside the shard left alone), at every offset that matters to the sliced layout (the
four K-word quarters, both parities, the ends of a chunk, the shard's first and last page,
several pages sharing a chunk's words, one page written twice in one call), and scans and table
scans afterwards must match the reference engine. The ordering of writes and scans runs on the
CuPy fakes' model with a slow launch: a scan in flight answers on the data it started on.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _gpu_fakes import FakeBackend, emulator_compiler, make_engine

from morphogen.constants import PAGE_SIZE
from morphogen.engine import sliced
from morphogen.engine.reference import ReferenceEngine
from morphogen.protocol import dpf

FIRST, N = 2 * 256 + 200, 700  # a shard starting mid-chunk, over four chunks


def offsets():
    """Global pages at every kind of offset: chunk positions 0, 1, 2, 63, 64, 65, 127, 128,
    254, 255 of each chunk the shard spans, its first and last page."""
    out = {FIRST, FIRST + N - 1}
    for chunk in range(FIRST // 256, (FIRST + N - 1) // 256 + 1):
        for p in (0, 1, 2, 63, 64, 65, 127, 128, 254, 255):
            page = chunk * 256 + p
            if FIRST <= page < FIRST + N:
                out.add(page)
    return sorted(out)


def device_bytes(shard):
    return shard._pages_dev.buf


@pytest.mark.skipif(emulator_compiler() is None, reason="no C++ compiler for the emulator")
@pytest.mark.parametrize("kernel", ["sliced", "fused"])
def test_writes_at_every_offset_match_the_layout_of_the_new_pages(kernel):
    rng = np.random.default_rng(3)
    pages = rng.integers(0, 256, (N, PAGE_SIZE), dtype=np.uint8)
    backend = FakeBackend(mode="emulator", sm_count=1, blocks_per_sm_value=2)
    shard = make_engine(backend, kernel=kernel, pool_size=1, max_keys=3).load(pages, FIRST)
    try:
        targets = offsets()
        # one page twice in the call: its diffs merge
        where = np.array(targets + [targets[3]])
        diffs = rng.integers(0, 256, (where.size, PAGE_SIZE), dtype=np.uint8)
        diffs[0, :100] = 0  # sparse diffs flip only their set bits
        assert shard.write_pages(where, diffs) == 1
        for w, diff in zip(where, diffs, strict=True):
            pages[w - FIRST] ^= diff
        if kernel == "sliced":
            want = sliced.slice_pages(pages, FIRST).view(np.uint8)
        else:
            want = pages.reshape(-1)
        np.testing.assert_array_equal(device_bytes(shard)[: want.size], want)
        keys = [dpf.generate_keys(11, int(t))[0] for t in rng.choice(targets, 3)]
        np.testing.assert_array_equal(shard.scan(keys), ReferenceEngine().load(pages, FIRST)
                                      .scan(keys))
        lo, n = FIRST + 77, 300  # a table over written pages, starting mid-chunk
        tkeys = [dpf.generate_keys(9, int(t))[0] for t in rng.integers(0, n, 3)]
        np.testing.assert_array_equal(
            shard.table_scanner(lo, n, 0).scan(tkeys),
            ReferenceEngine().load(pages[lo - FIRST : lo - FIRST + n], 0).scan(tkeys))
    finally:
        shard.close()


def test_a_scan_in_flight_answers_on_the_data_it_started_on():
    rng = np.random.default_rng(4)
    pages = rng.integers(0, 256, (N, PAGE_SIZE), dtype=np.uint8)
    backend = FakeBackend(mode="model")
    shard = make_engine(backend, kernel="sliced", pool_size=2, max_keys=3).load(pages, FIRST)
    key, _ = dpf.generate_keys(11, FIRST + 5)
    before = ReferenceEngine().load(pages, FIRST).scan([key])
    diff = rng.integers(0, 256, (1, PAGE_SIZE), dtype=np.uint8)
    after_pages = pages.copy()
    after_pages[5] ^= diff[0]
    after = ReferenceEngine().load(after_pages, FIRST).scan([key])
    started = threading.Event()
    real_launch = backend.launch

    def slow_launch(kernel, *args):
        if kernel.name in sliced.SLICED_KERNELS:
            started.set()
            writer.start()  # the write is asked for while this scan's launch runs
            assert not done.wait(0.3)  # and waits for it
        return real_launch(kernel, *args)

    done = threading.Event()
    written: list[int] = []
    writer = threading.Thread(target=lambda: (written.append(shard.write_pages([FIRST + 5],
                                                                              diff)), done.set()))
    backend.launch = slow_launch
    try:
        got, timings = shard.scan_timed([key])
        assert started.is_set() and timings.generation == 0
        np.testing.assert_array_equal(got, before)
        writer.join(10)
        assert done.is_set() and written == [1]
        backend.launch = real_launch
        got, timings = shard.scan_timed([key])
        assert timings.generation == 1
        np.testing.assert_array_equal(got, after)
    finally:
        backend.launch = real_launch
        shard.close()


def test_writes_outside_the_shard_or_misshapen_are_refused():
    pages = np.zeros((N, PAGE_SIZE), np.uint8)
    shard = make_engine(FakeBackend(), kernel="sliced").load(pages, FIRST)
    try:
        with pytest.raises(ValueError):
            shard.write_pages([FIRST - 1], np.zeros((1, PAGE_SIZE), np.uint8))
        with pytest.raises(ValueError):
            shard.write_pages([FIRST + N], np.zeros((1, PAGE_SIZE), np.uint8))
        with pytest.raises(ValueError):
            shard.write_pages([FIRST, FIRST + 1], np.zeros((1, PAGE_SIZE), np.uint8))
        assert shard.generation == 0 and not device_bytes(shard)[: N * PAGE_SIZE].any()
    finally:
        shard.close()
