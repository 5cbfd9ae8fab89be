"""DPF keys as the GPU kernels read them: flat uint32 records, one per key.

Both scan kernels (scan_kernel.cu, sliced_scan_kernel.cu) read this layout;
`gpu_kernels.kernel_source()` gives them KEY_HEADER_WORDS as a generated `#define`.
"""

from __future__ import annotations

import numpy as np

from morphogen.protocol.dpf import KeyBatch
from morphogen.protocol.packed import PackedKeyBatch

KEY_HEADER_WORDS = 12  # u32 words before the per-level correction words


def key_words(domain_bits: int) -> int:
    """u32 words of one key record in the kernel's layout."""
    return KEY_HEADER_WORDS + 4 * domain_bits


def tree_levels(batch: KeyBatch | PackedKeyBatch) -> int:
    """Levels of the keys' trees, the `d` of their records: the domain bits for v1 keys,
    d - 7 for packed keys (whose leaves hold 128 pages' selection bits)."""
    return batch.levels if isinstance(batch, PackedKeyBatch) else batch.domain_bits


def pack_keys(batch: KeyBatch | PackedKeyBatch, out: np.ndarray | None = None) -> np.ndarray:
    """The batch as (K, key_words(d)) uint32 records, the layout the scan kernels read; for
    packed keys d is their tree's levels (`tree_levels`), the fields the same.

    [0:4] root seed, [4:8] final_cw, [8] root_t, [9] tcw_left bits (bit i = level i),
    [10] tcw_right bits, [11] 0, [12 + 4i : 16 + 4i] cw[i]. `out`, when given, is a flat
    uint32 buffer (a pinned one) that receives the records and backs the returned view.
    """
    k, d = len(batch), tree_levels(batch)
    w = key_words(d)
    if out is None:
        rec = np.empty((k, w), np.uint32)
    else:
        if out.dtype != np.uint32 or out.size < k * w:
            raise ValueError(f"key buffer needs {k * w} uint32 words")
        rec = out[: k * w].reshape(k, w)
    rec[:, 0:4] = batch.root_seed
    rec[:, 4:8] = batch.final_cw
    rec[:, 8] = batch.root_t
    bits = np.left_shift(np.uint32(1), np.arange(d, dtype=np.uint32))
    rec[:, 9] = np.bitwise_or.reduce(batch.tcw[:, :, 0].astype(np.uint32) * bits, axis=1)
    rec[:, 10] = np.bitwise_or.reduce(batch.tcw[:, :, 1].astype(np.uint32) * bits, axis=1)
    rec[:, 11] = 0
    rec[:, KEY_HEADER_WORDS:] = batch.cw.reshape(k, 4 * d)
    return rec
