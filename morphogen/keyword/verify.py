"""The client's half of a lookup, without I/O: which pages to ask for, and what the answer
says once every page in it is checked against the owner's signature.

A lookup asks for the three candidate pages of its key, always three (two candidates on one
page are still two queries), so every lookup costs the servers the same. The check runs over
every page of the answer before any value is read, and a bad page anywhere gives the one
error with the one message: the outcome never depends on which key was looked up or which of
its pages was bad, so a server that corrupts an answer learns nothing from the failure.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from morphogen.constants import PAGE_SIZE
from morphogen.keyword.descriptor import Descriptor, KeywordIntegrityError
from morphogen.keyword.hashing import candidates, candidates_many, pack_keys
from morphogen.keyword.pages import find_value, tag_of
from morphogen.keyword.signing import page_message, verify

ANSWER_FAILED = ("an answer failed verification: the pages the servers returned are not the "
                 "ones the data owner signed (a server answered wrongly, or the parties serve "
                 "different tables)")


_POOL: ThreadPoolExecutor | None = None
# batches from this many keys hash through the compiled twin (the scalar hash costs ~15 us a
# candidate in Python; the twin's first call in a fresh process loads or compiles it)
_VECTOR_FROM = 8


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1)),
                                   thread_name_prefix="kw-verify")
    return _POOL


def plan(descriptor: Descriptor, keys: Sequence[bytes]) -> tuple[list[int], list[tuple]]:
    """The pages to read (three per key, in key order) and each key's candidate buckets."""
    g = descriptor.geometry
    if len(keys) >= _VECTOR_FROM:
        packed = candidates_many(*pack_keys([bytes(k) for k in keys]), descriptor.seeds,
                                 g.num_buckets)
        buckets = [tuple(row) for row in packed.tolist()]
    else:
        buckets = [candidates(bytes(k), descriptor.seeds, g.num_buckets) for k in keys]
    return [g.bucket_page(b) for trio in buckets for b in trio], buckets


def check(descriptor: Descriptor, trusted: Ed25519PublicKey, keys: Sequence[bytes],
          buckets: Sequence[tuple], pages: Sequence[bytes]) -> list[bytes | None]:
    """Each key's value (None when none of its three pages holds it), after every page's
    signature is checked; KeywordIntegrityError when any page is not as signed."""
    g = descriptor.geometry
    if len(pages) != 3 * len(keys):
        raise KeywordIntegrityError(ANSWER_FAILED)
    # every page, even one that appears twice: skipping repeats would make the time a lookup
    # takes (which a server sees between requests) depend on where the keys' candidates fall
    items = [(g.bucket_page(buckets[i // 3][i % 3]), bytes(page))
             for i, page in enumerate(pages)]

    def one(item: tuple[int, bytes]) -> bool:
        index, page = item
        if len(page) != PAGE_SIZE:
            return False
        body, signature = g.split(page)
        return verify(trusted, signature, page_message(descriptor.dataset, index, body))

    # Ed25519 verification drops the GIL: a batch's pages verify on every core
    results = list(_pool().map(one, items)) if len(items) > 3 else map(one, items)
    if not all(list(results)):
        raise KeywordIntegrityError(ANSWER_FAILED)
    out: list[bytes | None] = []
    for k, key in enumerate(keys):
        tag = tag_of(descriptor.dataset, bytes(key))
        found = [find_value(g, pages[3 * k + j], buckets[k][j], tag) for j in range(3)]
        out.append(next((v for v in found if v is not None), None))
    return out


def descriptor_of(page: bytes, trusted: Ed25519PublicKey, num_pages: int) -> Descriptor:
    """The descriptor read from a table's last page, checked against what the servers serve."""
    desc = Descriptor.from_page(page, trusted)
    if desc.geometry.num_pages != num_pages:
        raise KeywordIntegrityError(
            f"the signed descriptor describes {desc.geometry.num_pages} pages; the servers "
            f"serve {num_pages}")
    return desc
