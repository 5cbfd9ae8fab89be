"""The parallel sort of 64-bit keys gives numpy's stable order, evenly spread keys or not."""

from __future__ import annotations

import numpy as np
import pytest

from morphogen.keyword import radix


@pytest.mark.parametrize("shape", ["hashes", "repeats", "one_bucket", "small"])
def test_the_order_is_numpys_stable_order(shape):
    rng = np.random.default_rng(7)
    n = 10_000 if shape == "small" else radix.SMALL + 12_345
    keys = rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
    if shape == "repeats":  # equal keys keep their order
        keys[rng.integers(0, n, n // 3)] = keys[rng.integers(0, n, n // 3)]
        keys[: n // 10] = keys[n // 2]
    if shape == "one_bucket":  # every key in the same top bits: one bucket sorts them all
        keys >>= np.uint64(radix.BUCKET_BITS)
    order, ranked = radix.argsort(keys)
    want = np.argsort(keys, kind="stable")
    assert order.dtype == np.int64 and np.array_equal(order, want)
    assert np.array_equal(ranked, keys[want])
