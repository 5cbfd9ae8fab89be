"""The table descriptor: the one thing the data owner signs for a version.

It names the dataset, the version, when it was made, the chain block it reflects (when it
reflects one), the geometry, the seeds, and the root of the hash tree over the data pages. It
lives in the matrix's last page (its own one-page party table): magic, length, canonical JSON,
zero padding, signature. A client that holds only the owner's public key checks its signature
once per version and then checks every page it reads by hashing up to the root.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from morphogen.constants import PAGE_SIZE
from morphogen.keyword.layout import Geometry
from morphogen.keyword.signing import (
    DATASET_SIZE,
    SIGNATURE_SIZE,
    descriptor_message,
    public_bytes,
    verify,
)
from morphogen.keyword.tree import SCHEME as TREE_SCHEME

MAGIC = b"MGKWDSC2"
FORMAT = "morphogen-keyword/2"
TAG_SCHEME = "blake3-128(domain|dataset|key)"
BODY_SIZE = PAGE_SIZE - SIGNATURE_SIZE
_HASH = re.compile(r"0x[0-9a-f]{64}")
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,20}")  # `<name>.descriptor` is a party table name


class KeywordIntegrityError(RuntimeError):
    """What the servers answered is not what the data owner signed."""


class StaleTableError(KeywordIntegrityError):
    """The servers serve an older version of the table than the client has already seen, or
    than its caller's bound: signed by the owner once, but no longer the table (a restored
    backup, parties restarted behind the owner, or both parties replaying an old version)."""


@dataclass(frozen=True)
class Anchor:
    """The chain block a version reflects: chain id, block number, block hash (0x + 64 hex)."""

    chain_id: int
    number: int
    hash: str

    def __post_init__(self) -> None:
        if self.chain_id < 1 or self.number < 0 or not _HASH.fullmatch(self.hash):
            raise ValueError("an anchor is a chain id (1 or more), a block number (0 or more) "
                             "and a block hash (0x and 64 lower-case hex digits)")

    def to_dict(self) -> dict:
        return {"chain_id": self.chain_id, "number": self.number, "hash": self.hash}

    @classmethod
    def from_dict(cls, d: dict) -> Anchor:
        return cls(int(d["chain_id"]), int(d["number"]), str(d["hash"]))


@dataclass(frozen=True)
class Descriptor:
    dataset: bytes
    version: int
    geometry: Geometry
    seeds: tuple[int, int, int]
    public_key: bytes
    root: str  # the hash tree's root over the data pages, hex
    records: int
    time: int = 0  # when the owner made the version, Unix seconds
    anchor: Anchor | None = None
    name: str = ""  # the table's name in a matrix of several (`parts_of`); "" when alone

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "dataset": self.dataset.hex(),
            "version": self.version,
            "time": self.time,
            "anchor": self.anchor.to_dict() if self.anchor else None,
            **self.geometry.to_dict(),
            "num_pages": self.geometry.num_pages,
            "levels": self.geometry.levels,
            "seeds": [str(s) for s in self.seeds],  # 64-bit: strings survive every JSON reader
            "tag": TAG_SCHEME,
            "tree": TREE_SCHEME,
            "public_key": self.public_key.hex(),
            "root": self.root,
            "records": self.records,
            **({"table": self.name} if self.name else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Descriptor:
        if d.get("format") != FORMAT or d.get("tag") != TAG_SCHEME \
                or d.get("tree") != TREE_SCHEME:
            raise ValueError(f"not a {FORMAT} descriptor (format {d.get('format')!r}; a table "
                             "of an older format is rebuilt with `morphogen build --records`)")
        geometry = Geometry(d["layout"], int(d["value_size"]), int(d["num_buckets"]),
                            int(d.get("row_size", 0)))
        if int(d["num_pages"]) != geometry.num_pages or list(d["levels"]) != geometry.levels:
            raise ValueError("the descriptor's page count does not match its geometry")
        seeds = tuple(int(s) for s in d["seeds"])
        if len(seeds) != 3:
            raise ValueError("a descriptor has three seeds")
        dataset = bytes.fromhex(d["dataset"])
        if len(dataset) != DATASET_SIZE:
            raise ValueError("a dataset id is 16 bytes")
        anchor = Anchor.from_dict(d["anchor"]) if d.get("anchor") is not None else None
        name = str(d.get("table", ""))
        if name and not _NAME.fullmatch(name):
            raise ValueError(f"table name {name[:40]!r} is not a plain name")
        return cls(dataset, int(d["version"]), geometry, seeds,  # type: ignore[arg-type]
                   bytes.fromhex(d["public_key"]), str(d["root"]), int(d["records"]),
                   int(d["time"]), anchor, name)

    def bumped(self, root: str, records: int, *, time: int, anchor: Anchor | None = None
               ) -> Descriptor:
        """The next version's descriptor; the anchor is the new version's own (none unless
        given: an old block must not stay named by new data)."""
        return replace(self, version=self.version + 1, root=root, records=records, time=time,
                       anchor=anchor)

    def to_page(self, key: Ed25519PrivateKey) -> bytes:
        if public_bytes(key.public_key()) != self.public_key:
            raise ValueError("the signing key is not the one the descriptor names")
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()
        if len(MAGIC) + 4 + len(text) > BODY_SIZE:
            raise ValueError("the descriptor does not fit in a page")
        body = (MAGIC + len(text).to_bytes(4, "little") + text).ljust(BODY_SIZE, b"\0")
        return body + key.sign(descriptor_message(body))

    @classmethod
    def from_page(cls, page: bytes, trusted: Ed25519PublicKey) -> Descriptor:
        """The descriptor in `page`, or KeywordIntegrityError when the owner did not sign it."""
        if len(page) != PAGE_SIZE:
            raise KeywordIntegrityError("the descriptor page is not 4096 bytes")
        body, sig = page[:BODY_SIZE], page[BODY_SIZE:]
        if not verify(trusted, bytes(sig), descriptor_message(body)):
            raise KeywordIntegrityError("the table descriptor is not signed by the trusted "
                                        "owner key (wrong key, not a keyword table, or a "
                                        "server answered wrongly)")
        raw = _text(body)
        if raw is None:
            raise KeywordIntegrityError("the signed descriptor page has no descriptor")
        try:
            desc = cls.from_dict(json.loads(raw))
        except (ValueError, KeyError, TypeError) as exc:
            raise KeywordIntegrityError(f"the signed descriptor is malformed: {exc}") from None
        if desc.public_key != public_bytes(trusted):
            raise KeywordIntegrityError("the descriptor names another owner key")
        return desc


def unsigned(page: bytes | memoryview) -> Descriptor:
    """The descriptor a page holds, its signature unchecked: for the owner's own copy (which
    tables a snapshot of its pages holds), never for what a server answered."""
    raw = _text(page)
    if raw is None:
        raise ValueError("the page holds no keyword descriptor")
    return Descriptor.from_dict(json.loads(raw))


def _text(body: bytes | memoryview) -> bytes | None:
    """The JSON text a descriptor page's body holds after its magic and length, or None."""
    body = bytes(body)
    if body[:len(MAGIC)] != MAGIC:
        return None
    size = int.from_bytes(body[len(MAGIC):len(MAGIC) + 4], "little")
    return body[len(MAGIC) + 4:len(MAGIC) + 4 + size]


