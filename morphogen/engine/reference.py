"""The NumPy reference engine: written for obviousness, it is the oracle of the tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.engine.base import check_domain, check_pages
from morphogen.protocol.dpf import DpfKey, KeyBatch, eval_range


class ReferenceShard:
    def __init__(self, pages: np.ndarray, first_page: int) -> None:
        self._pages = check_pages(pages)
        self.num_pages = int(pages.shape[0])
        self.first_page = int(first_page)

    def scan(self, keys: Sequence[DpfKey] | KeyBatch) -> np.ndarray:
        if isinstance(keys, KeyBatch):
            keys = keys.keys()
        out = np.zeros((len(keys), PAGE_SIZE), np.uint8)
        if keys:
            check_domain(KeyBatch.from_keys(keys), self.first_page, self.num_pages)
        for k, key in enumerate(keys):
            masks = eval_range(key, self.first_page, self.first_page + self.num_pages)
            for i in range(self.num_pages):
                out[k] ^= self._pages[i] & np.tile(masks[i], PAGE_SIZE // 16)
        return out

    def close(self) -> None:
        self._pages = None  # type: ignore[assignment]


class ReferenceEngine:
    name = "reference"

    def load(self, pages: np.ndarray, first_page: int = 0) -> ReferenceShard:
        return ReferenceShard(pages, first_page)
