"""Named tables: contiguous page ranges of one snapshot's matrix, each queried on its own.

A table is `[first_page, first_page + num_pages)` of the matrix, with a DPF domain of its own
that covers exactly its pages (the no-aliasing rule of PROTOCOL.md, applied to the table): a
client's keys address pages 0..num_pages-1 of the table, and a query of it scans only that
range. Tables are part of the snapshot, never of a party's configuration, so one publication
(page updates, a rotation) changes all of them at once under one epoch and identity.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from morphogen.snapshot.layout import domain_bits_for

# Lowercase, so that two names never differ only by case in a URL, a log or a metric label.
TABLE_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,31}")


class TableError(ValueError):
    """A table definition that does not fit its matrix (the manifest wraps it)."""


@dataclass(frozen=True)
class Table:
    name: str
    first_page: int
    num_pages: int

    @property
    def stop_page(self) -> int:
        return self.first_page + self.num_pages

    @property
    def domain_bits(self) -> int:
        return domain_bits_for(self.num_pages)

    def overlap(self, first_page: int, stop_page: int) -> tuple[int, int] | None:
        """The part of `[first_page, stop_page)` (global pages) inside this table, if any."""
        lo, hi = max(first_page, self.first_page), min(stop_page, self.stop_page)
        return (lo, hi) if lo < hi else None

    def advertised(self) -> dict[str, int]:
        """The table's entry in `GET /epoch` and shard infos."""
        return {"first_page": self.first_page, "num_pages": self.num_pages,
                "domain_bits": self.domain_bits}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_tables(data: Any, matrix_pages: int) -> tuple[Table, ...]:
    """The tables of a manifest's `tables` list (parsed JSON or `Table`s), checked against a
    matrix of `matrix_pages` pages."""
    if not isinstance(data, list | tuple):
        raise TableError(f"tables must be a list, got {type(data).__name__}")
    out: list[Table] = []
    for i, item in enumerate(data):
        if isinstance(item, Table):
            item = {"name": item.name, "first_page": item.first_page,
                    "num_pages": item.num_pages}
        if not isinstance(item, dict):
            raise TableError(f"table {i} must be an object, got {type(item).__name__}")
        extra = sorted(set(item) - {"name", "first_page", "num_pages"})
        if extra:
            raise TableError(f"table {i} has unknown field(s) {', '.join(extra)}")
        name = item.get("name")
        if not isinstance(name, str) or not TABLE_NAME.fullmatch(name):
            raise TableError(
                f"table {i}: name {name!r} must match {TABLE_NAME.pattern} (lowercase)"
            )
        first, count = item.get("first_page"), item.get("num_pages")
        if not _is_int(first) or not _is_int(count):
            raise TableError(f"table {name!r}: first_page and num_pages must be integers")
        if count < 1:
            raise TableError(f"table {name!r} is empty (num_pages {count})")
        if first < 0 or first + count > matrix_pages:
            raise TableError(
                f"table {name!r} [{first}, {first + count}) is outside the matrix of "
                f"{matrix_pages} pages"
            )
        out.append(Table(name, first, count))
    names = [t.name for t in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise TableError(f"table name {dup!r} is used twice")
    return tuple(out)


def tables_digest(tables: Iterable[Table]) -> str:
    """Hex digest of the tables in order: what an epoch identity adds for them."""
    canon = json.dumps([[t.name, t.first_page, t.num_pages] for t in tables],
                       separators=(",", ":"))
    return hashlib.blake2b(canon.encode(), digest_size=16).hexdigest()


def advertised(tables: Iterable[Table]) -> dict[str, dict[str, int]]:
    """`{name: {"first_page", "num_pages", "domain_bits"}}`, as `GET /epoch` lists them."""
    return {t.name: t.advertised() for t in tables}
