"""The NumPy reference engine: written for obviousness, it is the oracle of the tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from morphogen.constants import KEY_FORMATS, PAGE_SIZE
from morphogen.engine.base import check_domain, check_pages
from morphogen.protocol.dpf import DpfKey, KeyBatch, eval_range
from morphogen.protocol.packed import PackedKeyBatch, selection_range


class ReferenceShard:
    def __init__(self, pages: np.ndarray, first_page: int) -> None:
        self._pages = check_pages(pages)
        self.reads_in_place = True  # scans read `pages` itself (morphogen.party.host_fold)
        self.num_pages = int(pages.shape[0])
        self.first_page = int(first_page)

    def scan(self, keys: Sequence[DpfKey] | KeyBatch | PackedKeyBatch) -> np.ndarray:
        if isinstance(keys, PackedKeyBatch):
            return self._scan_packed(keys)
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

    def _scan_packed(self, batch: PackedKeyBatch) -> np.ndarray:
        """XOR of the pages whose selection bit is set, key by key."""
        check_domain(batch, self.first_page, self.num_pages)
        out = np.zeros((len(batch), PAGE_SIZE), np.uint8)
        for k in range(len(batch)):
            bits = selection_range(batch.select(k, k + 1), self.first_page,
                                   self.first_page + self.num_pages)
            for i in np.flatnonzero(bits):
                out[k] ^= self._pages[i]
        return out

    def close(self) -> None:
        self._pages = None  # type: ignore[assignment]


class ReferenceEngine:
    name = "reference"
    key_formats = KEY_FORMATS

    def load(self, pages: np.ndarray, first_page: int = 0) -> ReferenceShard:
        return ReferenceShard(pages, first_page)
