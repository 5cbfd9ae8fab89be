"""Whether a signed version is fresh enough: never older than what a client has seen, nor
than its caller's bounds.

A signature proves who made a version, not that it is the latest: parties restored from a
backup, restarted behind the owner, or replaying an old version together serve pages that
verify. What protects a client is what it remembers (the highest version and block it has
accepted) and what its caller knows from elsewhere (a version, a block, a clock).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from morphogen.keyword.descriptor import Descriptor


@dataclass(frozen=True)
class Bounds:
    """What the caller allows: versions and blocks from, and an age up to (seconds)."""

    version: int = 0
    block: int = 0
    max_age: float | None = None


def stale(desc: Descriptor, bounds: Bounds, seen_version: int, seen_block: int,
          now: float | None = None) -> str | None:
    """Why `desc` is too old for a client that has seen `seen_version` and `seen_block` under
    `bounds`, or None when it is not."""
    floor = max(bounds.version, seen_version)
    if desc.version < floor:
        who = ("this client has already read version" if seen_version >= bounds.version
               else "its caller trusts version")
        return f"the servers serve version {desc.version} of the table and {who} {floor}"
    # A newer version may name an older block than one seen: the chain reorganised and the
    # owner signed the new branch (its version is what cannot go back). At the same version
    # the block cannot differ, so one that does is a replay.
    block = max(bounds.block, seen_block) if desc.version <= seen_version else bounds.block
    if max(block, seen_block) and desc.anchor is None:
        return (f"the servers serve version {desc.version}, which names no chain block, and "
                f"block {max(block, seen_block)} or later is wanted")
    if desc.anchor is not None and desc.anchor.number < block:
        who = ("this client has already read block" if seen_block >= bounds.block
               else "its caller trusts block")
        return (f"the servers serve block {desc.anchor.number} (version {desc.version}) and "
                f"{who} {block}")
    if bounds.max_age is not None:
        age = (time.time() if now is None else now) - desc.time
        if age > bounds.max_age:
            return (f"the servers serve version {desc.version}, made {age:.0f} s ago; the "
                    f"caller accepts {bounds.max_age:g} s at most")
    return None
