"""The scan-engine contract shared by every backend.

A backend's `load` takes one shard's pages (an `(n, 4096)` uint8 array, a memmap is fine) and the
global number of its first page; the returned scanner's `scan(keys)` gives, for each key, the XOR
over the shard's pages of `page AND tile(mask(first_page + i))` as a `(K, 4096)` uint8 array.
Every backend returns identical bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from morphogen.constants import KEY_FORMAT_V1, PAGE_SIZE
from morphogen.protocol.dpf import DomainError, DpfKey, KeyBatch
from morphogen.protocol.packed import PackedKeyBatch, batch_format


class EngineUnavailable(RuntimeError):
    """The requested backend cannot run here (no CuPy, no device, ...)."""


@runtime_checkable
class ShardScanner(Protocol):
    num_pages: int
    first_page: int

    def scan(self, keys: Sequence[DpfKey] | KeyBatch) -> np.ndarray: ...

    def close(self) -> None: ...


@runtime_checkable
class Engine(Protocol):
    name: str

    def load(self, pages: np.ndarray, first_page: int = 0) -> ShardScanner: ...


def check_pages(pages: np.ndarray) -> np.ndarray:
    """The page array as (n, 4096) uint8, refusing anything else."""
    if pages.dtype != np.uint8 or pages.ndim != 2 or pages.shape[1] != PAGE_SIZE:
        raise ValueError(
            f"pages must be an (n, {PAGE_SIZE}) uint8 array, got {pages.dtype} {pages.shape}"
        )
    return pages


def key_formats(engine: object) -> tuple[str, ...]:
    """The key formats `engine` scans: its `key_formats`, v1 alone for an engine that names
    none (the GPU engine until its kernels learn packed keys)."""
    return tuple(getattr(engine, "key_formats", (KEY_FORMAT_V1,)))


class KeyFormatUnsupported(ValueError):
    """A batch of a key format the engine does not scan."""


def check_format(engine: object, batch: object) -> None:
    fmt = batch_format(batch)
    if fmt not in key_formats(engine):
        name = getattr(engine, "name", type(engine).__name__)
        raise KeyFormatUnsupported(
            f"the {name} engine does not scan {fmt} keys (it takes: "
            f"{', '.join(key_formats(engine))})"
        )


def check_domain(batch: KeyBatch | PackedKeyBatch, first_page: int, num_pages: int) -> None:
    """Every page of the shard must be inside the keys' domain (no aliasing, PROTOCOL.md 7)."""
    if first_page + num_pages > (1 << batch.domain_bits):
        raise DomainError(
            f"keys of domain 2^{batch.domain_bits} cannot address pages up to "
            f"{first_page + num_pages}"
        )
