"""Admin publication of one party, without Ray: page updates and rotations, logged first.

A publication is appended to the party's durable epoch log (morphogen.epoch_log) before any
shard sees it, then prepared and committed on every replica of every shard
(morphogen.admin.publish); each step names the identity it leads to, so a replica that is there
already (it replayed the entry) takes it as done. Scans want the new identity only once every
reachable replica has committed it. The log is the party's truth: a shard replica that restarts
or starts later replays it before it serves, one that missed a publication catches up from it
when a scan wants more, and replicas that a failed commit or a router that died mid-publication
left behind are caught up from it before the next publication. A publication that changed
nothing (a prepare failed) is cancelled in the log by an abort entry.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from morphogen import admin
from morphogen.changes import ChangeBatch
from morphogen.codec import ErrorCode, WireError
from morphogen.combine import ShardFailure
from morphogen.epoch_log import EpochLogConflict, EpochLogError
from morphogen.identity import EpochIdentity
from morphogen.redact import reason

if TYPE_CHECKING:
    from morphogen.party import Party

log = logging.getLogger(__name__)


def identity_of(info: dict[str, Any]) -> EpochIdentity:
    """The identity a shard's info reports, rebuilt and checked against its digest."""
    ident = EpochIdentity(
        int(info["epoch_id"]), str(info["identity_snapshot"]),
        str(info["update_chain"]).removeprefix("0x"),
    )
    if ident.digest != info["identity"]:
        raise ShardFailure(f"shard {info.get('shard')} reports an inconsistent identity")
    return ident


# What admin status shows of each replica of a shard.
_REPLICA_KEYS = ("replica", "node_id", "epoch_id", "identity", "pending_updates", "scans")


