"""Where records sit in the pages of a keyword table.

Every 4 KiB page ends with the owner's 64-byte signature, so a page is self-checking and a
lookup stays one query of three keys. Two bucket shapes:

- ``page``: a bucket is a whole page; a key may sit in any slot of its three candidate pages,
  which lets the table fill far beyond what one-slot buckets reach.
- ``row``: the reference's one-row buckets: ``rows_per_page = 4096 / row_size`` and bucket
  ``b`` is row ``b % rows_per_page`` of page ``b // rows_per_page``, so the reference's
  addressing finds the page. The signature is spread over the rows, ``64 / rows_per_page``
  bytes at the end of each, so every row is a live bucket (a reserved signature row would
  leave some keys with no live candidate at all).

A slot is a 16-byte tag of the key followed by the value; an all-zero tag marks it empty. The
table's last page is its signed descriptor, never a bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from morphogen.constants import PAGE_SIZE

SIGNATURE_SIZE = 64
BODY_SIZE = PAGE_SIZE - SIGNATURE_SIZE
TAG_SIZE = 16
EMPTY_TAG = bytes(TAG_SIZE)

Layout = Literal["page", "row"]


@dataclass(frozen=True)
class Geometry:
    layout: Layout
    value_size: int
    num_buckets: int
    row_size: int = 0  # row layout only

    def __post_init__(self) -> None:
        if self.layout not in ("page", "row"):
            raise ValueError(f"layout is 'page' or 'row', not {self.layout!r}")
        if self.value_size < 1:
            raise ValueError("value_size must be at least 1 byte")
        if self.num_buckets < 1:
            raise ValueError("a table has at least one bucket")
        if self.layout == "page":
            if self.slot_size > BODY_SIZE:
                raise ValueError(f"value_size {self.value_size}: a slot ({self.slot_size} bytes "
                                 f"with its tag) does not fit in a page ({BODY_SIZE} usable)")
        else:
            if self.row_size < SIGNATURE_SIZE or PAGE_SIZE % self.row_size:
                raise ValueError(f"row_size {self.row_size} must divide {PAGE_SIZE} and be at "
                                 f"least {SIGNATURE_SIZE} (each row carries a share of the "
                                 "page's signature)")
            if self.slot_size > self.row_size - self.signature_per_row:
                raise ValueError(f"value_size {self.value_size} plus the {TAG_SIZE}-byte tag "
                                 f"does not fit in a {self.row_size}-byte row beside its "
                                 f"{self.signature_per_row} signature bytes")

    @property
    def slot_size(self) -> int:
        return TAG_SIZE + self.value_size

    @property
    def rows_per_page(self) -> int:
        return PAGE_SIZE // self.row_size if self.layout == "row" else 1

    @property
    def signature_per_row(self) -> int:
        return SIGNATURE_SIZE // self.rows_per_page if self.layout == "row" else 0

    @property
    def slots_per_bucket(self) -> int:
        return BODY_SIZE // self.slot_size if self.layout == "page" else 1

    @property
    def data_pages(self) -> int:
        return -(-self.num_buckets // self.rows_per_page)

    @property
    def num_pages(self) -> int:
        """Data pages and the descriptor page after them."""
        return self.data_pages + 1

    @property
    def descriptor_page(self) -> int:
        return self.data_pages

    @property
    def capacity(self) -> int:
        """Slots a record can occupy in the whole table."""
        return self.num_buckets * self.slots_per_bucket

    def bucket_page(self, bucket: int) -> int:
        return bucket // self.rows_per_page

    def bucket_capacity(self, bucket: int) -> int:
        return self.slots_per_bucket

    def split(self, page: bytes | memoryview) -> tuple[bytes, bytes]:
        """(the signed body, the signature) of a data page."""
        page = bytes(page)
        if self.layout == "page":
            return page[:BODY_SIZE], page[BODY_SIZE:]
        keep = self.row_size - self.signature_per_row
        rows = [page[i:i + self.row_size] for i in range(0, PAGE_SIZE, self.row_size)]
        return b"".join(r[:keep] for r in rows), b"".join(r[keep:] for r in rows)

    def signature_positions(self) -> list[tuple[int, int]]:
        """(offset, length) of each piece of the signature in a data page, in order."""
        if self.layout == "page":
            return [(BODY_SIZE, SIGNATURE_SIZE)]
        keep = self.row_size - self.signature_per_row
        return [(i + keep, self.signature_per_row) for i in range(0, PAGE_SIZE, self.row_size)]

    def slot_offset(self, bucket: int, slot: int) -> int:
        """Byte offset of a slot within its page."""
        if self.layout == "page":
            return slot * self.slot_size
        return (bucket % self.rows_per_page) * self.row_size

    def to_dict(self) -> dict:
        out = {"layout": self.layout, "value_size": self.value_size,
               "num_buckets": self.num_buckets}
        if self.layout == "row":
            out["row_size"] = self.row_size
        return out
