"""A party's durable epoch log: the one decided history of its publications.

The protocol is written down in docs/publication.md; in short: a publisher *proposes* a
publication (an `updates` or `rotation` record naming its publication id and a lease), prepares
it on the shards, then writes its *decision* (`commit` or `abort`) here before any replica
commits it. Replicas replay and catch up to committed entries only, so nothing that a crash or
a race later aborts is ever served. At most one proposal is undecided at a time: that is the
party's one publisher. A proposal whose publisher stops renewing its lease (`renew` records) is
aborted by whoever proposes next. A publication id committed once is answered from the log,
never applied again; compaction carries the ids it drops in a leading `history` record.

`EpochLog` holds what every backend shares: reading (a scan of the frames, taken up where the
last one stopped), the checks every record passes before it is written, and the steps of the
protocol. Where the records live is a backend's: a shared directory
(morphogen.publication.directory), write-once objects in a store (.objects), or the process
(`EpochLog.in_memory()`, .memory). The records and their framing are in .records, what a
compaction keeps in .compaction.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from morphogen.protocol.changes import ChangeBatch
from morphogen.publication import lease as _lease
from morphogen.publication.compaction import (
    Compaction,
    compacted,
    fold_run,
    make_fold,
    worth_compacting,
)
from morphogen.publication.directory import DirectoryLog
from morphogen.publication.memory import MemoryLog
from morphogen.publication.objects import ObjectLog
from morphogen.publication.records import (
    DECISIONS,
    FRAME,
    FRAME_MAGIC,
    MAX_PAYLOAD,
    OLD_MAGIC,
    PUB_ID,
    EpochLogBusy,
    EpochLogConflict,
    EpochLogError,
    EpochLogUnreachable,
    LogEntry,
    LogState,
    Published,
    all_zeros,
    apply,
    decode_batch,
    decode_part,
    encode_batch,
    frame,
    misfit,
    new_publisher_id,
    now_ms,
    on_node,
    part_name,
    rotation_entry,
    updates_entry,
)
from morphogen.publication.records import decode as _decode  # patched by a test that counts
from morphogen.storage.location import check_log_location, is_remote
from morphogen.storage.log_objects import LogObjects, RaceLost

# What importers take from here (the records' names among them).
__all__ = [
    "EpochLog", "EpochLogBusy", "EpochLogConflict", "EpochLogError", "LogEntry", "LogState",
    "Published", "TooManyChanges", "new_publisher_id", "now_ms", "rotation_entry",
    "updates_entry",
]

log = logging.getLogger(__name__)

RACE_RETRIES = 50
# Update batches read at once in a replay or a fold: an object store answers each GET after a
# round trip, so a replay of many batches is as long as the longest of these waves, not the sum.
BATCH_READS = 16

Append = Callable[[bytes], None]


class TooManyChanges(ValueError):
    """A publication's staged parts carry more changes than the caller allows."""


class LogStore(Protocol):
    """Where the records live: one of the backends."""

    durable: bool
    directory: Any  # a path or a URI, for messages
    path: Any  # the records, for messages

    def write_marker(self) -> None: ...
    def read_marker(self, expect: str | None) -> str: ...
    def raw(self) -> bytes: ...
    def blob_path(self, name: str) -> Any: ...
    def read_blob(self, name: str) -> bytes: ...
    def write_file(self, name: str, parts: tuple[bytes, ...]) -> None: ...
    def has_file(self, name: str) -> bool: ...
    def remove_files(self, names: list[str]) -> None: ...
    def locked(self, scan: Callable[[bytes], tuple[LogState, int]]
               ) -> AbstractContextManager[tuple[Append, LogState]]: ...
    def rewrite(self, state: LogState, plan: Compaction) -> None: ...


# How long a compaction that composed a fold waits for an undecided proposal to be decided
# before it leaves the log as it was: a publication is decided within a second or so, and a
# proposal whose publisher died waits for its lease (the next compaction composes again).
PENDING_WAIT_S = 5.0
_nap = time.sleep  # the wait between looks (tests replace it)


