"""One shard's scanning state, without Ray: its page range, its engine, its epoch, a self-test.

`deployments/shard.py` wraps this in a Serve deployment; `warm_up` runs the same code path on a
few pages so that a jitted engine compiles (and caches) its kernels once, in one process,
before a fleet of shard processes would each compile them at the same time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from morphogen import engine as engines
from morphogen.codec import PAGE_SIZE
from morphogen.dpf import KeyBatch, generate_keys
from morphogen.matrix import Snapshot, shard_ranges

_KEY_FIELDS = ("root_seed", "root_t", "cw", "tcw", "final_cw")


def owned(batch: KeyBatch) -> KeyBatch:
    """The batch with writable, C-contiguous arrays of its own.

    Keys reach a shard as read-only views (Ray's object store, or `np.frombuffer` for a
    one-key batch); a jitted engine compiles a separate signature per read-only flag, so every
    scan goes through this one normalised form.
    """
    if all(getattr(batch, f).flags.writeable for f in _KEY_FIELDS):
        return batch
    return dataclasses.replace(batch, **{f: np.array(getattr(batch, f)) for f in _KEY_FIELDS})


class ShardCore:
    """Pages `[first_page, stop_page)` of a snapshot under one engine."""

    def __init__(
        self,
        snapshot: Snapshot,
        first_page: int,
        stop_page: int,
        engine_name: str = "auto",
        engine_options: dict[str, Any] | None = None,
    ) -> None:
        if not 0 <= first_page < stop_page <= snapshot.num_pages:
            raise ValueError(f"bad shard range [{first_page}, {stop_page})")
        self.snapshot = snapshot
        self.first_page = first_page
        self.stop_page = stop_page
        self.epoch_id = int(snapshot.epoch_id)
        self.domain_bits = int(snapshot.domain_bits)
        pages = snapshot.pages(first_page, stop_page)  # a view of the mapping, never a copy
        self.engine = engines.create(engine_name, **(engine_options or {}))
        self.scanner = self.engine.load(pages, first_page=first_page)
        # The self-test: one page, one key, answer known from the plain-Python DPF walk.
        key, _ = generate_keys(self.domain_bits, first_page)
        mask = np.frombuffer(key.eval(first_page), dtype=np.uint8)
        self._probe_batch = owned(KeyBatch.from_keys([key]))
        self._probe_expected = np.bitwise_and(
            np.asarray(pages[0]).reshape(-1), np.tile(mask, PAGE_SIZE // 16)
        )
        self._probe = self.engine.load(pages[0:1], first_page=first_page)

    @classmethod
    def open(
        cls,
        snapshot: Snapshot,
        index: int,
        num_shards: int,
        engine_name: str = "auto",
        engine_options: dict[str, Any] | None = None,
    ) -> ShardCore:
        first, stop = shard_ranges(snapshot.num_pages, num_shards)[index]
        return cls(snapshot, first, stop, engine_name, engine_options)

    @property
    def engine_name(self) -> str:
        return str(self.engine.name)

    def scan(self, batch: KeyBatch) -> np.ndarray:
        """`(K, 4096)` partial accumulators of every key over this shard's pages."""
        if batch.domain_bits != self.domain_bits:
            raise ValueError(
                f"keys of domain {batch.domain_bits}, snapshot domain {self.domain_bits}"
            )
        return np.asarray(self.scanner.scan(owned(batch)), dtype=np.uint8)

    def self_test(self) -> None:
        """Raise unless the engine computes the known one-page answer."""
        got = np.asarray(self._probe.scan(self._probe_batch)).reshape(-1)
        if not np.array_equal(got, self._probe_expected):
            raise RuntimeError("engine self-test gave a wrong accumulator")

    def close(self) -> None:
        for scanner in (self._probe, self.scanner):
            scanner.close()


def warm_up(snapshot: Snapshot, engine_name: str, engine_options: dict[str, Any] | None = None,
            pages: int = 64) -> str:
    """Compile the engine's kernels for exactly the shards' call signatures (read-only mapped
    pages, normalised keys) on a few pages; returns the engine's name."""
    core = ShardCore(snapshot, 0, min(pages, snapshot.num_pages), engine_name, engine_options)
    try:
        core.self_test()
        keys = [generate_keys(core.domain_bits, i % core.stop_page)[0] for i in range(3)]
        core.scan(KeyBatch.from_keys(keys))
        return core.engine_name
    finally:
        core.close()
