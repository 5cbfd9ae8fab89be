"""One replica of one shard, without Ray: what `deployments/shard.py` serves, asynchronously.

A shard may run as several replicas (copies of the same page range, on other GPUs or nodes),
started at different times and reached by publications one by one. They stay on one epoch
because the party's epoch log is the truth and every replica can catch up from it:

* a replica replays the log before it serves (`ShardReplica.start`);
* a scan names the identity the router wants; a replica behind it catches up from the log
  first, waiting at most `catch_up_wait_s`, and otherwise answers a retryable 503 (the router
  retries, and Serve may pick another replica);
* a publication step names the identity it leads to (`target`): a replica already there (it
  replayed the entry, or caught up on demand) takes the step as done, and one that missed an
  earlier publication catches up before it stages the next;
* a commit comes only after the log decided it (morphogen.party.publisher): a replica that has
  not staged that very version (it missed the prepare, or a stale prepare replaced it)
  reaches it from the log instead of failing;
* the health check drops a staged version whose proposal was aborted or whose publisher
  stopped renewing its lease (it died before the decision), catches up to the log's committed
  head (committing a staged version the log committed: its publisher died after the decision),
  and reports the replica unhealthy when it cannot read the log or stays behind it (Serve
  replaces it).

A replica ahead of what the router wants answers from what it has, under its own identity: the
router combines only equal identities, so at worst it retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from morphogen.engine.base import KeyFormatUnsupported
from morphogen.party.epoch import EpochError
from morphogen.party.observe import NullObserver, Observer
from morphogen.party.redact import reason
from morphogen.party.shard import ShardCore
from morphogen.party.tables import TableMoved, TableSlice
from morphogen.protocol import sparse
from morphogen.protocol.changes import ChangeBatch
from morphogen.protocol.codec import ErrorCode, WireError, unavailable
from morphogen.protocol.dpf import DomainError
from morphogen.protocol.identity import EpochIdentity
from morphogen.protocol.packed import AnyBatch
from morphogen.publication.log import EpochLog, LogState
from morphogen.publication.records import EpochLogUnreachable
from morphogen.storage.failures import ride_out

log = logging.getLogger(__name__)

T = TypeVar("T")

# Consecutive failed scans after which the replica reports itself unhealthy (Serve replaces it).
MAX_CONSECUTIVE_FAILURES = 3
# The health check's look at the log waits at most this long for the admin thread (a
# rotation's load may hold it): a busy replica is not an unhealthy one.
_LOG_CHECK_WAIT_S = 2.0


def _committed(state: LogState, identity: EpochIdentity) -> bool:
    """Whether the log committed `identity`: staged, it is no orphan but the epoch the catch-up
    below commits as it is (its publisher died between the decision and the replicas)."""
    return any(e.epoch_id == identity.epoch_id and e.identity == identity.digest
               for e in reversed(state.committed))


class ShardReplica:
    """A `ShardCore` with its epoch log, thread pools, background fold and health probe."""

    def __init__(
        self,
        core: ShardCore,
        epoch_log: EpochLog | None = None,
        *,
        threads: int = 1,
        catch_up_wait_s: float = 10.0,
        retry_after_s: int = 1,
        fold_interval_s: float = 0.0,
        fold_threshold: int = 64,
        observer: Observer | None = None,
        behind_unhealthy_s: float = 30.0,
    ) -> None:
        self.core = core
        self.log = epoch_log
        self.observer: Observer = observer or NullObserver()
        self._wait_s = float(catch_up_wait_s)
        self._retry_after = retry_after_s
        name = f"shard{core.index}"
        self._scan_pool = ThreadPoolExecutor(threads, thread_name_prefix=f"scan-{name}")
        self._probe_pool = ThreadPoolExecutor(1, thread_name_prefix=f"probe-{name}")
        # prepare / commit / abort / fold / catch-up: one at a time, never on the event loop
        self._admin_pool = ThreadPoolExecutor(1, thread_name_prefix=f"admin-{name}")
        self._catching_up: asyncio.Future[int] | None = None
        self._fold_interval = float(fold_interval_s)
        self._fold_threshold = int(fold_threshold)
        self._fold_wakeup: asyncio.Event | None = None
        self._folder: asyncio.Task[None] | None = None
        self.failures = 0
        self.scans = 0
        self.folds = 0
        self.replayed = 0
        self._replay_s: float | None = None
        self._behind_unhealthy_s = float(behind_unhealthy_s)
        self._behind_since: float | None = None
        self._log_unread = False  # started while the log's store was down

    @classmethod
    def start(cls, core: ShardCore, epoch_log: EpochLog | None = None,
              **kwargs: Any) -> ShardReplica:
        """The replica at the party's epoch: the log replayed before it serves (a restart, or a
        replica added later, starts from the configured snapshot)."""
        # the kernel that unpacks a publication's changed bytes, loaded now: the first
        # publication after a start would otherwise load it on its path
        sparse.warm()
        replica = cls(core, epoch_log, **kwargs)
        if epoch_log is not None:
            try:
                ride_out(replica._catch_up_now, f"shard {core.index}: the epoch log")
            except EpochLogUnreachable as exc:
                if not exc.transient:
                    raise
                # the store is down (a node restarting from its cache during an outage):
                # start, but answer only for an epoch a router names (one it read from the
                # log before), never on this replica's own word that its epoch is the party's
                replica._log_unread = True
                log.warning("shard %d: starting at epoch %s without the epoch log (%s); it "
                            "answers only scans for that epoch until the log is readable",
                            core.index, core.epoch_id, exc)
        return replica

    @property
    def identity(self) -> EpochIdentity:
        return self.core.identity

    # ------------------------------------------------------------------ queries

    async def scan(self, batch: AnyBatch, want: EpochIdentity | None = None,
                   table: TableSlice | None = None) -> tuple[EpochIdentity, bytes]:
        """`(identity, K * 4096 bytes)`: partial accumulators of every key over this shard's
        pages (with `table`, its pages inside that table), all computed on the one epoch
        named. `want`: the identity the router combines; a replica behind it catches up first
        (bounded) or answers 503."""
        self._start_folder()
        if self._behind(want):
            await self._reach(want)
        loop = asyncio.get_running_loop()
        try:
            identity, acc, phases = await loop.run_in_executor(
                self._scan_pool, self.core.scan_timed, batch, table)
        except DomainError as exc:
            # keys made for the domain before a rotation: the caller's mistake, not a failure
            raise WireError(
                400, ErrorCode.BAD_DOMAIN, f"{exc} (the snapshot changed; see GET /epoch)"
            ) from None
        except KeyFormatUnsupported as exc:
            # a replica whose engine lacks the format (the layout read another's): refused
            raise WireError(400, ErrorCode.BAD_KEY, f"{exc} (see GET /epoch)") from None
        except TableMoved as exc:
            # the router planned with a layout a rotation replaced: it re-reads and retries
            raise unavailable(f"shard {self.core.index}: {exc}", self._retry_after) from None
        except Exception as exc:
            self.failures += 1
            log.warning("shard %d: scan failed (%s)", self.core.index, reason(exc))
            raise
        self.failures = 0
        self.scans += 1
        if table is None:
            scanned = self.core.stop_page - self.core.first_page
        else:
            lo, hi = table.pages
            scanned = hi - lo
        self.observer.scan(self.core.index, len(batch), scanned, phases)
        return identity, np.ascontiguousarray(acc).tobytes()

    def _behind(self, want: EpochIdentity | None) -> bool:
        """Whether a scan must wait for the log: behind the epoch wanted, or (no epoch named)
        started without having read the log at all."""
        if want is None:
            return self._log_unread
        return self.core.identity.epoch_id < want.epoch_id

    async def _reach(self, want: EpochIdentity | None) -> None:
        """Catch up from the log towards `want`: one catch-up at a time for all the scans that
        wait, each waiting at most `catch_up_wait_s` (a rotation's load goes on behind)."""
        if self.log is not None:
            task = self._catching_up
            if task is None or task.done():
                task = self._catching_up = asyncio.ensure_future(
                    self._admin(self._catch_up_quietly))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), self._wait_s)
        if not self._behind(want):
            return
        if want is None:
            raise unavailable(
                f"shard {self.core.index} replica started while its epoch log was unreadable: "
                f"it cannot tell whether its epoch {self.core.epoch_id} is the party's",
                self._retry_after)
        raise unavailable(
            f"shard {self.core.index} replica is at epoch {self.core.epoch_id}, catching up "
            f"to {want.epoch_id}", self._retry_after)

    # ------------------------------------------------------------------ the epoch log

    def _catch_up_now(self) -> int:
        started = time.monotonic()
        assert self.log is not None
        applied = self.core.catch_up(self.log)
        self._log_unread = False
        self.replayed, self._replay_s = applied, time.monotonic() - started
        if applied:
            log.info("shard %d replayed %d epoch-log entries: now %s", self.core.index,
                     applied, self.core.identity)
        return applied

    def _catch_up_quietly(self) -> int:
        try:
            return self._catch_up_now()
        except Exception as exc:  # noqa: BLE001 - the waiting scans answer 503 instead
            log.warning("shard %d: catching up from the epoch log failed (%s)",
                        self.core.index, reason(exc))
            return 0

    async def catch_up(self) -> dict[str, Any]:
        """Replay the party's epoch log up to its head; `{"applied", "identity"}`."""
        self._start_folder()
        applied = 0 if self.log is None else await self._admin(self._catch_up_now)
        self.report()
        return {"applied": int(applied), "identity": self.core.identity.digest}

    # ------------------------------------------------------------------ epochs (two-phase)

    async def _admin(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._admin_pool, lambda: fn(*args, **kwargs))

    def _there(self, target: str | None) -> bool:
        return target is not None and self.core.identity.digest == target

    def _prepare_updates_now(self, epoch_id: int, changes: ChangeBatch, base_epoch: int,
                             op: str, target: str | None) -> int:
        if self._there(target):
            return 0  # replayed from the log already (a replica started after the append)
        if self.log is not None and self.core.epoch_id < base_epoch:
            self._catch_up_now()  # missed an earlier publication: the log has it
            if self._there(target):
                return 0
        return self.core.prepare_updates(epoch_id, changes, base_epoch=base_epoch, op=op,
                                         force=self.log is not None)

    async def prepare_updates(self, epoch_id: int, changes: ChangeBatch, base_epoch: int,
                              op: str, target: str | None = None) -> int:
        """Stage `epoch_id` = the current epoch (`base_epoch`) plus `changes`; returns how many
        of them touch this shard (0 when this replica is at `target` already)."""
        return int(await self._admin(self._prepare_updates_now, epoch_id, changes,
                                     base_epoch, op, target))

    def _prepare_snapshot_now(self, epoch_id: int, path: str, checksum: str | None, op: str,
                              target: str | None) -> dict[str, int]:
        if self._there(target):
            return {"first_page": self.core.first_page, "stop_page": self.core.stop_page}
        started = time.monotonic()
        first, stop = self.core.prepare_snapshot(epoch_id, path, checksum=checksum, op=op,
                                                 force=self.log is not None)
        log.info("shard %d staged epoch %d: pages [%d, %d), %.2fs", self.core.index, epoch_id,
                 first, stop, time.monotonic() - started)
        return {"first_page": first, "stop_page": stop}

    async def prepare_snapshot(self, epoch_id: int, path: str, checksum: str | None, op: str,
                               target: str | None = None) -> dict[str, int]:
        """Stage `epoch_id` = this shard's range of the snapshot at `path` (mapped and loaded
        now; the current epoch keeps serving)."""
        return await self._admin(self._prepare_snapshot_now, epoch_id, path, checksum, op,
                                 target)

    def _commit_now(self, epoch_id: int, op: str, target: str | None) -> int:
        if self._there(target):
            self.core.abort(epoch_id, op=op)  # nothing of ours is staged, or it is moot now
            return self.core.epoch_id
        staged = self.core.state.staged
        mine = staged is not None and staged[0].epoch_id == epoch_id and staged[1] == op and (
            target is None or staged[0].identity.digest == target)
        if mine:
            self.core.commit(epoch_id, op=op)
        elif self.log is None:
            if (target is not None and staged is not None and staged[0].epoch_id == epoch_id
                    and staged[0].identity.digest != target):
                # the snapshot changed between its verification and this shard's load (the
                # same pages, other tables): never served under the identity the router named
                self.core.abort(epoch_id, op=op)
                raise EpochError(f"epoch {epoch_id} staged here is {staged[0].identity}, not "
                                 f"{target}: the snapshot changed since it was verified")
            self.core.commit(epoch_id, op=op)
        else:
            # decided in the log before this call was sent: reach it from there
            self._catch_up_now()
            if not self._there(target):
                raise EpochError(f"epoch {epoch_id} is neither staged here nor committed in "
                                 "the epoch log")
        return self.core.epoch_id

    async def commit(self, epoch_id: int, op: str, target: str | None = None) -> int:
        epoch = await self._admin(self._commit_now, epoch_id, op, target)
        self.report()
        pending = self.core.state.current.pending
        if pending and len(pending) >= self._fold_threshold and self._fold_wakeup is not None:
            self._fold_wakeup.set()
        return int(epoch)

    async def abort(self, epoch_id: int, op: str) -> None:
        await self._admin(self.core.abort, epoch_id, op=op)

    # ------------------------------------------------------------------ metadata and health

    async def info(self) -> dict[str, Any]:
        self._start_folder()
        out = self.core.info()
        out.update(checksum=out["snapshot_checksum"], scans=self.scans, folds=self.folds)
        return out

    def report(self) -> None:
        """Refresh the gauges (an exporter may keep a gauge only in the intervals it was set
        in): on every publication, fold round and health check."""
        current = self.core.state.current
        self.observer.epoch(self.core.index, current.epoch_id, len(current.pending))
        self.observer.caught_up(self.core.index, self.replayed, self._replay_s)
        self._replay_s = None

    async def check_health(self) -> None:
        """Raise unless the epoch is known, the engine still computes a known answer and
        (with a log) the log is readable and this replica not stuck behind it."""
        self._start_folder()
        if self.core.epoch_id is None:
            raise RuntimeError("shard not loaded")
        if self.failures >= MAX_CONSECUTIVE_FAILURES:
            raise RuntimeError(f"{self.failures} consecutive scans failed")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._probe_pool, self.core.self_test)
        if self.log is not None:
            check = asyncio.ensure_future(self._admin(self._check_log_now))
            try:
                await asyncio.wait_for(asyncio.shield(check), _LOG_CHECK_WAIT_S)
            except TimeoutError:
                pass  # a long prepare holds the admin thread; the next check looks again
        self.report()

    def _check_log_now(self) -> None:
        assert self.log is not None
        try:
            state = self.log.state()  # unreadable: unhealthy, Serve replaces this replica...
        except EpochLogUnreachable as exc:
            if not exc.transient:
                raise
            # ...but not for a store that is down: a replacement could not read it either,
            # and while it is down nothing can be published, so what this replica read last
            # is still the head (scans for a newer epoch wait or answer 503 as ever)
            log.warning("shard %d: %s", self.core.index, exc)
            return
        staged = self.core.state.staged
        pending = state.pending
        if staged is not None and not _committed(state, staged[0].identity) and (
                pending is None or pending.pub != staged[1]
                or pending.epoch_id != staged[0].epoch_id or self.log.lease_left_s(state) <= 0):
            # aborted, never logged, or its publisher stopped renewing: an orphan. Should the
            # publisher still commit, this replica reaches the epoch from the log instead.
            log.info("shard %d: dropping staged epoch %d (its publication was aborted or its "
                     "publisher is gone)", self.core.index, staged[0].epoch_id)
            self.core.abort(staged[0].epoch_id, op=staged[1])
        head = state.head
        if head is None or self.core.epoch_id >= head.epoch_id:
            self._behind_since = None
            return
        with contextlib.suppress(Exception):
            self._catch_up_now()
        if self.core.epoch_id >= head.epoch_id:
            self._behind_since = None
            return
        now = time.monotonic()
        if self._behind_since is None:
            self._behind_since = now
        if now - self._behind_since > self._behind_unhealthy_s:
            raise RuntimeError(
                f"replica at epoch {self.core.epoch_id} has been behind the epoch log's "
                f"committed epoch {head.epoch_id} for {now - self._behind_since:.0f}s")

    # ------------------------------------------------------------------ background fold

    def _start_folder(self) -> None:
        if self._folder is not None or self._fold_interval <= 0:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # started by the first call on the loop instead
        self._fold_wakeup = asyncio.Event()
        self._folder = loop.create_task(self._fold_loop(self._fold_wakeup))

    async def _fold_loop(self, wakeup: asyncio.Event) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakeup.wait(), self._fold_interval)
            wakeup.clear()
            self.report()
            if not self.core.state.current.pending:
                continue
            try:
                folded = await self._admin(self.core.fold_pending)
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                log.warning("shard %d: folding pending updates failed (%s)", self.core.index,
                            reason(exc))
                continue
            if folded:
                self.folds += 1
                self.report()

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        if self._folder is not None:
            self._folder.cancel()
        for pool in (self._scan_pool, self._probe_pool, self._admin_pool):
            pool.shutdown(wait=False, cancel_futures=True)
        try:
            self.core.close()
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass
