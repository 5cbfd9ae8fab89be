"""What names a publication and what it builds on: its id (the admin's idempotency key), the
request a re-sent id must repeat, the parent identity it may name, and the identity a shard
reports, checked. `morphogen.party.publisher` runs publications on these."""

from __future__ import annotations

import secrets
from typing import Any

from morphogen.party.combine import ShardFailure
from morphogen.protocol.changes import ChangeBatch
from morphogen.protocol.identity import EpochIdentity


def identity_of(info: dict[str, Any]) -> EpochIdentity:
    """The identity a shard's info reports, rebuilt and checked against its digest."""
    ident = EpochIdentity(
        int(info["epoch_id"]), str(info["identity_snapshot"]),
        str(info["update_chain"]).removeprefix("0x"),
    )
    if ident.digest != info["identity"]:
        raise ShardFailure(f"shard {info.get('shard')} reports an inconsistent identity")
    return ident


class ParentMismatch(ValueError):
    """A publication names a parent identity that is not the party's head."""


def check_parent(base: EpochIdentity | None, parent: str | None) -> None:
    """Refuse a publication whose named parent is not the head it would apply on: another
    publisher got there first, and applying it anyway would order this party's publications
    differently from the other party's."""
    if parent is not None and (base is None or base.digest != parent):
        head = base.digest if base is not None else "none"
        raise ParentMismatch(
            f"this party's head is {head}, not the parent {parent} the publication names: "
            "another publisher published in between. Nothing was changed; read both parties' "
            "heads (morphogen admin status) and publish on what they serve")


def new_publication_id() -> str:
    return "p-" + secrets.token_hex(12)


def updates_request(changes: ChangeBatch) -> str:
    """What a re-sent publication id must ask again: the batch."""
    return batch_request(changes.digest)


def batch_request(digest: str) -> str:
    """`updates_request` of the batch with `digest` (a publication in parts names it)."""
    return "updates:" + digest


def rotation_request(path: str, checksum: str) -> str:
    return f"rotation:{checksum}:{path}"
