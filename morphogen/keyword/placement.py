"""Where a keyword table's pages are read among what the servers serve, and which data answered.

A matrix may hold several keyword tables (`join_tables`), each in parts (its data, its tree
levels, its descriptor). Where the parties serve a part as a table of its own, its pages are
read from that table (a scan of that part only); where they do not (the reference's server,
which serves one matrix), from the whole matrix. Chosen by what the servers serve, never by
the key. Every answer names the data it came from, an epoch id and an identity (`View`).
"""

from __future__ import annotations

from typing import Any

from morphogen.keyword.actions import Get
from morphogen.keyword.layout import DATA_TABLE, DESCRIPTOR_TABLE, part_table

View = tuple[int, "str | None"]


class UnknownKeywordTable(ValueError):
    """The servers name no keyword table of that name."""


def same_view(a: View, b: View) -> bool:
    # identities are compared where both sides publish one: the reference server has none
    return a[0] == b[0] and (a[1] is None or b[1] is None or a[1] == b[1])


def views_of(info: Any) -> list[View]:
    epochs = getattr(info, "epoch_ids", None) or (info.epoch_id, info.epoch_id)
    idents = getattr(info, "identities", None) or (getattr(info, "identity", None),) * 2
    return list(zip(epochs, idents, strict=True))


def served_table(info: Any, name: str) -> tuple[int, int] | None:
    table = (getattr(info, "tables", None) or {}).get(name)
    if table is None:
        return None
    get = table.get if isinstance(table, dict) else lambda k: getattr(table, k)
    return int(get("first_page")), int(get("num_pages"))


def route(info: Any, name: str, first: int, size: int, pages: list[int]) -> Get:
    """Pages `pages` of the keyword table's part `name` (`size` pages from matrix page
    `first`): from the party table of that name when the servers serve it as such, else from
    the whole matrix. Chosen by what the servers serve, never by the key."""
    if served_table(info, name) == (first, size):
        return Get(pages, size, name)
    return Get([first + p for p in pages], info.num_pages, None)


def table_span(info: Any, table: str) -> tuple[int, int]:
    """(first page, pages) of keyword table `table` in the matrix the servers serve: the
    whole matrix for "", else from the `<table>.data` and `<table>.descriptor` tables they
    name (what the table's signed descriptor then has to agree with)."""
    if not table:
        return 0, int(info.num_pages)
    data = served_table(info, part_table(table, DATA_TABLE))
    desc = served_table(info, part_table(table, DESCRIPTOR_TABLE))
    if data is None or desc is None or desc[0] < data[0]:
        raise UnknownKeywordTable(f"the servers serve no keyword table named {table!r}")
    return data[0], desc[0] + 1 - data[0]

