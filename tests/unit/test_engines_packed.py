"""Packed keys on the reference and CPU engines: the oracle's bytes, both parties recovering the
page, shard splits at any alignment XORing to the whole; engines without packed kernels
refuse them cleanly."""

import numpy as np
import pytest

from morphogen import engine
from morphogen.engine.base import KeyFormatUnsupported, check_format, key_formats
from morphogen.protocol.dpf import DomainError
from morphogen.protocol.packed import PackedKeyBatch, generate_packed_keys
from morphogen.snapshot.layout import domain_bits_for, shard_ranges


def _pairs(rng, d, n):
    out = []
    for _ in range(n):
        t = int(rng.integers(0, 1 << d))
        out.append((t, *generate_packed_keys(d, t)))
    return out


@pytest.fixture(params=["cpu", "cpu-few-keys", "cpu-groups-of-1", "cpu-groups-of-3",
                        "cpu-passes-of-16"])
def cpu(request):
    if request.param.startswith("cpu-groups-of-"):  # many bucket groups, uneven ones too
        return engine.create("cpu", packed_group_keys=int(request.param[-1]))
    if request.param == "cpu-passes-of-16":  # a batch in several passes over the pages
        return engine.create("cpu", packed_pass_keys=16)
    return engine.create("cpu") if request.param == "cpu" else engine.create("cpu", max_keys=5)


@pytest.mark.parametrize(
    "num_pages,first_page,extra_bits,n_keys",
    [
        (1, 0, 0, 1),
        (5, 0, 0, 3),
        (128, 0, 0, 8),
        (77, 3, 1, 7),
        (300, 1000, 0, 12),
        (1500, 129, 0, 3),  # crosses a 1024-page tile, unaligned to 8 and to 128
        (520, 7, 2, 40),
        (4096, 0, 0, 20),  # groups of 7, 7 and 6 keys
    ],
)
def test_cpu_equals_reference(cpu, num_pages, first_page, extra_bits, n_keys):
    rng = np.random.default_rng(num_pages * 7 + n_keys)
    pages = rng.integers(0, 256, (num_pages, 4096), dtype=np.uint8)
    d = domain_bits_for(first_page + num_pages) + extra_bits
    batch = PackedKeyBatch.from_keys([p[1] for p in _pairs(rng, d, n_keys)])
    want = engine.create("reference").load(pages, first_page).scan(batch)
    got = cpu.load(pages, first_page).scan(batch)
    assert got.shape == (n_keys, 4096) and got.dtype == np.uint8
    assert np.array_equal(got, want)


def test_parties_recover_pages_and_shards_xor_to_the_whole():
    rng = np.random.default_rng(5)
    num_pages = 2100
    d = domain_bits_for(num_pages)
    pages = rng.integers(0, 256, (num_pages, 4096), dtype=np.uint8)
    pages.flags.writeable = False  # as a shard loads them
    targets = [0, 1, 127, 128, 1029, num_pages - 1]
    pairs = [generate_packed_keys(d, t) for t in targets]
    a = PackedKeyBatch.from_keys([p[0] for p in pairs])
    b = PackedKeyBatch.from_keys([p[1] for p in pairs])
    cpu = engine.create("cpu")
    whole_a, whole_b = cpu.load(pages).scan(a), cpu.load(pages).scan(b)
    for i, t in enumerate(targets):
        assert np.array_equal(whole_a[i] ^ whole_b[i], pages[t])
    for n_shards in (2, 3, 7):
        acc = np.zeros_like(whole_a)
        for lo, hi in shard_ranges(num_pages, n_shards):
            acc ^= cpu.load(pages[lo:hi], lo).scan(a)
        assert np.array_equal(acc, whole_a)


def test_domain_too_small_is_refused():
    pages = np.zeros((300, 4096), np.uint8)
    batch = PackedKeyBatch.from_keys([generate_packed_keys(8, 3)[0]])
    for name in ("reference", "cpu"):
        with pytest.raises(DomainError):
            engine.create(name).load(pages).scan(batch)


def test_engines_name_the_formats_they_scan():
    assert key_formats(engine.create("cpu")) == ("v1", "packed")
    assert key_formats(engine.create("reference")) == ("v1", "packed")

    class V1Only:  # an engine naming no formats
        name = "gpu"

    batch = PackedKeyBatch.from_keys([generate_packed_keys(8, 3)[0]])
    assert key_formats(V1Only()) == ("v1",)
    with pytest.raises(KeyFormatUnsupported, match="gpu engine does not scan packed"):
        check_format(V1Only(), batch)
    check_format(engine.create("cpu"), batch)


def test_bit_transpose_gives_each_pages_pattern():
    from morphogen.engine._cpu_packed_kernel import _transpose8

    rng = np.random.default_rng(9)
    for x in [0, (1 << 64) - 1, 1, 1 << 63, *map(int, rng.integers(0, 1 << 63, 50, np.uint64))]:
        got = int(_transpose8(np.uint64(x)))
        want = 0
        for r in range(8):
            for c in range(8):
                want |= ((x >> (8 * r + c)) & 1) << (8 * c + r)
        assert got == want


@pytest.mark.parametrize("n_keys", [1, 3, 8, 9, 12, 24, 96])
def test_bucket_groups_fit_and_adapt_to_the_shard(n_keys):
    from morphogen.engine._cpu_packed_kernel import plan_groups

    for pages_per_worker, cap in ((1 << 20, 8), (16, 8), (1 << 20, 3)):
        keys, rows, total = plan_groups(n_keys, pages_per_worker, cap)
        sizes = np.diff(keys)
        assert keys[0] == 0 and keys[-1] == n_keys
        assert sizes.min() >= 1 and sizes.max() <= cap and sizes.max() - sizes.min() <= 1
        assert list(rows) == [sum(1 << int(s) for s in sizes[:j]) for j in range(len(sizes))]
        assert total == sum(1 << int(s) for s in sizes)
        if pages_per_worker == 1 << 20:  # a large shard: the fewest XORs a page
            assert len(sizes) == -(-n_keys // cap)
    # a tiny shard gives up XORs a page for fewer buckets to clear and fold
    assert len(plan_groups(24, 16)[0]) - 1 > 3
