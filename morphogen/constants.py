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

# The packed key format (docs/packed-keys.md): the tree stops PACKED_LEAF_BITS levels early and
# each 128-bit leaf holds the selection bits of 128 pages.
PACKED_LEAF_BITS = 7
PACKED_LEAF_PAGES = 1 << PACKED_LEAF_BITS
PACKED_HEADER_BYTES = 20  # root_seed(16) root_t(1) party(1) d(1) format tag(1)
PACKED_TAG = 0x02
KEY_FORMAT_V1 = "v1"
KEY_FORMAT_PACKED = "packed"
KEY_FORMATS = (KEY_FORMAT_V1, KEY_FORMAT_PACKED)


def packed_levels(domain_bits: int) -> int:
    """Tree levels of a packed key of domain 2^d: d - 7, none for d <= 7."""
    return max(0, domain_bits - PACKED_LEAF_BITS)


def packed_key_length(domain_bits: int) -> int:
    """Bytes of one packed key: 36 + 18 (d - 7) (d=25 gives 360). Always a multiple of 18,
    where a v1 key's 35 + 18 d never is, so a key's length alone names its format."""
    return PACKED_HEADER_BYTES + KEY_LEVEL_BYTES * packed_levels(domain_bits) + MASK_BYTES


def key_format_of(length: int) -> str | None:
    """The format a key of `length` bytes can be (None: neither)."""
    if length % KEY_LEVEL_BYTES == (KEY_HEADER_BYTES + MASK_BYTES) % KEY_LEVEL_BYTES:
        return KEY_FORMAT_V1
    if length % KEY_LEVEL_BYTES == 0:
        return KEY_FORMAT_PACKED
    return None
