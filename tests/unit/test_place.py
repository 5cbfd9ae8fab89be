"""The cuckoo placement every keyword table is built with (`keyword.build._place`): its capacity
a number, where it was an array of equal capacities read for every candidate. The tables it
makes must not change by a byte (the published vectors, every owner directory's rebuild), so it
is held here to the placement it replaced, kept below as it was, on inputs that force long
eviction walks, candidates that repeat, and tables too full to place."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from morphogen.keyword.build import MAX_KICKS, _place


@numba.njit(cache=True)
def _place_with_capacities(cands, cap, occ, fill, order, max_kicks, rng_seed):
    np.random.seed(rng_seed)
    for r in order:
        cur = r
        last = -1
        placed = False
        for _ in range(max_kicks):
            best = -1
            best_free = 0
            for j in range(3):
                b = cands[cur, j]
                free = cap[b] - fill[b]
                if free > best_free:
                    best = b
                    best_free = free
            if best >= 0:
                occ[best, fill[best]] = cur
                fill[best] += 1
                placed = True
                break
            n_ok = 0
            for j in range(3):
                b = cands[cur, j]
                if cap[b] > 0 and b != last:
                    n_ok += 1
            if n_ok == 0:
                for j in range(3):
                    if cap[cands[cur, j]] > 0:
                        n_ok += 1
                if n_ok == 0:
                    return cur
                last = -1
            pick = np.random.randint(n_ok)
            b = -1
            for j in range(3):
                c = cands[cur, j]
                if cap[c] > 0 and c != last:
                    if pick == 0:
                        b = c
                        break
                    pick -= 1
            s = np.random.randint(cap[b])
            victim = occ[b, s]
            occ[b, s] = cur
            cur = victim
            last = b
        if not placed:
            return cur
    return -1


@pytest.mark.parametrize("buckets,slots,load,repeats", [
    (1000, 1, 0.9, 0.0),     # one slot a bucket: long walks
    (500, 4, 0.97, 0.0),     # nearly full
    (300, 2, 0.95, 0.3),     # many records whose candidates repeat a bucket
    (50, 3, 1.0, 0.5),       # full, and walks that give up
    (200, 85, 0.99, 0.0),    # a storage page's slots
    (40, 2, 1.3, 0.1),       # more records than slots
])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_placement_is_the_one_it_replaced(buckets, slots, load, repeats, seed) -> None:
    rng = np.random.default_rng(seed)
    n = int(buckets * slots * load)
    cands = rng.integers(0, buckets, (n, 3), dtype=np.int64)
    same = rng.random(n) < repeats
    cands[same, 1] = cands[same, 0]
    alike = same & (rng.random(n) < 0.5)
    cands[alike, 2] = cands[alike, 0]  # all three alike
    got_occ, got_fill = np.full((buckets, slots), -1, np.int64), np.zeros(buckets, np.int32)
    want_occ, want_fill = got_occ.copy(), got_fill.copy()
    draw = int(rng.integers(2**31))
    kicks = 50 if load >= 1 else MAX_KICKS
    got = _place(cands, slots, got_occ, got_fill, kicks, draw)
    want = _place_with_capacities(cands, np.full(buckets, slots, np.int32), want_occ, want_fill,
                                  np.arange(n, dtype=np.int64), kicks, draw)
    assert got == want
    assert np.array_equal(got_occ, want_occ) and np.array_equal(got_fill, want_fill)
    if load <= 0.97 and repeats == 0:
        assert got == -1  # these fit


def test_no_slots_places_nothing() -> None:
    occ, fill = np.zeros((3, 0), np.int64), np.zeros(3, np.int32)
    assert _place(np.zeros((2, 3), np.int64), 0, occ, fill, MAX_KICKS, 1) == 0
    assert _place(np.zeros((0, 3), np.int64), 0, occ, fill, MAX_KICKS, 1) == -1
