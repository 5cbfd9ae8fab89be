"""The sampled-page digest: a cheap check, at every open, that a snapshot's data file is the one
its manifest was written for. Not a substitute for the checksum (`Snapshot.verify`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from morphogen.snapshot.chunks import as_bytes

if TYPE_CHECKING:
    from morphogen.snapshot.reader import Snapshot

SAMPLE_PAGES = 64


def sampled_pages(num_pages: int) -> list[int]:
    """The pages `sample_digest` reads: SAMPLE_PAGES spread evenly, first and last included."""
    n = num_pages
    return sorted({(n - 1) * i // (SAMPLE_PAGES - 1) for i in range(SAMPLE_PAGES)})


def sample_digest(snap: Snapshot) -> str:
    """blake2b-128 of the page count and SAMPLE_PAGES pages spread evenly over the snapshot
    (first and last included): a cheap check, at every open, that the data file is the one its
    manifest was written for. Not a substitute for the checksum (`verify=True`)."""
    return pages_sample_digest(snap.num_pages, lambda p: snap.pages(p, p + 1))


def pages_sample_digest(num_pages: int, page: Callable[[int], np.ndarray]) -> str:
    """`sample_digest` of ``num_pages`` pages read by ``page(p)`` (a ``(1, 4096)`` array)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(num_pages.to_bytes(8, "little"))
    for p in sampled_pages(num_pages):
        h.update(as_bytes(page(p)))
    return h.hexdigest()
