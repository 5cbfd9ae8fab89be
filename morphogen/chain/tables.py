"""The accounts, storage and code tables of one chain, in one matrix under one owner key.

The three keyword tables are built from a state export's records and joined
(`morphogen.keyword.build.join_tables`): one publication changes all three, and every
version names one block in each. Each table gets room to grow (`room` times its starting
records, and at least `min_records`), since a follower inserts every new account, slot and
contract into it; a table that fills up is refused with its numbers, never overflowed.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from morphogen.chain.export import StateRecords
from morphogen.chain.state import ACCOUNT_VALUE_SIZE, CODE_VALUE_SIZE, STORAGE_VALUE_SIZE
from morphogen.keyword.build import DEFAULT_LOAD, Draws, KeywordTable, build_table, join_tables
from morphogen.keyword.descriptor import Anchor
from morphogen.keyword.layout import Geometry

TABLES = ("accounts", "storage", "code")
VALUE_SIZES = {"accounts": ACCOUNT_VALUE_SIZE, "storage": STORAGE_VALUE_SIZE,
               "code": CODE_VALUE_SIZE}


def buckets_for(records: int, value_size: int, *, room: float, min_records: int) -> int:
    """Buckets of a page-layout table that holds `room` times `records` (at least
    `min_records`) at the default load."""
    per_bucket = Geometry("page", value_size, 1).slots_per_bucket
    wanted = max(int(records * room), min_records, 1)
    return max(1, -(-wanted // int(per_bucket * DEFAULT_LOAD["page"])))


def table_draws(seed: int | None, name: str) -> Draws:
    """The random choices of table `name`: each table draws from a stream of its own, so that
    a builder knows every table's first draws before placing any (`morphogen.chain.bulk`)."""
    return Draws(None if seed is None else f"{seed}/{name}")


def build_chain_tables(records: StateRecords, signing_key: Ed25519PrivateKey, anchor: Anchor,
                       *, room: float = 4.0, min_records: int = 4096, seed: int | None = None,
                       created: int | None = None) -> KeywordTable:
    """The three tables of a state export's records at block `anchor`, joined. `seed` and
    `created` fix the random choices and the time (`build_table`): the same records then
    make the same bytes."""
    if room < 1 or min_records < 0:
        raise ValueError("room is at least 1 and min_records at least 0")
    built = []
    for name in TABLES:
        pairs = list(getattr(records, name))
        size = VALUE_SIZES[name]
        built.append(build_table(
            pairs, value_size=size, signing_key=signing_key, anchor=anchor, name=name,
            num_buckets=buckets_for(len(pairs), size, room=room, min_records=min_records),
            draws=table_draws(seed, name), created=created))
    return join_tables(built)
