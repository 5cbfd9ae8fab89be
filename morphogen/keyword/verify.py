"""The client's half of a lookup, without I/O: which pages to ask for, and what the answer
says once every page in it is proven against the version's signed root.

A lookup asks for the three candidate pages of its key, always three (two candidates on one
page are still two queries), and for each of them the page on its path at every tree level
read privately: the same queries at every level for every key. The levels small enough are
read whole once per version (`Proof`) and every lookup ends its paths there. Every page of the
answer is hashed up its path before any value is read, and a bad page anywhere gives the one
error with the one message: the outcome never depends on which key was looked up or which of
its pages was bad, so a server that corrupts an answer learns nothing from the failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from morphogen.constants import PAGE_SIZE
from morphogen.keyword.descriptor import Descriptor, KeywordIntegrityError
from morphogen.keyword.hashing import candidates, candidates_many, pack_keys
from morphogen.keyword.pages import find_values, tag_of
from morphogen.keyword.tree import FANOUT, entry, leaf_hash, node_hash

ANSWER_FAILED = ("an answer failed verification: the pages the servers returned are not the "
                 "ones the data owner signed for this version (a server answered wrongly, or "
                 "the parties serve different versions)")

# batches from this many keys hash through the compiled twin (the scalar hash costs ~15 us a
# candidate in Python; the twin's first call in a fresh process loads or compiles it)
_VECTOR_FROM = 8
# Tree levels of at most this many pages are read whole, once per version: 128 queries over
# 128 pages (16 k page scans, about one data scan of a 64 MiB table) against three more
# queries and one more request in every lookup. A table up to 16 k data pages then costs a
# lookup its data queries only; larger ones read their large levels a page per candidate.
WHOLE_LEVEL_PAGES = 128


@dataclass(frozen=True)
class Proof:
    """A version's checked descriptor and its tree levels read whole, each page proven up to
    the signed root. Lookups end their paths in `whole[private + 1]`."""

    descriptor: Descriptor
    private: int  # levels 1..private are read a page per candidate
    whole: dict[int, list[bytes]]


def private_levels(descriptor: Descriptor, whole_pages: int = WHOLE_LEVEL_PAGES) -> int:
    """How many of the lowest tree levels a lookup reads privately: those over `whole_pages`
    pages (never the top, one page)."""
    if whole_pages < 1:
        raise ValueError("whole_pages is at least 1 (the top level is always read whole)")
    return sum(1 for n in descriptor.geometry.levels if n > whole_pages)


def whole_pages_wanted(descriptor: Descriptor, private: int) -> dict[int, int]:
    """level -> its page count, for every level read whole."""
    levels = descriptor.geometry.levels
    return {k: levels[k - 1] for k in range(private + 1, len(levels) + 1)}


def prove_whole(descriptor: Descriptor, private: int, whole: dict[int, Sequence[bytes]]
                ) -> Proof:
    """`Proof` of the levels read whole, or KeywordIntegrityError: the top page must hash to
    the root, each page of a lower level to its entry in the level above."""
    levels = descriptor.geometry.levels
    ok = True
    pages = {k: [bytes(p) for p in whole.get(k, ())] for k in range(private + 1, len(levels) + 1)}
    for k, got in pages.items():
        ok &= len(got) == levels[k - 1] and all(len(p) == PAGE_SIZE for p in got)
    if not ok:
        raise KeywordIntegrityError(ANSWER_FAILED)
    top = len(levels)
    ok &= node_hash(pages[top][0]).hex() == descriptor.root
    for k in range(private + 1, top):
        for i, page in enumerate(pages[k]):
            ok &= entry(pages[k + 1][i // FANOUT], i) == node_hash(page)
    if not ok:
        raise KeywordIntegrityError(ANSWER_FAILED)
    return Proof(descriptor, private, pages)


def plan(proof: Proof, keys: Sequence[bytes]) -> tuple[list[list[int]], list[tuple]]:
    """The pages to read: the data pages (three per key, in key order), then for each level
    read privately the page on each of their paths; and each key's candidate buckets."""
    desc = proof.descriptor
    g = desc.geometry
    if len(keys) >= _VECTOR_FROM:
        packed = candidates_many(*pack_keys([bytes(k) for k in keys]), desc.seeds,
                                 g.num_buckets)
        buckets = [tuple(row) for row in packed.tolist()]
    else:
        buckets = [candidates(bytes(k), desc.seeds, g.num_buckets) for k in keys]
    data = [g.bucket_page(b) for trio in buckets for b in trio]
    wanted = [data]
    for _ in range(proof.private):
        wanted.append([p // FANOUT for p in wanted[-1]])
    return wanted, buckets


def check(proof: Proof, keys: Sequence[bytes], buckets: Sequence[tuple],
          answers: Sequence[Sequence[bytes]]) -> list[bytes | None]:
    """Each key's value (None when none of its three pages holds it), after every page of
    `answers` (as `plan` asked: data first, then each private level) is proven up to the
    root; KeywordIntegrityError when any is not as signed."""
    desc = proof.descriptor
    g = desc.geometry
    n = 3 * len(keys)
    if len(answers) != 1 + proof.private or any(len(a) != n for a in answers) or \
            any(len(p) != PAGE_SIZE for a in answers for p in a):
        raise KeywordIntegrityError(ANSWER_FAILED)
    end = proof.whole[proof.private + 1]
    ok = True
    # every path in full, even where two share pages: skipping repeats would make the time a
    # lookup takes (which a server sees between requests) depend on where the candidates fall
    for i in range(n):
        index = g.bucket_page(buckets[i // 3][i % 3])
        digest = leaf_hash(answers[0][i])
        for level in range(1, proof.private + 1):
            page = answers[level][i]
            ok &= entry(page, index) == digest
            digest = node_hash(page)
            index //= FANOUT
        ok &= entry(end[index // FANOUT], index) == digest
    if not ok:
        raise KeywordIntegrityError(ANSWER_FAILED)
    tags = [tag_of(desc.dataset, bytes(key)) for key in keys]
    found = find_values(g, answers[0], [b for trio in buckets for b in trio],
                        [t for t in tags for _ in range(3)])
    return [next((v for v in found[3 * k:3 * k + 3] if v is not None), None)
            for k in range(len(keys))]


def descriptor_of(page: bytes, trusted: Ed25519PublicKey, num_pages: int) -> Descriptor:
    """The descriptor read from a table's last page, checked against what the servers serve."""
    desc = Descriptor.from_page(page, trusted)
    if desc.geometry.num_pages != num_pages:
        raise KeywordIntegrityError(
            f"the signed descriptor describes {desc.geometry.num_pages} pages; the servers "
            f"serve {num_pages}")
    return desc
