"""Admin operations of one party, without Ray: publish a new epoch on every shard as one step.

An epoch is published in two phases (see `morphogen.party.epoch`): every shard *prepares* it off to
the side (page updates resolved, or its range of a new snapshot mapped and loaded) while the
current epoch keeps serving; only when every shard has prepared, and the commit is decided in
the party's log (morphogen.party.publisher), does every shard *commit* (a reference swap). Any
failure while preparing aborts the epoch on every shard and nothing changes. Between the first
and the last commit the router sees partials of two epochs and retries (never mixes them), so
to a client the switch is one step.

Epoch numbering: page updates publish `current + 1`; a rotation publishes
`max(current + 1, manifest epoch)`, so a snapshot's own epoch id is kept when it is ahead and
ids never go backwards. Both parties must receive the same operations in the same order: equal
epoch ids on A and B then mean equal matrices.

Everything here is transport-agnostic: the router hands in one coroutine factory per shard.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from morphogen.party.epoch import EpochError, StagingConflict
from morphogen.protocol.codec import ErrorCode, WireError, unavailable
from morphogen.protocol.dpf import DomainError
from morphogen.snapshot.manifest import Manifest, SnapshotError
from morphogen.snapshot.open import open_any
from morphogen.snapshot.reader import Snapshot
from morphogen.storage.location import is_remote, lies_under, requested_location

log = logging.getLogger(__name__)

ShardCall = Callable[[], Awaitable[Any]]

COMMIT_ATTEMPTS = 3


def new_op_id() -> str:
    """An opaque id naming one admin operation in the shards' staging slots."""
    return secrets.token_hex(8)


def unwrap(exc: BaseException) -> BaseException:
    """The original exception behind a transport wrapper (Ray's RayTaskError keeps it in
    `cause`)."""
    seen = 0
    while seen < 8:
        cause = getattr(exc, "cause", None)
        if not isinstance(cause, BaseException) or cause is exc:
            return exc
        exc = cause
        seen += 1
    return exc


def as_wire_error(exc: BaseException, retry_after: int = 1) -> WireError:
    """The client-facing error for a failure of a shard during an admin operation."""
    exc = unwrap(exc)
    if isinstance(exc, WireError):
        return exc
    if isinstance(exc, StagingConflict | EpochError):
        return WireError(409, ErrorCode.CONFLICT, f"{exc}; retry")
    if isinstance(exc, SnapshotError):
        return WireError(422, ErrorCode.BAD_SNAPSHOT, str(exc))
    if isinstance(exc, DomainError):
        return WireError(400, ErrorCode.BAD_DOMAIN, str(exc))
    if isinstance(exc, TimeoutError):
        return unavailable("a shard did not answer in time; nothing was changed", retry_after)
    if isinstance(exc, ValueError):
        # the shards' own checks (pages outside the matrix, ranges): messages name numbers
        return WireError(400, ErrorCode.BAD_UPDATE, str(exc))
    return unavailable(f"a shard failed ({type(exc).__name__}); nothing was changed",
                       retry_after)


@dataclass(frozen=True)
class PartyEpoch:
    """What the shards of a party report together."""

    epoch_id: int  # the epoch every shard serves (the highest one when they disagree)
    consistent: bool  # every shard serves the same data (one epoch identity)
    num_pages: int
    domain_bits: int
    pending_updates: int
    rotation_in_progress: bool
    snapshot_epoch_id: int | None
    snapshot_checksum: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "epoch_id": self.epoch_id,
            "pending_updates": self.pending_updates,
            "rotation_in_progress": self.rotation_in_progress,
            "snapshot_epoch_id": self.snapshot_epoch_id,
            "snapshot_checksum": self.snapshot_checksum,
        }


def same_data(infos: Sequence[dict[str, Any]]) -> bool:
    """Whether the shards' infos all name one epoch identity (equal epoch ids are not enough)."""
    return len({i["identity"] for i in infos}) == 1


def party_epoch(infos: Sequence[dict[str, Any]]) -> PartyEpoch:
    epochs = {int(i["epoch_id"]) for i in infos}
    first = infos[0]
    return PartyEpoch(
        epoch_id=max(epochs),
        consistent=same_data(infos),
        num_pages=int(first["num_pages"]),
        domain_bits=int(first["domain_bits"]),
        pending_updates=sum(int(i.get("pending_updates", 0)) for i in infos),
        rotation_in_progress=any(bool(i.get("rotation_in_progress")) for i in infos),
        snapshot_epoch_id=first.get("snapshot_epoch_id"),
        snapshot_checksum=first.get("snapshot_checksum", first.get("checksum")),
    )


