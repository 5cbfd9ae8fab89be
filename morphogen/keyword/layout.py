"""Where records sit in the pages of a keyword table.

A page holds nothing but slots: what proves a page is the hash tree over the data pages
(`morphogen.keyword.tree`), whose root the owner signs once per version, so a lookup stays one
query of three keys into the data and the whole 4 KiB is usable. Two bucket shapes:

- ``page``: a bucket is a whole page; a key may sit in any slot of its three candidate pages,
  which lets the table fill far beyond what one-slot buckets reach.
- ``row``: the reference's one-row buckets: ``rows_per_page = 4096 / row_size`` and bucket
  ``b`` is row ``b % rows_per_page`` of page ``b // rows_per_page``, so the reference's
  addressing finds the page.

A slot is a 16-byte tag of the key followed by the value; an all-zero tag marks it empty. After
the data pages come the tree's levels, then the signed descriptor, the matrix's last page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from morphogen.constants import PAGE_SIZE
from morphogen.keyword.tree import level_sizes

TAG_SIZE = 16
EMPTY_TAG = bytes(TAG_SIZE)

Layout = Literal["page", "row"]
DATA_TABLE = "data"
DESCRIPTOR_TABLE = "descriptor"


def level_table(level: int) -> str:
    return f"tree{level}"


def part_table(name: str, part: str) -> str:
    """The party table of part `part` (data, treeN, descriptor) of keyword table `name`."""
    return f"{name}.{part}" if name else part


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
            if self.slot_size > PAGE_SIZE:
                raise ValueError(f"value_size {self.value_size}: a slot ({self.slot_size} bytes "
                                 f"with its tag) does not fit in a {PAGE_SIZE}-byte page")
        else:
            if self.row_size < 1 or PAGE_SIZE % self.row_size:
                raise ValueError(f"row_size {self.row_size} must divide {PAGE_SIZE}")
            if self.slot_size > self.row_size:
                raise ValueError(f"value_size {self.value_size} plus the {TAG_SIZE}-byte tag "
                                 f"does not fit in a {self.row_size}-byte row")

    @property
    def slot_size(self) -> int:
        return TAG_SIZE + self.value_size

    @property
    def rows_per_page(self) -> int:
        return PAGE_SIZE // self.row_size if self.layout == "row" else 1

    @property
    def slots_per_bucket(self) -> int:
        return PAGE_SIZE // self.slot_size if self.layout == "page" else 1

    @property
    def data_pages(self) -> int:
        return -(-self.num_buckets // self.rows_per_page)

    @property
    def levels(self) -> list[int]:
        """Pages of each hash-tree level over the data pages, lowest first
        (`morphogen.keyword.tree`)."""
        return level_sizes(self.data_pages)

    def level_first(self, level: int) -> int:
        """The matrix index of the first page of tree level `level` (1 = just above the data)."""
        return self.data_pages + sum(self.levels[:level - 1])

    @property
    def num_pages(self) -> int:
        """Data pages, the tree levels after them, and the descriptor page last."""
        return self.data_pages + sum(self.levels) + 1

    @property
    def descriptor_page(self) -> int:
        return self.num_pages - 1

    def tables(self, first: int = 0, name: str = "") -> list[dict]:
        """The party tables the keyword table holds: `data`, `tree1` .. `treeN`, `descriptor`,
        each a page range the client reads with the scan of that range only. In a matrix of
        several keyword tables, this one starts at page `first` and its parts are named
        `<name>.data` etc."""
        out = [{"name": part_table(name, DATA_TABLE), "first_page": first,
                "num_pages": self.data_pages}]
        for k, size in enumerate(self.levels, 1):
            out.append({"name": part_table(name, level_table(k)),
                        "first_page": first + self.level_first(k), "num_pages": size})
        out.append({"name": part_table(name, DESCRIPTOR_TABLE),
                    "first_page": first + self.descriptor_page, "num_pages": 1})
        return out

    @property
    def capacity(self) -> int:
        """Slots a record can occupy in the whole table."""
        return self.num_buckets * self.slots_per_bucket

    def bucket_page(self, bucket: int) -> int:
        return bucket // self.rows_per_page

    def bucket_capacity(self, bucket: int) -> int:
        return self.slots_per_bucket

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