class Publisher:
    """The admin side of a `Party` (its `admin` attribute); one publication at a time."""

    def __init__(self, party: Party) -> None:
        self.party = party
        self.lock = asyncio.Lock()
        self._base: EpochIdentity | None = None  # what this party last published
        self.rotating = False

    async def replica_infos(self) -> list[list[dict[str, Any]]]:
        """Every running replica's info, by shard."""
        return await self.party.from_every_shard(
            [s.replicas() for s in self.party.shards], "shard replicas",
            self.party.cfg.admin_timeout_s)

    async def _every_replica(self) -> list[dict[str, Any]]:
        return [i for infos in await self.replica_infos() for i in infos]

    async def _current_identity(self) -> EpochIdentity:
        """The identity every replica of every shard serves, after catching lagging ones up
        from the log; 503 when they still disagree."""
        infos = await self._every_replica()
        if self.party.epoch_log is not None:
            head = await asyncio.to_thread(self.party.epoch_log.head)
            behind = head is not None and any(i["identity"] != head.identity for i in infos)
            if behind or not admin.same_data(infos):
                # the log is the party's truth: what it holds was meant to be published
                await self.catch_up()
                infos = await self._every_replica()
        if not admin.same_data(infos):
            raise self.party.unavailable(
                "shards serve different epochs (a failed commit or a restarted shard); page "
                "updates are refused until a snapshot rotation brings them together"
            )
        try:
            return identity_of(infos[0])
        except ShardFailure as exc:
            raise self.party.unavailable(str(exc)) from None

    async def catch_up(self) -> list[dict[str, Any]]:
        """Every shard replays the epoch log to its head."""
        results = await asyncio.gather(*(s.catch_up() for s in self.party.shards),
                                       return_exceptions=True)
        for i, r in enumerate(results):
            if isinstance(r, BaseException):
                log.warning("shard %d could not catch up from the epoch log (%s)", i,
                            reason(admin.unwrap(r)))
        return [r for r in results if not isinstance(r, BaseException)]

    async def _logged(self, append: Callable[[], Any]) -> None:
        if self.party.epoch_log is None:
            return
        try:
            await asyncio.to_thread(append)
        except EpochLogConflict as exc:
            self._base = None
            raise WireError(409, ErrorCode.CONFLICT, f"{exc}; retry") from None
        except (EpochLogError, OSError) as exc:
            log.error("epoch log append failed: %s", reason(exc))
            raise self.party.unavailable("the epoch log cannot be written; nothing was changed") \
                from None

    async def _abort_logged(self, epoch_id: int) -> None:
        if self.party.epoch_log is None:
            return
        try:
            await asyncio.to_thread(self.party.epoch_log.append_abort, epoch_id)
        except Exception as exc:  # noqa: BLE001 - the shards catch up to the entry instead
            log.error("could not log the abort of epoch %d (%s): shards will replay it",
                      epoch_id, reason(exc))

    async def _publish(self, epoch_id: int, prepare: list[Callable[[], Awaitable[Any]]],
                       op: str, target: EpochIdentity) -> list[Any]:
        out = await admin.publish(
            epoch_id,
            prepare,
            [functools.partial(s.commit, epoch_id, op, target.digest) for s in self.party.shards],
            [functools.partial(s.abort, epoch_id, op) for s in self.party.shards],
            timeout_s=self.party.cfg.admin_timeout_s,
            retry_after=self.party.cfg.retry_after_s,
        )
        # every reachable replica has it now: scans may ask for it
        self.party.advance_want({target})
        return out

    async def updates(self, changes: ChangeBatch) -> dict[str, Any]:
        """Publish `current + 1` = current + `changes` on every shard as one step, logged
        first. The identity this party last published is tried first (no metadata round
        trip); a refusal because another router moved the epoch re-reads it once."""
        layout = await self.party.layout()
        if changes.max_page() >= layout.num_pages:
            # the cached layout may predate a rotation that grew the matrix
            layout = self.party.set_layout(await self.party.infos()) or layout
        if changes.max_page() >= layout.num_pages:
            # checked before the log: an entry no shard can apply must never be written
            raise WireError(400, ErrorCode.BAD_UPDATE,
                            f"page {changes.max_page()} is outside the matrix of "
                            f"{layout.num_pages} pages")
        async with self.lock:
            for attempt in range(2):
                cached = self._base is not None
                base = self._base or await self._current_identity()
                epoch_id = base.epoch_id + 1
                target = base.after_updates(epoch_id, changes.digest)
                op = admin.new_op_id()
                if self.party.epoch_log is not None:
                    await self._logged(functools.partial(
                        self.party.epoch_log.append_updates, epoch_id, base.epoch_id, changes,
                        target))
                try:
                    await self._publish(
                        epoch_id,
                        [functools.partial(s.prepare_updates, epoch_id, changes, base.epoch_id,
                                           op, target.digest) for s in self.party.shards],
                        op,
                        target,
                    )
                except WireError as err:
                    self._base = None
                    if err.status != 500:  # nothing changed on any shard
                        await self._abort_logged(epoch_id)
                    if err.status == 409 and cached and attempt == 0:
                        continue  # the epoch moved under us: read it and try once more
                    raise
                self._base = target
                return {"epoch_id": epoch_id, "identity": target.digest,
                        "applied": len(changes)}
            raise AssertionError("unreachable")

    async def snapshot(self, requested: str) -> dict[str, Any]:
        """Rotate every shard to the snapshot at `requested` (inside admin_snapshot_dir), its
        checksum verified before any shard is touched, the rotation logged first."""
        path = admin.resolve_snapshot_path(requested, self.party.cfg.admin_snapshot_dir)
        async with self.lock:
            self.rotating = True
            started = time.monotonic()
            try:
                manifest = await asyncio.to_thread(admin.verify_snapshot, path)
                verified = time.monotonic() - started
                if manifest.num_pages < len(self.party.shards):
                    raise WireError(
                        422, ErrorCode.BAD_SNAPSHOT,
                        f"snapshot refused: {manifest.num_pages} pages for "
                        f"{len(self.party.shards)} shards",
                    )
                assert manifest.checksum is not None  # verify_snapshot refuses none
                state = admin.party_epoch(await self.party.infos())
                # over whatever epochs the shards serve: a rotation also re-unites shards
                # that a failed commit or a restart left apart
                epoch_id = admin.rotation_epoch(state.epoch_id, manifest.epoch_id)
                if self.party.epoch_log is not None:
                    head = await asyncio.to_thread(self.party.epoch_log.head)
                    if head is not None:
                        epoch_id = max(epoch_id, head.epoch_id + 1)
                target = EpochIdentity.of_snapshot(epoch_id, manifest.checksum)
                op = admin.new_op_id()
                if self.party.epoch_log is not None:
                    await self._logged(functools.partial(
                        self.party.epoch_log.append_rotation, epoch_id, str(path),
                        str(manifest.checksum), target))
                try:
                    await self._publish(
                        epoch_id,
                        [functools.partial(s.prepare_snapshot, epoch_id, str(path),
                                           manifest.checksum, op, target.digest)
                         for s in self.party.shards],
                        op,
                        target,
                    )
                except WireError as err:
                    if err.status != 500:
                        await self._abort_logged(epoch_id)
                    raise
                self._base = target
                self.party.set_layout(await self.party.infos())
            except BaseException:
                self._base = None
                raise
            finally:
                self.rotating = False
            log.info("rotated to epoch %d (%d pages) in %.2fs", epoch_id, manifest.num_pages,
                     time.monotonic() - started)
            return {
                "epoch_id": epoch_id,
                "identity": target.digest,
                "num_pages": manifest.num_pages,
                "domain_bits": manifest.domain_bits,
                "checksum": manifest.checksum,
                "snapshot_epoch_id": manifest.epoch_id,
                "seconds": round(time.monotonic() - started, 3),
                "verify_seconds": round(verified, 3),
            }

    async def status(self) -> dict[str, Any]:
        epoch_log = self.party.epoch_log
        by_shard = await self.replica_infos()
        infos = [replicas[0] for replicas in by_shard]
        state = admin.party_epoch([i for replicas in by_shard for i in replicas])
        keep = ("shard", "epoch_id", "identity", "first_page", "stop_page", "pending_updates",
                "folded_chunks", "segments", "rotation_in_progress", "staged_epoch_id",
                "snapshot_epoch_id", "snapshot_checksum", "engine", "scans", "folds")
        head = None
        if self.party.epoch_log is not None:
            entry = await asyncio.to_thread(self.party.epoch_log.head)
            head = None if entry is None else {"epoch_id": entry.epoch_id, "kind": entry.kind,
                                               "identity": entry.identity}
        return {
            **state.as_dict(),
            "consistent": state.consistent,
            "num_pages": state.num_pages,
            "domain_bits": state.domain_bits,
            "rotation_in_progress": state.rotation_in_progress or self.rotating,
            "admin_busy": self.lock.locked(),
            "epoch_log": None if epoch_log is None else str(epoch_log.directory),
            "epoch_log_head": head,
            "wanted_identity": None if self.party.want is None else self.party.want.digest,
            "shards": [
                {**{k: i.get(k) for k in keep},
                 "replicas": [{k: r.get(k) for k in _REPLICA_KEYS} for r in replicas]}
                for i, replicas in zip(infos, by_shard, strict=True)
            ],
        }

