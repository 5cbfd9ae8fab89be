"""Every engine gives the oracle's bytes; shard splits XOR to the whole; bad inputs refused."""

import numpy as np
import pytest

from morphogen import engine
from morphogen.engine import EngineUnavailable, gpu_available
from morphogen.protocol import dpf
from morphogen.protocol.dpf import DomainError
from morphogen.snapshot.layout import domain_bits_for, shard_ranges


def make_keys(rng, d, n_queries):
    keys, pairs = [], []
    for _ in range(n_queries):
        target = int(rng.integers(0, 1 << d))
        k0, k1 = dpf.generate_keys(d, target)
        keys.append(k0)
        pairs.append((target, k0, k1))
    return keys, pairs


@pytest.fixture(params=["cpu", "cpu-small-tiles"])
def fast_engine(request):
    if request.param == "cpu":
        return engine.create("cpu")
    return engine.create("cpu", tile_pages=8, max_keys=16)


@pytest.mark.parametrize(
    "num_pages,first_page,extra_bits,n_keys",
    [
        (1, 0, 0, 1),
        (1, 0, 0, 9),
        (5, 0, 0, 3),
        (64, 0, 0, 8),  # P = 2^d exactly
        (77, 0, 1, 7),
        (300, 1000, 0, 12),
        (1000, 24, 2, 3),
        (520, 7, 0, 40),
    ],
)
def test_engine_equals_reference(fast_engine, num_pages, first_page, extra_bits, n_keys):
    rng = np.random.default_rng(num_pages * 131 + n_keys)
    pages = rng.integers(0, 256, (num_pages, 4096), dtype=np.uint8)
    d = domain_bits_for(first_page + num_pages) + extra_bits
    keys, _ = make_keys(rng, d, n_keys)
    want = engine.create("reference").load(pages, first_page).scan(keys)
    got = fast_engine.load(pages, first_page).scan(keys)
    assert got.shape == (n_keys, 4096) and got.dtype == np.uint8
    assert np.array_equal(got, want)


def test_both_parties_recover_pages_and_shards_xor_to_whole():
    rng = np.random.default_rng(11)
    num_pages = 1531
    d = domain_bits_for(num_pages)
    pages = rng.integers(0, 256, (num_pages, 4096), dtype=np.uint8)
    targets = [0, 1, 777, num_pages - 1]
    pairs = [dpf.generate_keys(d, t) for t in targets]
    cpu = engine.create("cpu")
    whole_a = cpu.load(pages).scan([p[0] for p in pairs])
    whole_b = cpu.load(pages).scan(dpf.KeyBatch.from_keys([p[1] for p in pairs]))
    for i, t in enumerate(targets):
        assert np.array_equal(whole_a[i] ^ whole_b[i], pages[t])
    for n_shards in (2, 3, 7):
        acc = np.zeros_like(whole_a)
        for lo, hi in shard_ranges(num_pages, n_shards):
            acc ^= cpu.load(pages[lo:hi], lo).scan([p[0] for p in pairs])
        assert np.array_equal(acc, whole_a)


def test_scan_is_repeatable_and_handles_batch_sizes_in_any_order():
    rng = np.random.default_rng(2)
    pages = rng.integers(0, 256, (200, 4096), dtype=np.uint8)
    shard = engine.create("cpu").load(pages, 0)
    keys, _ = make_keys(rng, 8, 20)
    big = shard.scan(keys)
    small = shard.scan(keys[:2])
    assert np.array_equal(big[:2], small)
    assert np.array_equal(shard.scan(keys), big)


def test_keys_whose_domain_cannot_cover_the_shard_are_refused():
    pages = np.zeros((40, 4096), np.uint8)
    k, _ = dpf.generate_keys(5, 3)  # 32 pages < 40
    for name in ("reference", "cpu"):
        with pytest.raises(DomainError):
            engine.create(name).load(pages).scan([k])
    with pytest.raises(DomainError):
        engine.create("cpu").load(pages[:10], 30).scan([k])


def test_bad_page_arrays_and_engine_names():
    with pytest.raises(ValueError):
        engine.create("cpu").load(np.zeros((4, 100), np.uint8))
    with pytest.raises(ValueError):
        engine.create("cpu").load(np.zeros((4, 4096), np.uint16))
    with pytest.raises(ValueError):
        engine.create("quantum")
    with pytest.raises(ValueError):
        engine.create("cpu", tile_pages=3)


def test_gpu_engine_without_a_device_is_a_clear_error():
    if gpu_available():
        pytest.skip("a GPU is present")
    with pytest.raises(EngineUnavailable):
        engine.create("gpu")
    assert engine.create("auto").name == "cpu"


def test_non_contiguous_pages_are_accepted():
    rng = np.random.default_rng(9)
    base = rng.integers(0, 256, (60, 4096), dtype=np.uint8)
    view = base[::2]
    keys, _ = make_keys(rng, 5, 3)
    want = engine.create("reference").load(np.ascontiguousarray(view)).scan(keys)
    assert np.array_equal(engine.create("cpu").load(view).scan(keys), want)