@dataclass(frozen=True)
class Part:
    """One keyword table of a matrix: its name, its first page, its current descriptor."""

    name: str
    first: int
    descriptor: Descriptor

    @property
    def span(self) -> int:
        return self.descriptor.geometry.num_pages


def parts_of(pages: np.ndarray) -> list[Part]:
    """The keyword tables a matrix holds, first to last, from their own descriptor pages.

    A matrix holds one keyword table, or several back to back (accounts, storage and code of
    one chain block, say), each ending with its descriptor: the last page is the last table's
    descriptor, whose page count says where that table starts, and so on back to page 0. One
    publication of the matrix changes them all at once."""
    out: list[Part] = []
    end = len(pages)
    while end > 0:
        desc = unsigned(pages[end - 1])
        first = end - desc.geometry.num_pages
        if first < 0:
            raise ValueError("a keyword table's descriptor counts more pages than the matrix "
                             "has before it")
        out.append(Part(desc.name, first, desc))
        end = first
    out.reverse()
    names = [p.name for p in out]
    if len(out) > 1 and (not all(names) or len(set(names)) != len(names)):
        raise ValueError("the keyword tables of one matrix each have a name of their own")
    return out


def tables_of(pages: np.ndarray) -> list[dict]:
    """The party tables of a keyword matrix (`Geometry.tables` of each keyword table, named
    `<table>.data` etc. when the matrix holds several), from its own descriptor pages: what
    its snapshot's manifest names."""
    return [t for part in parts_of(pages)
            for t in part.descriptor.geometry.tables(part.first, part.name)]
