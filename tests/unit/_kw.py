"""Keyword lookups straight from a table's pages (no servers): the proof of a version and the
pages a lookup reads, as the client would get them."""

from __future__ import annotations

from typing import Any

import numpy as np

from morphogen.keyword.descriptor import Descriptor
from morphogen.keyword.verify import (
    WHOLE_LEVEL_PAGES,
    Proof,
    check,
    plan,
    private_levels,
    prove_whole,
    whole_pages_wanted,
)


def proof_of(pages: np.ndarray, desc: Descriptor, whole: int = WHOLE_LEVEL_PAGES) -> Proof:
    g = desc.geometry
    private = private_levels(desc, whole)
    levels = {k: [pages[g.level_first(k) + i].tobytes() for i in range(n)]
              for k, n in whole_pages_wanted(desc, private).items()}
    return prove_whole(desc, private, levels)


def answers(pages: np.ndarray, proof: Proof, wanted: list[list[int]]) -> list[list[bytes]]:
    g = proof.descriptor.geometry
    firsts = [0] + [g.level_first(k) for k in range(1, proof.private + 1)]
    return [[pages[first + p].tobytes() for p in want] for first, want in zip(firsts, wanted,
                                                                               strict=True)]


def lookup(pages: np.ndarray, desc: Descriptor, keys: list[bytes],
           whole: int = WHOLE_LEVEL_PAGES) -> list[bytes | None]:
    proof = proof_of(pages, desc, whole)
    wanted, buckets = plan(proof, keys)
    return check(proof, keys, buckets, answers(pages, proof, wanted))


class TablePir:
    """A page client without the DPF that serves a keyword table's parts as party tables
    (or, `tables=False`, only the whole matrix, as the reference's server): `get_pinned`
    straight from the pages, recording (table, pages, num_pages) of every request."""

    def __init__(self, pages: np.ndarray, *, tables: bool = True, max_batch: int = 32,
                 epoch: int = 1) -> None:
        self.pages, self.max_batch, self.epoch = pages, max_batch, epoch
        self.with_tables = tables
        self.requests: list[tuple[str | None, list[int], int]] = []

    def tables(self) -> dict[str, dict[str, int]]:
        from morphogen.keyword.descriptor import tables_of

        try:
            found = tables_of(self.pages) if self.with_tables else []
        except ValueError:  # no descriptor in the last page: served as pages, no tables
            found = []
        return {t["name"]: {"first_page": t["first_page"], "num_pages": t["num_pages"]}
                for t in found}

    def info(self, refresh: bool = False) -> Any:
        from types import SimpleNamespace

        n = len(self.pages)
        return SimpleNamespace(num_pages=n, domain_bits=max(1, (n - 1).bit_length()),
                               epoch_id=self.epoch, identity=None,
                               max_batch_queries=self.max_batch, tables=self.tables())

    def get_pinned(self, pages: list[int], num_pages: int, table: str | None = None) -> Any:
        from morphogen.client import Answer

        first = 0
        if table is not None:
            first, size = (lambda t: (t["first_page"], t["num_pages"]))(self.tables()[table])
            assert num_pages == size and all(0 <= p < size for p in pages)
        else:
            assert num_pages == len(self.pages)
        assert len(pages) <= 3 * self.max_batch
        self.requests.append((table, list(pages), num_pages))
        return Answer(self.epoch, None, [self.pages[first + p].tobytes() for p in pages])
