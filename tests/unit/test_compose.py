"""Composing update batches from their changed bytes (`morphogen.protocol.compose`): byte for
byte the batch that composing their whole pages makes, kept as its canonical changed bytes."""

from __future__ import annotations

import numpy as np
import pytest

from morphogen.constants import PAGE_SIZE
from morphogen.protocol import sparse
from morphogen.protocol.changes import ChangeBatch, composed


def _by_whole_pages(batches: list[ChangeBatch]) -> tuple[list[int], list[bool], bytes]:
    """The composition done the plain way: a dense row a page, in order."""
    rows: dict[int, np.ndarray] = {}
    flags: dict[int, bool] = {}
    for b in batches:
        data = np.frombuffer(b.data, np.uint8).reshape(len(b), PAGE_SIZE)
        for i, (page, whole) in enumerate(zip(b.pages.tolist(), b.replace.tolist(),
                                              strict=True)):
            if page not in rows:
                rows[page], flags[page] = data[i].copy(), bool(whole)
            elif whole:
                rows[page][:], flags[page] = data[i], True
            else:
                rows[page] ^= data[i]
    pages = sorted(rows)
    return pages, [flags[p] for p in pages], b"".join(rows[p].tobytes() for p in pages)


def _batch(rng: np.random.Generator, form: str) -> ChangeBatch:
    n = int(rng.integers(0, 9))
    pages = rng.integers(0, 12, n).astype(np.int64)  # repeats within a batch too
    replace = rng.random(n) < 0.25
    dense = np.zeros((n, PAGE_SIZE), np.uint8)
    for row in dense:
        for _ in range(int(rng.integers(0, 4))):
            at = int(rng.choice([0, PAGE_SIZE - 20, int(rng.integers(0, PAGE_SIZE - 40))]))
            width = int(rng.integers(1, 40))
            row[at:at + width] = rng.integers(0, 3, len(row[at:at + width]))
    batch = ChangeBatch(pages, replace, dense.tobytes())
    if form == "dense":
        return batch
    if form == "packed":
        return ChangeBatch.from_packed(pages, replace, batch.packed)
    # one run over the whole buffer: pieces that cross every page boundary, zeros kept
    size = n * PAGE_SIZE
    whole = (sparse._HEAD.pack(size, 1 if n else 0)
             + (np.array([0], "<u8").tobytes() + np.array([size], "<u4").tobytes()
                + dense.tobytes() if n else b""))
    return ChangeBatch.from_packed(pages, replace, whole)


@pytest.mark.parametrize("seed", range(6))
def test_the_composed_batch_is_the_one_whole_pages_make(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(40):
        batches = [_batch(rng, str(rng.choice(["dense", "packed", "one-run"])))
                   for _ in range(int(rng.integers(0, 6)))]
        one = composed(batches)
        pages, flags, data = _by_whole_pages(batches)
        assert one.pages.tolist() == pages and one.replace.tolist() == flags
        assert "data" not in one.__dict__  # made from the changed bytes, kept so
        assert sparse.canonical(one.packed, len(one) * PAGE_SIZE) == one.packed
        assert one.data == data
        assert one.with_digest(2).digest == ChangeBatch(
            np.array(pages, np.int64), np.array(flags, bool), data).with_digest(2).digest


def test_diffs_that_cancel_leave_their_page_with_nothing_changed() -> None:
    diff = np.zeros(PAGE_SIZE, np.uint8)
    diff[PAGE_SIZE - 3:] = 9
    diff[:2] = 4  # runs at both edges: the next page's first bytes are 12 or fewer away
    a = ChangeBatch(np.array([5, 6], np.int64), np.zeros(2, bool), diff.tobytes() * 2)
    b = ChangeBatch(np.array([5], np.int64), np.zeros(1, bool), diff.tobytes())
    one = composed([a, b])
    assert one.pages.tolist() == [5, 6] and not one.replace.any()
    assert one.data == bytes(PAGE_SIZE) + diff.tobytes()
    assert sparse.canonical(one.packed, 2 * PAGE_SIZE) == one.packed
