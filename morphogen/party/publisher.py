"""Admin publication of one party, without Ray: page updates and rotations, decided in the log.

The protocol (docs/publication.md) in the order this module runs it:

1. *propose*: the publication, named by its id (the admin's idempotency key), is appended to
   the party's epoch log on top of the last committed entry, with a lease this publisher
   renews while it works. An id committed before is answered from the log, applying nothing.
   Another publisher's undecided proposal waits for its lease (seconds), then is aborted.
2. *prepare* on every replica of every shard (the next version built off to the side).
3. *decide*: `commit` (every prepare succeeded) or `abort`, written once to the log. Nothing
   is served before this point, so a crash before it leaves nothing to undo.
4. *commit* on every replica. One that fails or is not reached reaches the decided entry from
   the log (a scan that wants it, its health check, or its start): the admin is answered 200
   once the decision is written, whatever the stragglers.

A publication runs as a task of its own: a request that is cancelled (the admin client went
away) does not stop it between two steps. Without a durable log a party refuses publications
(403): ids kept in one router's memory would not stop a re-send to a restarted or another
router replica from applying a publication twice. Its status still reads an empty log kept in
memory.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from morphogen.config import ADMIN_NEEDS_LOG, PartyConfig
from morphogen.party import admin
from morphogen.party.combine import ShardFailure
from morphogen.party.failpoint import FileFailpoint, Pause
from morphogen.party.publications import (
    ParentMismatch,
    batch_request,
    check_parent,
    identity_of,
    new_publication_id,
    rotation_request,
    updates_request,
)
from morphogen.party.redact import reason
from morphogen.party.shards import Layout, ShardLink
from morphogen.protocol import compose, sparse
from morphogen.protocol.changes import ChangeBatch, joined
from morphogen.protocol.codec import BATCH_HEADER, ErrorCode, WireError
from morphogen.protocol.identity import DIGEST_VERSIONS, EpochIdentity
from morphogen.publication.lease import BusyWait
from morphogen.publication.log import (
    EpochLog,
    EpochLogBusy,
    EpochLogConflict,
    EpochLogError,
    LogEntry,
    Published,
    TooManyChanges,
    new_publisher_id,
    rotation_entry,
    updates_entry,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


class Publishing(Protocol):
    """What a publisher drives: the party's shards, their layout and the identity its scans
    want (`morphogen.party.router.Party` is one). The party holds its publisher, so the
    publisher names only what it uses of the party."""

    cfg: PartyConfig
    shards: list[ShardLink]
    epoch_log: EpochLog | None
    want: EpochIdentity | None

    def unavailable(self, message: str) -> WireError: ...
    async def from_every_shard(self, calls: list[Awaitable[T]], what: str,
                               timeout_s: float) -> list[T]: ...
    async def infos(self) -> list[dict[str, Any]]: ...
    async def layout(self) -> Layout: ...
    def set_layout(self, infos: list[dict[str, Any]]) -> Layout | None: ...
    def advance_want(self, identities: frozenset[Any] | set[Any]) -> None: ...


class Publisher:
    """The admin side of a `Party` (its `admin` attribute)."""

    def __init__(self, party: Publishing, *, lease_s: float = 5.0) -> None:
        self.party = party
        self.log: EpochLog = party.epoch_log or EpochLog.in_memory()
        self.lease_s = float(lease_s)
        self.rotating = False
        self.pause: Pause | None = (FileFailpoint(party.cfg.admin_failpoint_file)
                                    if party.cfg.admin_failpoint_file else None)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._renewers: set[asyncio.Task[None]] = set()
        self._compacting: asyncio.Task[None] | None = None
        sparse.warm()  # batches are parsed and logged as their changed bytes
        compose.warm()  # and folded as them by a compaction, which compiles nothing then

    # ------------------------------------------------------------------ shards

    async def replica_infos(self) -> list[list[dict[str, Any]]]:
        """Every running replica's info, by shard."""
        return await self.party.from_every_shard(
            [s.replicas() for s in self.party.shards], "shard replicas",
            self.party.cfg.admin_timeout_s)

    async def _shards_identity(self) -> EpochIdentity:
        """The identity every replica serves (a log with no committed entry yet: the
        configured snapshot); 503 when they disagree."""
        infos = [i for infos in await self.replica_infos() for i in infos]
        if not admin.same_data(infos):
            raise self.party.unavailable(
                "shards serve different data and the log has no committed entry to bring them "
                "together: rotate both parties to one snapshot")
        try:
            return identity_of(infos[0])
        except ShardFailure as exc:
            raise self.party.unavailable(str(exc)) from None

    async def catch_up(self) -> list[dict[str, Any]]:
        """Every shard replays the epoch log to its committed head."""
        results = await asyncio.gather(*(s.catch_up() for s in self.party.shards),
                                       return_exceptions=True)
        for i, r in enumerate(results):
            if isinstance(r, BaseException):
                log.warning("shard %d could not catch up from the epoch log (%s)", i,
                            reason(admin.unwrap(r)))
        return [r for r in results if not isinstance(r, BaseException)]

    # ------------------------------------------------------------------ the log steps

    async def in_log(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the log, off the event loop; 503 when the log cannot be read or
        written (a conflict is the caller's)."""
        try:
            return await asyncio.to_thread(fn, *args)
        except EpochLogConflict:
            raise
        except (EpochLogError, OSError) as exc:
            log.error("epoch log: %s", reason(exc))
            raise self.party.unavailable(
                "the epoch log cannot be read or written; nothing was changed") from None

    async def _propose(self, pub: str, request: str,
                       build: Callable[[LogEntry | None, int], Any]) -> Published | LogEntry:
        """Step 1, waiting for another publisher's lease (at most `admin_timeout_s`)."""
        publisher, wait = new_publisher_id(), BusyWait()
        deadline = time.monotonic() + self.party.cfg.admin_timeout_s
        while True:
            try:
                return await self.in_log(self.log.propose, pub, request, publisher,
                                          self.lease_s, build)
            except EpochLogBusy as busy:
                if time.monotonic() + busy.remaining_s > deadline:
                    raise self.party.unavailable(f"{busy}; retry") from None
                await wait.sleep(busy)  # short: see BusyWait
            except EpochLogConflict as exc:  # the head moved between two reads: build again
                log.info("proposal of %s retried (%s)", pub, reason(exc))
                await asyncio.sleep(0.01)
            except ParentMismatch as exc:
                raise WireError(409, ErrorCode.PARENT_MISMATCH, str(exc)) from None
            except ValueError as exc:
                raise WireError(400, ErrorCode.BAD_REQUEST, str(exc)) from None

    async def _renew(self, proposal: LogEntry) -> None:
        """Keep the lease of `proposal` while this publisher works on it."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await asyncio.to_thread(self.log.renew, proposal, self.lease_s)
            except EpochLogConflict:
                return  # decided (by us, or by another publisher after our lease ran out)
            except Exception as exc:  # noqa: BLE001 - the decision step reports it
                log.warning("lease renewal failed (%s)", reason(exc))

    async def _step(self, name: str) -> None:
        if self.pause is not None:
            await self.pause(name)

    def halt(self) -> None:
        """Stop renewing every lease (the crash tests: a publisher that froze is a dead one)."""
        for task in list(self._renewers):
            task.cancel()

    # ------------------------------------------------------------------ one publication

    async def _run(self, pub: str, request: str, build: Callable[[LogEntry | None, int], Any],
                   prepare: Callable[[LogEntry], list[Callable[[], Awaitable[Any]]]],
                   same: Callable[[str], Awaitable[bool]] | None = None,
                   ) -> tuple[LogEntry | Published, list[Any], int]:
        """Steps 1-4 as one task that a cancelled request does not interrupt. Returns (the
        committed proposal, or the earlier publication of the same id; the prepare results;
        replicas still behind). `same(request)`: whether a committed publication's other
        request is this one all the same (the same batch under another digest version)."""
        task = asyncio.get_running_loop().create_task(self._publication(pub, request, build,
                                                                         prepare, same))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def _publication(self, pub: str, request: str,
                           build: Callable[[LogEntry | None, int], Any],
                           prepare: Callable[[LogEntry], list[Callable[[], Awaitable[Any]]]],
                           same: Callable[[str], Awaitable[bool]] | None = None,
                           ) -> tuple[LogEntry | Published, list[Any], int]:
        cfg = self.party.cfg
        proposal = await self._propose(pub, request, build)
        if isinstance(proposal, Published):
            if proposal.request != request and (same is None
                                                or not await same(proposal.request)):
                raise WireError(409, ErrorCode.CONFLICT,
                                f"publication id {pub} was used for another request (epoch "
                                f"{proposal.epoch_id}); use a new id")
            await self.catch_up()  # replicas a crash left behind reach it now, not later
            return proposal, [], 0
        await self._step("proposed")
        renewer = asyncio.get_running_loop().create_task(self._renew(proposal))
        self._renewers.add(renewer)
        renewer.add_done_callback(self._renewers.discard)
        op = proposal.pub or pub
        target = proposal.identity
        assert target is not None
        try:
            aborts = [functools.partial(s.abort, proposal.epoch_id, op)
                      for s in self.party.shards]
            try:
                results = await admin.prepare_all(
                    proposal.epoch_id, prepare(proposal), aborts,
                    timeout_s=cfg.admin_timeout_s, retry_after=cfg.retry_after_s)
            except BaseException:
                try:
                    await asyncio.to_thread(self.log.decide, proposal, "abort")
                except Exception as exc:  # noqa: BLE001 - decided already, or the log is gone
                    log.warning("abort of %s not logged (%s)", proposal.pub, reason(exc))
                raise
            await self._step("prepared")
            try:
                await self.in_log(self.log.decide, proposal, "commit")
            except EpochLogConflict as exc:
                await admin.abort_all(proposal.epoch_id, aborts, timeout_s=cfg.admin_timeout_s)
                raise self.party.unavailable(f"{exc}; nothing was changed, retry") from None
        finally:
            renewer.cancel()
        await self._step("decided")
        behind = await admin.commit_all(
            proposal.epoch_id,
            [functools.partial(s.commit, proposal.epoch_id, op, target)
             for s in self.party.shards],
            timeout_s=cfg.admin_timeout_s)
        ident = proposal.epoch_identity()
        if ident is not None:
            self.party.advance_want({ident})
        return proposal, results, behind

    async def _fallback_base(self) -> EpochIdentity | None:
        """What the first publication builds on when the log has no committed entry."""
        state = await self.in_log(self.log.state)
        return None if state.head is not None else await self._shards_identity()

    # ------------------------------------------------------------------ the admin routes

    def _check_durable(self) -> None:
        # a re-send arrives precisely after a router died (Serve's 500): ids in its memory are
        # gone then, and a batch applied twice undoes itself on one party only
        if not self.log.durable:
            raise WireError(403, ErrorCode.FORBIDDEN, ADMIN_NEEDS_LOG)

    async def updates_part(self, changes: ChangeBatch, pub: str | None, parent: str | None,
                           part: int, parts: int, digest: str) -> dict[str, Any]:
        """Part `part` of `parts` of one publication whose whole batch has `digest`: kept in
        the log's store until the last part, which publishes all of them as one `updates`
        (docs/publication.md). Any router replica may take any part: they meet in the
        shared store. A re-sent part is written again; a part of a publication already
        committed is answered from the log."""
        self._check_durable()
        if pub is None:
            raise WireError(400, ErrorCode.BAD_REQUEST,
                            "a publication in parts needs its id (Idempotency-Key)")
        done = (await self.in_log(self.log.state)).pubs.get(pub)
        if done is not None:  # committed: its parts may be gone; nothing to stage again
            if done.request != batch_request(digest):
                raise WireError(409, ErrorCode.CONFLICT,
                                f"publication id {pub} was used for another request (epoch "
                                f"{done.epoch_id}); use a new id")
            await self.catch_up()
            return {"epoch_id": done.epoch_id, "identity": done.identity, "publication": pub,
                    "applied": 0, "duplicate": True, "part": part, "parts": parts}
        if part < parts:
            await self.in_log(self.log.stage_part, digest, part, parts, changes)
            return {"publication": pub, "part": part, "parts": parts, "staged": len(changes)}
        cap = self.party.cfg.admin_max_publication_pages
        try:
            staged, missing = await self.in_log(self.log.staged_parts, digest, parts,
                                                cap - len(changes))
        except TooManyChanges as exc:
            raise WireError(413, ErrorCode.PAYLOAD_TOO_LARGE,
                            f"publication {pub}: {exc} (admin_max_publication_pages, with "
                            "this last part's); publish it as a rotation to a snapshot, or "
                            "raise the cap") from None
        if missing:
            shown = ", ".join(map(str, missing[:8])) + (" .." if len(missing) > 8 else "")
            raise WireError(409, ErrorCode.MISSING_PARTS,
                            f"publication {pub}: part(s) {shown} of {parts} are not here; "
                            "send them, then the last part again")
        whole = joined([*staged, changes]).with_digest(changes.digest_version)
        if await _digest(whole) != digest:
            raise WireError(409, ErrorCode.CONFLICT,
                            f"publication {pub}: its {parts} parts make another batch than "
                            f"{BATCH_HEADER} names; send every part again")
        out = await self.updates(whole, pub, parent)
        try:  # decided: the parts are no longer read (a failure leaves files, not a wrong state)
            await self.in_log(self.log.drop_parts, digest, parts)
        except Exception as exc:  # noqa: BLE001
            log.warning("staged parts of %s not removed (%s)", pub, reason(exc))
        out["parts"] = parts
        return out

    async def updates(self, changes: ChangeBatch, pub: str | None = None,
                      parent: str | None = None) -> dict[str, Any]:
        """Publish `head + 1` = head + `changes` on every shard as one step; with `parent`,
        only when the head is that identity (`check_parent`)."""
        self._check_durable()
        layout = await self.party.layout()
        if changes.max_page() >= layout.num_pages:
            # the cached layout may predate a rotation that grew the matrix
            layout = self.party.set_layout(await self.party.infos()) or layout
        if changes.max_page() >= layout.num_pages:
            # checked before the log: an entry no shard can apply must never be written
            raise WireError(400, ErrorCode.BAD_UPDATE,
                            f"page {changes.max_page()} is outside the matrix of "
                            f"{layout.num_pages} pages")
        pub = pub or new_publication_id()
        await _digest(changes)  # `build` and `updates_request` read it, cached
        fallback = await self._fallback_base()

        def build(head: LogEntry | None, seq: int) -> tuple[LogEntry, ChangeBatch]:
            base = head.epoch_identity() if head is not None else fallback
            if base is None:  # committed meanwhile and compacted away: cannot happen
                raise EpochLogConflict("the log head moved")
            check_parent(base, parent)
            epoch_id = base.epoch_id + 1
            target = base.after_updates(epoch_id, changes.digest)
            return updates_entry(epoch_id, base.epoch_id, changes, target, seq), changes

        def prepare(p: LogEntry) -> list[Callable[[], Awaitable[Any]]]:
            assert p.base_epoch is not None and p.identity is not None and p.pub is not None
            return [functools.partial(s.prepare_updates, p.epoch_id, changes, p.base_epoch,
                                      p.pub, p.identity) for s in self.party.shards]

        async def same(committed: str) -> bool:
            # a re-send of the same changes under the other digest version (a publisher that
            # chose anew, a hand re-send): applied already, so answered as done
            for version in DIGEST_VERSIONS:
                if version != changes.digest_version and committed == batch_request(
                        await _digest(changes.with_digest(version))):
                    return True
            return False

        done, _, behind = await self._run(pub, updates_request(changes), build, prepare, same)
        out = {"epoch_id": done.epoch_id, "identity": done.identity, "publication": pub,
               "applied": len(changes)}
        if isinstance(done, Published):
            out.update(applied=0, duplicate=True)
        elif self.log.worth_compacting(read=False):
            self._compact_later()
        if behind:
            out["replicas_catching_up"] = behind
        return out

    async def snapshot(self, requested: str, pub: str | None = None,
                       parent: str | None = None) -> dict[str, Any]:
        """Rotate every shard to the snapshot at `requested` (inside admin_snapshot_dir), its
        checksum verified before any shard is touched; with `parent`, only when the head is
        that identity (`check_parent`)."""
        self._check_durable()
        path = admin.resolve_snapshot_path(requested, self.party.cfg.admin_snapshot_dir)
        started = time.monotonic()
        manifest = await asyncio.to_thread(admin.verify_snapshot, path)
        verified = time.monotonic() - started
        if manifest.num_pages < len(self.party.shards):
            raise WireError(
                422, ErrorCode.BAD_SNAPSHOT,
                f"snapshot refused: {manifest.num_pages} pages for "
                f"{len(self.party.shards)} shards",
            )
        checksum = manifest.checksum
        assert checksum is not None  # verify_snapshot refuses none
        pub = pub or new_publication_id()
        fallback = await self._fallback_base()

        def build(head: LogEntry | None, seq: int) -> tuple[LogEntry, None]:
            check_parent(head.epoch_identity() if head is not None else fallback, parent)
            current = head.epoch_id if head is not None else (
                fallback.epoch_id if fallback is not None else 0)
            epoch_id = admin.rotation_epoch(current, manifest.epoch_id)
            target = EpochIdentity.of_snapshot(epoch_id, manifest.fingerprint)
            return rotation_entry(epoch_id, str(path), checksum, target, seq), None

        def prepare(p: LogEntry) -> list[Callable[[], Awaitable[Any]]]:
            assert p.identity is not None and p.pub is not None
            return [functools.partial(s.prepare_snapshot, p.epoch_id, str(path), checksum,
                                      p.pub, p.identity) for s in self.party.shards]

        self.rotating = True
        try:
            done, _, behind = await self._run(pub, rotation_request(str(path), checksum),
                                              build, prepare)
            self.party.set_layout(await self.party.infos())
        finally:
            self.rotating = False
        if not isinstance(done, Published):
            await self._compact()
        log.info("rotated to epoch %d (%d pages) in %.2fs", done.epoch_id, manifest.num_pages,
                 time.monotonic() - started)
        out = {
            "epoch_id": done.epoch_id,
            "identity": done.identity,
            "publication": pub,
            "num_pages": manifest.num_pages,
            "domain_bits": manifest.domain_bits,
            "checksum": checksum,
            "snapshot_epoch_id": manifest.epoch_id,
            "seconds": round(time.monotonic() - started, 3),
            "verify_seconds": round(verified, 3),
        }
        if isinstance(done, Published):
            out["duplicate"] = True
        if behind:
            out["replicas_catching_up"] = behind
        return out

    def _compact_later(self) -> None:
        # a log of updates that never rotates would grow without bound, and every router and
        # replica that starts reads it: compact in the background, one at a time here
        if self._compacting is None or self._compacting.done():
            self._compacting = asyncio.ensure_future(self._compact())

    async def _compact(self) -> None:
        """A committed rotation makes every earlier entry dead weight for replay: drop it
        (inline: a rewrite of a small file, next to a rotation's load)."""
        try:
            dropped = await asyncio.to_thread(self.log.compact)
            if dropped:
                log.info("epoch log compacted: %d records dropped", dropped)
        except Exception as exc:  # noqa: BLE001 - the next rotation tries again
            log.warning("epoch log compaction failed (%s)", reason(exc))


async def _digest(changes: ChangeBatch) -> str:
    """The batch's digest, computed off the event loop: version 1 hashes 4 KiB a page changed
    (20 MiB for a block of 3,000 records on a table of 16 M), and the queries this router
    answers must not wait on it."""
    return await asyncio.to_thread(lambda: changes.digest)