def rotation_epoch(current: int, manifest_epoch: int) -> int:
    """The epoch id a rotation publishes: after `current`, the manifest's own when ahead."""
    return max(current + 1, int(manifest_epoch))


# --------------------------------------------------------------------------- snapshots


def resolve_snapshot_path(requested: str, allowed_dir: str | None) -> Path | str:
    """The real path of a requested snapshot, which must lie inside `allowed_dir` (symlinks
    resolved first, so a link cannot lead outside). 403 when rotation is off or the path
    escapes; 422 when nothing is there. With an object-store prefix as `allowed_dir`, the
    URI (or a name relative to the prefix) under it (`resolve_snapshot_uri`)."""
    if not allowed_dir:
        raise WireError(
            403, ErrorCode.FORBIDDEN,
            "snapshot rotation is disabled on this server (no admin_snapshot_dir configured)",
        )
    if is_remote(allowed_dir) or is_remote(requested):
        return resolve_snapshot_uri(requested, allowed_dir)
    base = Path(os.path.realpath(Path(allowed_dir).expanduser()))
    candidate = Path(requested).expanduser()
    if not candidate.is_absolute():
        candidate = base / candidate
    real = Path(os.path.realpath(candidate))
    if real != base and base not in real.parents:
        raise WireError(
            403, ErrorCode.FORBIDDEN, "the snapshot path is outside the allowed snapshot directory"
        )
    try:
        found = real.exists()
    except OSError as exc:  # a name too long for the file system, a path it cannot read
        raise WireError(422, ErrorCode.BAD_SNAPSHOT,
                        f"no snapshot at {requested[:200]} ({exc.strerror})") from None
    if not found:
        raise WireError(422, ErrorCode.BAD_SNAPSHOT, f"no snapshot at {requested}")
    return real


def _not_a_plain_name(segment: str) -> str | None:
    """Why `segment` of a snapshot URI could name another place (None: it cannot).

    Checked as written and after each round of percent-decoding: the HTTP client resolves
    `%2e%2e` itself, and a web server or proxy in front of the snapshots decodes again
    (`%2f` becomes `/`, `%252e` a `%2e` and then a dot) before it maps the path to a file. No
    snapshot's name needs any of these."""
    text = segment
    for depth in range(8):
        why = None
        if text in ("", ".", ".."):
            why = "is empty or a dot segment"
        elif any(c in text for c in "/\\?#") or any(ord(c) < 32 or ord(c) == 127 for c in text):
            why = "holds a separator, query or control character"
        if why:
            return why + (" once percent-decoded" if depth else "")
        decoded = unquote(text)
        if decoded == text:
            return None
        text = decoded
    return "is percent-encoded over and over"


def resolve_snapshot_uri(requested: str, allowed: str) -> str:
    """`requested` as a URI under the allowed prefix: a full URI must start with it, a name
    is taken relative to it. What the store's client will request (dot segments resolved,
    percent-encoded ones included, `\\` read as `/`) must lie under the prefix segment by
    segment, and every segment after it must be a plain name however often it is decoded:
    the prefix is all that keeps a request inside."""
    if not is_remote(allowed):
        raise WireError(403, ErrorCode.FORBIDDEN, "the snapshot URI is outside the allowed "
                        "snapshot directory (admin_snapshot_dir is a local path)")
    base = allowed.rstrip("/")
    if requested.startswith(("/", "file:")):
        raise WireError(403, ErrorCode.FORBIDDEN, "a local snapshot path, but the allowed "
                        "snapshot prefix is in object storage")
    uri = requested if is_remote(requested) else f"{base}/{requested}"
    if not uri.startswith(base + "/"):
        raise WireError(403, ErrorCode.FORBIDDEN,
                        "the snapshot URI is outside the allowed snapshot prefix")
    if not lies_under(uri, base):
        scheme, authority, segments, extra = requested_location(uri)
        where = f"{scheme}://{authority}/{'/'.join(segments)}{extra}"
        raise WireError(403, ErrorCode.FORBIDDEN, f"the snapshot URI resolves to {where!r} "
                        "as the client requests it, which is not under the allowed snapshot "
                        "prefix")
    for segment in uri[len(base) + 1:].rstrip("/").split("/"):
        if why := _not_a_plain_name(segment):
            raise WireError(403, ErrorCode.FORBIDDEN, f"the snapshot URI is refused: "
                            f"{segment!r} {why}, which a web server could read as a place "
                            "outside the allowed snapshot prefix")
    return uri.rstrip("/")


