"""Slots in a page: tags, reading a record out, finding a free slot, every record of a table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import blake3
import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.keyword.layout import EMPTY_TAG, TAG_SIZE, Geometry

TAG_DOMAIN = b"morphogen-keyword-tag-v1\0"


def tag_of(dataset: bytes, key: bytes) -> bytes:
    """The slot tag of `key`: 128 bits of BLAKE3 over the table's dataset id and the key.

    Two keys share a tag with probability about n^2 / 2^129 over n keys (below 1e-20 at
    1.5 billion keys), and the builder refuses a table where two do.
    """
    return blake3.blake3(TAG_DOMAIN + dataset + bytes(key)).digest(TAG_SIZE)


def tags_of(dataset: bytes, keys: list[bytes]) -> np.ndarray:
    prefix = TAG_DOMAIN + dataset
    digests = b"".join([blake3.blake3(prefix + key).digest(TAG_SIZE) for key in keys])
    return np.frombuffer(digests, np.uint8).reshape(len(keys), TAG_SIZE).copy()


def find_values(geometry: Geometry, pages: Sequence[bytes], buckets: Sequence[int],
                tags: Sequence[bytes]) -> list[bytes | None]:
    """The value stored under each tag in its bucket of its page (None where absent), for
    many at once: one comparison over every slot of every bucket, whatever it finds (the
    same work for a hit and a miss)."""
    m, size = len(pages), geometry.slot_size
    if m == 0:
        return []
    arr = np.frombuffer(b"".join(pages), np.uint8).reshape(m, PAGE_SIZE)
    want = np.frombuffer(b"".join(tags), np.uint8).reshape(m, 1, TAG_SIZE)
    if geometry.layout == "page":
        n = geometry.slots_per_bucket
        slots = arr[:, :n * size].reshape(m, n, size)
    else:
        offsets = (np.asarray(buckets, np.int64) % geometry.rows_per_page) * geometry.row_size
        slots = arr[np.arange(m)[:, None], offsets[:, None] + np.arange(size)].reshape(m, 1, size)
    hit = (slots[:, :, :TAG_SIZE] == want).all(axis=2)
    found, first = hit.any(axis=1), hit.argmax(axis=1)
    values = slots[np.arange(m), first, TAG_SIZE:]
    return [values[i].tobytes() if found[i] else None for i in range(m)]


def _aligned(geometry: Geometry, page: np.ndarray, bucket: int, tag: bytes) -> int | None:
    """The first slot of `bucket` whose tag is `tag`. A byte search over the bucket's slots,
    kept only where it starts a slot: an owner's edit finds a few thousand keys a block, and
    numpy's per-call overhead on arrays this small costs eight times the search."""
    n, size = geometry.bucket_capacity(bucket), geometry.slot_size
    first = geometry.slot_offset(bucket, 0)
    raw = page[first:first + n * size].tobytes()
    at = raw.find(tag)
    while at >= 0:
        if at % size == 0:
            return at // size
        at = raw.find(tag, at + 1)
    return None


def slot_of(geometry: Geometry, page: np.ndarray, bucket: int, tag: bytes) -> int | None:
    """The slot of `bucket` (in `page`, a row of the owner's pages) holding `tag`, or None."""
    return _aligned(geometry, page, bucket, tag)


def free_slot(geometry: Geometry, page: np.ndarray, bucket: int) -> int | None:
    """The first empty slot of `bucket` in `page`, or None."""
    return _aligned(geometry, page, bucket, EMPTY_TAG)


def records_in(pages: np.ndarray, geometry: Geometry, keys: Mapping[bytes, bytes]
               ) -> list[tuple[bytes, bytes]]:
    """(key, value) of every record in one keyword table's pages."""
    g = geometry
    out = []
    for b in range(g.num_buckets):
        page = pages[g.bucket_page(b)]
        for s in range(g.bucket_capacity(b)):
            off = g.slot_offset(b, s)
            tag = page[off:off + TAG_SIZE].tobytes()
            if tag != EMPTY_TAG:
                out.append((keys[tag], page[off + TAG_SIZE:off + g.slot_size].tobytes()))
    return out
