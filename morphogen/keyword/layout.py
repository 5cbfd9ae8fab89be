"""Where records sit in the pages of a keyword table.

Every 4 KiB page ends with the owner's 64-byte signature, so a page is self-checking and a
lookup stays one query of three keys. Two bucket shapes:

- ``page``: a bucket is a whole page; a key may sit in any slot of its three candidate pages,
  which lets the table fill far beyond what one-slot buckets reach.
- ``row``: the reference's one-row buckets: ``rows_per_page = 4096 / row_size`` and bucket
  ``b`` is row ``b % rows_per_page`` of page ``b // rows_per_page``, so the reference's
  addressing finds the page. Rows that overlap the signature hold nothing.

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
            if self.row_size < 1 or PAGE_SIZE % self.row_size:
                raise ValueError(f"row_size {self.row_size} must divide {PAGE_SIZE}")
            if self.slot_size > self.row_size:
                raise ValueError(f"value_size {self.value_size} plus the {TAG_SIZE}-byte tag "
                                 f"does not fit in a {self.row_size}-byte row")
            if self.usable_rows < 1:
                raise ValueError(f"row_size {self.row_size} leaves no row beside the signature")

    @property
    def slot_size(self) -> int:
        return TAG_SIZE + self.value_size

    @property
    def rows_per_page(self) -> int:
        return PAGE_SIZE // self.row_size if self.layout == "row" else 1

    @property
    def usable_rows(self) -> int:
        """Rows of a page that lie wholly before the signature."""
        return BODY_SIZE // self.row_size if self.layout == "row" else 1

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
        if self.layout == "page":
            return self.num_buckets * self.slots_per_bucket
        full, rest = divmod(self.num_buckets, self.rows_per_page)
        return full * self.usable_rows + min(rest, self.usable_rows)

    def bucket_page(self, bucket: int) -> int:
        return bucket // self.rows_per_page

    def bucket_capacity(self, bucket: int) -> int:
        if self.layout == "page":
            return self.slots_per_bucket
        return 1 if bucket % self.rows_per_page < self.usable_rows else 0

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
