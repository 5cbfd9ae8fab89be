"""The party's shards as the router and the publisher both see them: the link to one shard
deployment (`ShardLink`, what deployments/shard.py serves) and the layout they serve together.

The party (`morphogen.party.router`) fans queries out over these links; the publisher
(`morphogen.party.publisher`) drives publications over the same links. Both build on this
module, neither on the other's.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from morphogen.constants import KEY_FORMAT_V1, KEY_FORMATS
from morphogen.party.combine import ShardFailure
from morphogen.party.tables import TableSlice
from morphogen.protocol.changes import ChangeBatch
from morphogen.protocol.identity import EpochIdentity
from morphogen.protocol.packed import AnyBatch
from morphogen.snapshot.tables import Table


class ShardLink(Protocol):
    """One shard deployment as the party calls it (deployments/shard.py's methods)."""

    def scan(
        self, batch: AnyBatch, want: EpochIdentity | None, table: TableSlice | None = None
    ) -> Awaitable[tuple[EpochIdentity, Any]]: ...
    def info(self) -> Awaitable[dict[str, Any]]: ...
    # the publication steps reach every replica of the shard
    def replicas(self) -> Awaitable[list[dict[str, Any]]]: ...
    def prepare_updates(
        self, epoch_id: int, changes: ChangeBatch, base_epoch: int, op: str, target: str
    ) -> Awaitable[int]: ...
    def prepare_snapshot(
        self, epoch_id: int, path: str, checksum: str | None, op: str, target: str
    ) -> Awaitable[dict[str, int]]: ...
    def commit(self, epoch_id: int, op: str, target: str) -> Awaitable[int]: ...
    def abort(self, epoch_id: int, op: str) -> Awaitable[None]: ...
    def catch_up(self) -> Awaitable[dict[str, Any]]: ...


class Layout:
    """What the shards serve together; checked to tile [0, num_pages) exactly. `tables`: the
    snapshot's named tables, which every shard must report alike."""

    def __init__(self, infos: list[dict[str, Any]]) -> None:
        first = infos[0]
        for key in ("num_pages", "domain_bits", "num_shards", "tables"):
            if any(i.get(key) != first.get(key) for i in infos):
                raise ShardFailure(f"shards disagree on {key}")
        if first["num_shards"] != len(infos):
            raise ShardFailure(f"{len(infos)} shard deployments for {first['num_shards']} shards")
        edge = 0
        for idx, i in enumerate(infos):
            if i["shard"] != idx or i["first_page"] != edge:
                raise ShardFailure(f"shard {idx} does not start where shard {idx - 1} ends")
            edge = i["stop_page"]
        if edge != first["num_pages"]:
            raise ShardFailure("shards do not cover every page")
        self.ranges = [(int(i["first_page"]), int(i["stop_page"])) for i in infos]
        self.tables = {name: Table(name, int(t["first_page"]), int(t["num_pages"]))
                       for name, t in (first.get("tables") or {}).items()}
        self.num_pages: int = first["num_pages"]
        self.domain_bits: int = first["domain_bits"]
        self.num_shards: int = len(infos)
        self.checksum: str | None = first.get("checksum")
        self.identities = {i["identity"] for i in infos}
        self.epoch_id: int = max(int(i["epoch_id"]) for i in infos)
        # the formats every shard scans (a shard naming none is one of before packed keys)
        taken = [set(i.get("key_formats") or (KEY_FORMAT_V1,)) for i in infos]
        self.key_formats: tuple[str, ...] = tuple(
            f for f in KEY_FORMATS if all(f in t for t in taken))

    @property
    def table_domains(self) -> dict[str, int]:
        return {name: t.domain_bits for name, t in self.tables.items()}

    @property
    def shape(self) -> tuple[int, int, dict[str, Table]]:
        """What keys are checked against: the matrix's size and domain, and the tables."""
        return self.num_pages, self.domain_bits, self.tables
