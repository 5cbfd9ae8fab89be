"""The parallel sort of 64-bit keys gives numpy's stable order, evenly spread keys or not, and
byte rows sorted on it give the order of their bytes."""

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


def _rows_order(rows: np.ndarray) -> np.ndarray:
    return np.lexsort(rows.T[::-1])  # stable, first byte first


@pytest.mark.parametrize("shape", ["addresses", "alike_heads", "many_alike", "narrow", "small"])
def test_rows_are_ordered_as_bytes_compare_ties_kept_in_place(shape, monkeypatch):
    """`rows_argsort`: byte rows (addresses, a code's least address then its hash) in the
    order their bytes give, equal rows in the order they came: rows alike in their first 8
    bytes (a dev chain's low addresses) sorted by the rest, run by run or all at once."""
    rng = np.random.default_rng(11)
    n = 2_000 if shape == "small" else radix.SMALL + 5_001
    width = 6 if shape == "narrow" else 20
    rows = rng.integers(0, 256, (n, width), dtype=np.uint8)
    if shape in ("alike_heads", "many_alike", "small"):
        runs = 40 if shape != "many_alike" else 3_000
        for _ in range(runs):  # runs of rows sharing 8 bytes, some of them equal rows
            at = rng.integers(0, n, 7)
            rows[at, :8] = rows[at[0], :8]
            rows[at[-1]] = rows[at[0]]
        rows[: n // 50, :12] = 0  # precompiles: 0x000..01, 0x000..02, ..
    if shape == "many_alike":
        monkeypatch.setattr(radix, "TIE_RUNS", 100)
    order = radix.rows_argsort(rows)
    assert order.dtype == np.int64 and np.array_equal(order, _rows_order(rows))


def test_ranges_sorted_apart_order_as_one():
    """What the import sorts: the ranges' sorted runs of addresses, back to back."""
    rng = np.random.default_rng(5)
    runs = [int(r) for r in rng.integers(0, 300, 37)]
    rows = [np.sort(rng.integers(0, 2**40, r)).astype(">u8").view(np.uint8).reshape(r, 8)
            for r in runs]
    keys = np.concatenate(rows)
    order = radix.rows_argsort(keys)
    assert np.array_equal(order, np.argsort(keys.view(">u8").reshape(-1), kind="stable"))
