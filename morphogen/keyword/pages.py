"""Slots in a page: tags, reading a record out, signing a page, the table's root hash."""

from __future__ import annotations

import blake3
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from morphogen.keyword.layout import EMPTY_TAG, TAG_SIZE, Geometry
from morphogen.keyword.signing import page_message

TAG_DOMAIN = b"morphogen-keyword-tag-v1\0"


def tag_of(dataset: bytes, key: bytes) -> bytes:
    """The slot tag of `key`: 128 bits of BLAKE3 over the table's dataset id and the key.

    Two keys share a tag with probability about n^2 / 2^129 over n keys (below 1e-20 at
    1.5 billion keys), and the builder refuses a table where two do.
    """
    return blake3.blake3(TAG_DOMAIN + dataset + bytes(key)).digest(TAG_SIZE)


def tags_of(dataset: bytes, keys: list[bytes]) -> np.ndarray:
    prefix = TAG_DOMAIN + dataset
    out = np.empty((len(keys), TAG_SIZE), dtype=np.uint8)
    flat = out.reshape(-1)
    for i, key in enumerate(keys):
        flat[i * TAG_SIZE:(i + 1) * TAG_SIZE] = np.frombuffer(
            blake3.blake3(prefix + key).digest(TAG_SIZE), np.uint8)
    return out


def find_value(geometry: Geometry, page: bytes | memoryview, bucket: int, tag: bytes
               ) -> bytes | None:
    """The value stored under `tag` in `bucket` of `page`, or None. Compares every slot of the
    bucket at once whatever it finds (the same work for a hit and a miss)."""
    n, size = geometry.bucket_capacity(bucket), geometry.slot_size
    # a bucket's slots lie back to back from its first (a page's body, or one row)
    slots = np.frombuffer(page, np.uint8, count=n * size,
                          offset=geometry.slot_offset(bucket, 0)).reshape(n, size)
    hits = np.flatnonzero((slots[:, :TAG_SIZE] == np.frombuffer(tag, np.uint8)).all(axis=1))
    return slots[hits[0], TAG_SIZE:].tobytes() if hits.size else None


def slot_of(geometry: Geometry, page: bytes | memoryview, bucket: int, tag: bytes) -> int | None:
    page = memoryview(page)
    for slot in range(geometry.bucket_capacity(bucket)):
        off = geometry.slot_offset(bucket, slot)
        if page[off:off + TAG_SIZE] == tag:
            return slot
    return None


def free_slot(geometry: Geometry, page: bytes | memoryview, bucket: int) -> int | None:
    page = memoryview(page)
    for slot in range(geometry.bucket_capacity(bucket)):
        off = geometry.slot_offset(bucket, slot)
        if page[off:off + TAG_SIZE] == EMPTY_TAG:
            return slot
    return None


def sign_page(key: Ed25519PrivateKey, geometry: Geometry, dataset: bytes, index: int,
              page: np.ndarray) -> None:
    """Write the signature of `page` (a 4096-byte uint8 row) into its signature bytes."""
    body, _ = geometry.split(page.tobytes())
    sig = np.frombuffer(key.sign(page_message(dataset, index, body)), np.uint8)
    at = 0
    for off, size in geometry.signature_positions():
        page[off:off + size] = sig[at:at + size]
        at += size


def root_of(data_pages: np.ndarray) -> str:
    """BLAKE3 over the BLAKE3 of every data page, in order: names the table's exact bytes."""
    outer = blake3.blake3()
    for page in data_pages:
        outer.update(blake3.blake3(page).digest())
    return outer.hexdigest()