def verify_snapshot(path: Path | str) -> Manifest:
    """Open the snapshot and recompute its checksum (reads every byte); its manifest when the
    data matches. Blocking: run it in a thread. 422 with the reason otherwise.

    A remote snapshot's manifest is checked here (chunk hashes, checksum, their root), not its
    bytes: each shard replica checks every chunk of its range against those same hashes as it
    fetches it, and a router downloading the whole snapshot to hash it would name nothing
    more."""
    if is_remote(path):
        try:
            with open_any(path) as remote:
                return remote.manifest
        except SnapshotError as exc:
            raise WireError(422, ErrorCode.BAD_SNAPSHOT, f"snapshot refused: {exc}") from None
    try:
        snap = Snapshot.open(path, verify=True)
    except SnapshotError as exc:
        raise WireError(422, ErrorCode.BAD_SNAPSHOT, f"snapshot refused: {exc}") from None
    except OSError as exc:
        raise WireError(
            422, ErrorCode.BAD_SNAPSHOT, f"snapshot refused: cannot read it ({exc.strerror})"
        ) from None
    try:
        if snap.manifest.checksum is None:
            raise WireError(
                422, ErrorCode.BAD_SNAPSHOT,
                "snapshot refused: a rotation needs a snapshot with a manifest checksum "
                "(build one with `morphogen build`)",
            )
        return snap.manifest
    finally:
        snap.close()


# --------------------------------------------------------------------------- two-phase


async def _gather(calls: Sequence[ShardCall], timeout_s: float) -> list[Any]:
    async def one(call: ShardCall) -> Any:
        return await asyncio.wait_for(call(), timeout_s)

    return list(await asyncio.gather(*(one(c) for c in calls), return_exceptions=True))


async def prepare_all(
    epoch_id: int,
    prepare: Sequence[ShardCall],
    abort: Sequence[ShardCall],
    *,
    timeout_s: float,
    retry_after: int = 1,
) -> list[Any]:
    """Prepare `epoch_id` on every shard concurrently; returns the prepare results. Any
    failure aborts on every shard and raises the first failure as a WireError (nothing
    changed on any shard)."""
    results = await _gather(prepare, timeout_s)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        await abort_all(epoch_id, abort, timeout_s=timeout_s)
        for r in failed:
            if isinstance(r, asyncio.CancelledError):
                raise r
        raise as_wire_error(failed[0], retry_after)
    return results


async def abort_all(epoch_id: int, abort: Sequence[ShardCall], *, timeout_s: float) -> None:
    """Drop a staged epoch everywhere, best effort (a replica that keeps it drops it on its
    own: its log entry is decided, or the next publication replaces it)."""
    for r in await _gather(abort, timeout_s):
        if isinstance(r, BaseException):
            log.warning("abort of epoch %d failed on a shard (%s)", epoch_id,
                        type(unwrap(r)).__name__)


async def commit_all(epoch_id: int, commit: Sequence[ShardCall], *, timeout_s: float) -> int:
    """Commit `epoch_id` on every shard, retrying a few times; returns how many shards still
    failed. Called once the commit is decided: a shard that failed reaches the epoch from the
    decided log (a scan that wants it, or its health check), so this never undoes anything."""
    todo = list(range(len(commit)))
    last: BaseException | None = None
    for attempt in range(COMMIT_ATTEMPTS):
        if attempt:
            await asyncio.sleep(0.05 * attempt)
        outcome = await _gather([commit[i] for i in todo], timeout_s)
        still = []
        for i, r in zip(todo, outcome, strict=True):
            if isinstance(r, BaseException):
                last = r
                still.append(i)
        todo = still
        if not todo:
            return 0
    assert last is not None
    log.warning("epoch %d committed on %d of %d shards so far (%s); the others catch up from "
                "the log", epoch_id, len(commit) - len(todo), len(commit),
                type(unwrap(last)).__name__)
    return len(todo)
