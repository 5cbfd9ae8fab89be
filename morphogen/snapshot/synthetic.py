"""Synthetic pages: deterministic pseudo-random page data and snapshots of it, for demos,
tests and benchmarks."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from morphogen.constants import MAX_PAGES, PAGE_SIZE
from morphogen.snapshot.chunks import CHUNK_PAGES
from morphogen.snapshot.hashes import DEFAULT_CHUNK_PAGES
from morphogen.snapshot.manifest import Manifest
from morphogen.snapshot.progress import Progress
from morphogen.snapshot.writer import write_snapshot

_WORDS_PER_PAGE = PAGE_SIZE // 8


def synthetic_pages(seed: int, start: int, stop: int) -> np.ndarray:
    """Deterministic pseudo-random pages ``[start, stop)`` as a ``(stop - start, 4096)`` array.

    Page ``i`` is the 512 little-endian 64-bit words ``[512 i, 512 i + 512)`` of one PCG64
    stream seeded by ``SeedSequence(seed)``; PCG64 jumps ahead in O(log n), so any range is
    generated directly and page ``i`` is the same however the range is cut. NumPy keeps the
    PCG64 and SeedSequence streams stable across releases. Not for secrets: demos, tests and
    benchmarks only.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    start, stop = int(start), int(stop)
    if not 0 <= start <= stop:
        raise ValueError(f"bad page range [{start}, {stop})")
    if start == stop:
        return np.empty((0, PAGE_SIZE), dtype=np.uint8)
    bitgen = np.random.PCG64(np.random.SeedSequence(int(seed)))
    bitgen.advance(start * _WORDS_PER_PAGE)
    words = bitgen.random_raw((stop - start) * _WORDS_PER_PAGE)
    return words.astype("<u8", copy=False).view(np.uint8).reshape(stop - start, PAGE_SIZE)


def _synthetic_chunks(seed: int, num_pages: int) -> Iterator[np.ndarray]:
    for s in range(0, num_pages, CHUNK_PAGES):
        yield synthetic_pages(seed, s, min(num_pages, s + CHUNK_PAGES))


def build_synthetic(
    out_dir: str | os.PathLike[str],
    num_pages: int,
    *,
    seed: int = 0,
    epoch_id: int = 1,
    progress: Progress = True,
    overwrite: bool = False,
    chunk_pages: int = DEFAULT_CHUNK_PAGES,
    tables: Sequence[Any] | None = None,
) -> Manifest:
    """Write a synthetic snapshot of ``num_pages`` pages (``synthetic_pages(seed, 0, P)``),
    hashed in chunks of ``chunk_pages`` pages, naming ``tables`` (as `write_snapshot`)."""
    if not 1 <= num_pages <= MAX_PAGES:
        raise ValueError(f"num_pages must be in 1..{MAX_PAGES}, got {num_pages}")
    return write_snapshot(
        out_dir,
        _synthetic_chunks(seed, num_pages),
        epoch_id=epoch_id,
        source=f"synthetic:{seed}",
        progress=progress,
        num_pages=num_pages,
        overwrite=overwrite,
        chunk_pages=chunk_pages,
        tables=tables,
    )