def _retrying(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run a write again, from a fresh read, when another writer took its record's seq
    (object-store logs only: the directory's flock never loses)."""
    @functools.wraps(method)
    def run(self: EpochLog, *args: Any, **kwargs: Any) -> Any:
        for _ in range(RACE_RETRIES):
            try:
                return method(self, *args, **kwargs)
            except RaceLost:
                continue
        raise EpochLogError(f"{on_node(self.directory)}: {RACE_RETRIES} writes in a row lost "
                            "the race for the next record")
    return run


class EpochLog:
    """The log in `directory` (a path, an object-store URI, or None: in memory).

    `create`: make the directory and its marker when absent (the application builder does).
    `log_id`: the id the marker must carry (the builder's, passed to every replica): a
    directory that is not this party's shared log is refused, naming this node and the path.
    """

    def __init__(self, directory: str | os.PathLike[str] | None, *, create: bool = True,
                 log_id: str | None = None, marker_later: bool = False) -> None:
        self._scanned: tuple[bytes, LogState] | None = None  # see `_scan`
        self._leases = _lease.LeaseWatch()  # leases are timed by this reader's clock
        self._objects: LogObjects | None = None
        store: LogStore
        if directory is None:  # in_memory()
            store = MemoryLog()
            create = False
        elif is_remote(directory):
            try:
                check_log_location(directory)
            except ValueError as exc:
                raise EpochLogError(str(exc)) from None
            store = ObjectLog(str(directory))
            self._objects = store.objects
        else:
            store = DirectoryLog(Path(directory))
        self._store = store
        self.directory = store.directory
        self.path = store.path
        if create:
            store.write_marker()
        self._marker_unread = False
        try:
            self.log_id = store.read_marker(log_id)
        except EpochLogUnreachable as exc:
            # `marker_later` (a replica, told the log's id by its application): a store that
            # is down now is no reason not to start; the marker is checked before the first
            # read of the records instead
            if not (marker_later and exc.transient and log_id is not None and not create):
                raise
            self.log_id = log_id
            self._marker_unread = True

    @classmethod
    def in_memory(cls) -> EpochLog:
        return cls(None)

    @property
    def durable(self) -> bool:
        return self._store.durable

    # -- reading
    def _scan(self, raw: bytes) -> tuple[LogState, int]:
        """(the state of every complete record, the byte length the records span).

        A scan is a function of the bytes alone, so the state of the longest prefix scanned
        before is taken up where the new bytes begin with it: each read decodes only the
        records appended since (a compaction, a cut torn tail or another file: from the
        start). Without this every publication decoded the whole log."""
        seen = self._scanned
        reused = seen is not None and raw.startswith(seen[0])
        if reused:
            state, pos = seen[1].copy(), len(seen[0])
        else:
            state, pos = LogState(), 0
        while pos < len(raw):
            where = f"{self.path}: byte {pos}"
            if len(raw) - pos < FRAME.size:
                # no complete frame is this short: a torn append, unless it is not one of ours
                if FRAME_MAGIC.startswith(raw[pos : pos + 4]) or all_zeros(raw, pos):
                    break
                raise EpochLogError(f"{where}: not a record (bad magic or length)")
            magic, length, inverse, digest = FRAME.unpack_from(raw, pos)
            if magic == OLD_MAGIC:
                raise EpochLogError(f"{where}: a record of an older log format")
            if magic != FRAME_MAGIC or length ^ inverse != 0xFFFFFFFF or length > MAX_PAYLOAD:
                if all_zeros(raw, pos):  # an append the file system extended but never wrote
                    break
                raise EpochLogError(f"{where}: not a record (bad magic or length)")
            end = pos + FRAME.size + length
            if end > len(raw):
                break  # the payload of the last record is incomplete
            payload = raw[pos + FRAME.size : end]
            if hashlib.blake2b(payload, digest_size=16).digest() != digest:
                raise EpochLogError(f"{where}: record checksum mismatch (corrupt log)")
            entry = _decode(payload, where)
            if entry.seq != len(state.entries):
                raise EpochLogError(f"{where}: record seq {entry.seq} where "
                                    f"{len(state.entries)} was due")
            if problem := misfit(state, entry):
                raise EpochLogError(f"{where}: record {entry.seq}: {problem}")
            apply(state, entry)
            pos = end
        if not reused or pos > len(seen[0]):
            self._scanned = (bytes(raw[:pos]), state.copy())
        return state, pos

    def _check_marker(self) -> None:
        if self._marker_unread:
            self._store.read_marker(self.log_id)
            self._marker_unread = False

    def _locked(self) -> Any:
        """The store's write lock (`LogStore.locked`), the marker checked first."""
        self._check_marker()
        return self._store.locked(self._scan)

    def state(self) -> LogState:
        self._check_marker()
        return self._scan(self._store.raw())[0]

    def entries(self) -> list[LogEntry]:
        """Every complete record, in file order, validated."""
        return self.state().entries

    def live(self) -> list[LogEntry]:
        """What a replay applies: committed entries from the last committed rotation on."""
        return self.state().live()

    def head(self) -> LogEntry | None:
        """The last committed proposal."""
        return self.state().head

    def lease_left_s(self, state: LogState) -> float:
        """Seconds left of the lease of `state`'s undecided proposal, timed by this process
        since it first saw the proposal's latest renewal (0: ended, or none undecided)."""
        return self._leases.left_s(state)

    def worth_compacting(self, read: bool = True) -> bool:
        """Whether enough records piled up since the last compaction to start one; `read`:
        False judges by the state this process last read (no request to the store)."""
        seen = self._scanned
        return worth_compacting(self.state() if read or seen is None else seen[1])

    def load_batches(self, entries: list[LogEntry]) -> Iterator[ChangeBatch]:
        """The batches of `entries`, in order, `BATCH_READS` read at a time ahead of the
        caller (a replay holds at most that many batches it has not applied yet)."""
        if len(entries) <= 1:
            yield from (self.load_batch(e) for e in entries)
            return
        with ThreadPoolExecutor(min(BATCH_READS, len(entries)),
                                thread_name_prefix="log-batches") as pool:
            rest = iter(entries)
            ahead: deque[Future[ChangeBatch]] = deque(
                pool.submit(self.load_batch, e) for e in itertools.islice(rest, BATCH_READS))
            while ahead:
                batch = ahead.popleft().result()
                if (e := next(rest, None)) is not None:
                    ahead.append(pool.submit(self.load_batch, e))
                yield batch

    def load_batch(self, entry: LogEntry) -> ChangeBatch:
        """The update batch of an `updates` or `fold` entry, checked against its record."""
        if entry.kind not in ("updates", "fold") or entry.blob is None:
            raise EpochLogError(f"{self.path}: record {entry.seq} is not an update batch")
        path = self._store.blob_path(entry.blob)
        try:
            raw = self._store.read_blob(entry.blob)
        except OSError as exc:
            raise EpochLogError(f"{path}: update batch of epoch {entry.epoch_id} is "
                                f"unreadable ({exc.strerror or exc})") from None
        return decode_batch(raw, entry, path)

    # -- a publication in parts (docs/publication.md, "Publications larger than a request")
    def stage_part(self, digest: str, part: int, parts: int, batch: ChangeBatch) -> None:
        """Keep part `part` of `parts` of the batch with `digest` until its last part comes.
        Written whole or not at all; a re-sent part writes the same name again."""
        self._store.write_file(part_name(digest, part, parts), encode_batch(batch))

    def staged_parts(self, digest: str, parts: int, max_changes: int | None = None
                     ) -> tuple[list[ChangeBatch], list[int]]:
        """The staged parts 1 .. parts - 1 of a batch, and the numbers of those missing.
        TooManyChanges as soon as they carry more than `max_changes` changes: each is read
        as whole pages, so parts without a bound could take the process's memory."""
        found, missing, changes = [], [], 0
        for part in range(1, parts):
            name = part_name(digest, part, parts)
            try:
                raw = self._store.read_blob(name)
            except (FileNotFoundError, KeyError):
                missing.append(part)
                continue
            found.append(decode_part(raw, self._store.blob_path(name)))
            changes += len(found[-1])
            if max_changes is not None and changes > max_changes:
                raise TooManyChanges(f"the parts read so far carry {changes} changes, over "
                                     f"the {max_changes} a publication may carry")
        return found, missing

    def drop_parts(self, digest: str, parts: int) -> None:
        """Remove a batch's staged parts (its publication is decided, or it is abandoned)."""
        self._store.remove_files([part_name(digest, p, parts) for p in range(1, parts)])

    # -- writing
    def _add(self, append: Append, state: LogState, entry: LogEntry,
             batch: ChangeBatch | None = None) -> LogEntry:
        record = frame(entry)
        # the checks every reader applies, before anything is written: a record a reader
        # would refuse must never reach the log (it would refuse every later read too)
        if entry.seq != len(state.entries):
            raise ValueError(f"record seq {entry.seq} where {len(state.entries)} is due")
        try:
            _decode(record[FRAME.size :], f"{self.path}: new record")
        except EpochLogError as exc:
            raise ValueError(str(exc)) from None
        if problem := misfit(state, entry):
            raise EpochLogConflict(f"{self.path}: {problem}")
        if batch is not None and entry.blob:  # under the lock: `compact` deletes blobs
            self._store.write_file(entry.blob, encode_batch(batch))
        started = _lease.monotonic()
        append(record)
        apply(state, entry)
        if entry.lease_for_ms is not None:
            self._leases.wrote(state, started)
        return entry

    @_retrying
    def propose(self, pub: str, request: str, publisher: str, lease_s: float,
                build: Callable[[LogEntry | None, int], tuple[LogEntry, ChangeBatch | None]],
                ) -> Published | LogEntry:
        """Append a proposal for publication `pub`, built by `build(head, seq)` on the
        committed head. Returns the `Published` record instead when `pub` is committed
        already (nothing written). An undecided proposal of another publisher whose lease has
        run out is aborted first; one whose lease runs raises EpochLogBusy."""
        if not PUB_ID.fullmatch(pub):
            raise ValueError("a publication id is 1..80 characters of A-Z a-z 0-9 _ . : -")
        with self._locked() as (append, state):
            done = state.pubs.get(pub)
            if done is not None:
                return done
            pending = state.pending
            if pending is not None:
                left = self._leases.left_s(state)
                if left > 0 and pending.publisher != publisher:
                    raise EpochLogBusy(
                        f"publication {pending.pub} (epoch {pending.epoch_id}) is in progress",
                        left, (pending.seq, pending.pub, pending.publisher))
                log.warning("aborting publication %s (epoch %d): its publisher's lease ran "
                            "out undecided", pending.pub, pending.epoch_id)
                self._add(append, state, LogEntry(len(state.entries), "abort",
                                                  pending.epoch_id, of=pending.seq))
            entry, batch = build(state.head, len(state.entries))
            entry = LogEntry(**{**asdict(entry), "pub": pub, "request": request,
                                "publisher": publisher, **_lease_fields(lease_s)})
            return self._add(append, state, entry, batch)

    @_retrying
    def renew(self, proposal: LogEntry, lease_s: float) -> None:
        """Extend the lease of `proposal` (raises EpochLogConflict when it was decided)."""
        with self._locked() as (append, state):
            self._add(append, state, LogEntry(
                len(state.entries), "renew", proposal.epoch_id, of=proposal.seq,
                publisher=proposal.publisher, **_lease_fields(lease_s)))

    @_retrying
    def decide(self, proposal: LogEntry, outcome: str) -> None:
        """Write the outcome of `proposal`, once; raises EpochLogConflict when it was decided
        already (another publisher aborted it after its lease ran out)."""
        if outcome not in DECISIONS:
            raise ValueError(f"a decision is one of {DECISIONS}")
        with self._locked() as (append, state):
            pending = state.pending
            done = state.pubs.get(proposal.pub or "")
            if (outcome == "commit" and pending is None and done is not None
                    and (done.epoch_id, done.identity, done.request)
                    == (proposal.epoch_id, proposal.identity, proposal.request)):
                return  # this commit landed before a retry (an object-store write in doubt)
            # the publisher names one attempt: a seq and a pub alone may recur after a
            # compaction renumbered the records and the admin re-sent the publication
            if pending is None or (pending.seq, pending.pub, pending.publisher) != (
                    proposal.seq, proposal.pub, proposal.publisher):
                raise EpochLogConflict(
                    f"{self.path}: publication {proposal.pub} (epoch {proposal.epoch_id}) was "
                    "decided by another publisher (its lease ran out)")
            self._add(append, state, LogEntry(len(state.entries), outcome, proposal.epoch_id,
                                              of=proposal.seq))

    @_retrying
    def abort_expired(self) -> LogEntry | None:
        """Abort the undecided proposal when its lease has run out; returns it (else None)."""
        with self._locked() as (append, state):
            pending = state.pending
            if pending is None or self._leases.left_s(state) > 0:
                return None
            self._add(append, state, LogEntry(len(state.entries), "abort", pending.epoch_id,
                                              of=pending.seq))
            return pending

    def append_committed(self, pub: str, build: Callable[[LogEntry | None, int],
                         tuple[LogEntry, ChangeBatch | None]]) -> LogEntry:
        """Propose and commit at once (tools and tests that publish no shard)."""
        entry = self.propose(pub, pub, new_publisher_id(), 60.0, build)
        if isinstance(entry, Published):
            raise EpochLogConflict(f"{self.path}: publication {pub} is committed already")
        self.decide(entry, "commit")
        return entry

    @_retrying
    def compact(self) -> int:
        """Rewrite the log to hold a history record (the committed publication ids, the newest
        `HISTORY_MAX` that fit in one record) and the committed entries from the last
        rotation on, renumbered, all but the newest `FOLD_KEEP` updates folded (in levels:
        morphogen.publication.compaction), and delete the blobs no kept entry names; returns
        how many records were dropped. Does nothing while a proposal is undecided, after
        waiting up to `PENDING_WAIT_S` for its decision once a fold is composed (the next
        compaction does it).

        The fold is composed and written before the writers' lock is taken, from the log as
        read then: publications go on meanwhile. Under the lock it is used only where the
        entries it stands for are still in the log as they were and its batch is still
        there (a compaction that ran meanwhile may have folded them, or swept the batch)."""
        run = fold_run(self.state())
        fold = None
        if run:
            fold = make_fold(run, lambda es: list(self.load_batches(es)))
            self._store.write_file(fold.entry.blob, fold.parts)
        # a fold that took seconds to compose waits a little for a publication to decide
        deadline = time.monotonic() + (PENDING_WAIT_S if fold is not None else 0.0)
        while True:
            with self._locked() as (_append, state):
                if state.pending is None:
                    if fold is not None and not self._store.has_file(fold.entry.blob):
                        fold = None
                    plan = compacted(state, fold)
                    if len(plan.records) >= len(state.entries):
                        return 0  # nothing to drop
                    self._store.rewrite(state, plan)
                    return len(state.entries) - len(plan.records)
            if time.monotonic() >= deadline:
                return 0
            _nap(0.2)


def _lease_fields(lease_s: float) -> dict[str, int]:
    """A lease's length, which readers time on their own clocks, and its end by this
    machine's wall clock, which only people read."""
    length = max(1, int(lease_s * 1000))
    return {"lease_for_ms": length, "lease_ms": now_ms() + length}
