"""The numbers of PROTOCOL.md that every layer shares, defined once (the GPU kernels get theirs
from here too, as generated `#define` lines)."""

from __future__ import annotations

PAGE_SIZE = 4096
KEYS_PER_QUERY = 3
MAX_BATCH_QUERIES = 32
# the batch cap in keys: what one scan call is sized for (scanners accept more and chunk)
MAX_KEYS_PER_SCAN = MAX_BATCH_QUERIES * KEYS_PER_QUERY
MIN_DOMAIN_BITS = 1
MAX_DOMAIN_BITS = 32
MAX_PAGES = 1 << MAX_DOMAIN_BITS
SEED_BYTES = 16
MASK_BYTES = 16
KEY_HEADER_BYTES = 19  # root_seed(16) root_t(1) party(1) d(1)
KEY_LEVEL_BYTES = 18  # cw(16) tcw_left(1) tcw_right(1)


def key_length(domain_bits: int) -> int:
    """Bytes of one serialized DPF key (PROTOCOL.md section 4): 35 + 18 d (d=25 gives 485)."""
    return KEY_HEADER_BYTES + KEY_LEVEL_BYTES * domain_bits + MASK_BYTES
