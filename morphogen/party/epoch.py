"""One shard's versioned state: epochs, pending page updates, folding, rotation.

An epoch is an immutable view of the matrix: a snapshot plus an ordered list of page updates
(XOR diffs, morphogen.party.pending), held on a shard as a `Version` (morphogen.party.version)
whose answers apply the pending updates to the scan of the pages, so an update becomes visible
the moment its epoch is published, and the background fold that later writes it into the pages
(in place, between scans: morphogen.party.host_fold and device_fold) changes no answer's bytes.

Publication is two-phase so that every shard of a party switches together: `prepare_*` builds
the next version off to the side (the expensive part: loading a snapshot range, resolving page
replacements) and `commit` makes it current with one reference swap. A scan reads the current
version once and finishes on it, so in-flight scans end on the epoch they started on.

Every version carries an `EpochIdentity` (morphogen.protocol.identity): the epoch id, the root
of the snapshot's chunk hashes and a running hash of the update batches applied since, so that a
partial names the data it was computed from and never only a counter. A version's pages are a
private copy of the shard's range checked against those chunk hashes as it was read
(`Snapshot.read_verified`), so the bytes scanned are the bytes named, even if the file changes.

Scan leases (morphogen.party.leases): a scan holds the segments of the version it read until it
finishes; a commit, a rotation or a fold retires the segments the new version no longer uses,
closed when their last scan ends, never under one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

from morphogen.engine.base import Engine, check_domain, check_format
from morphogen.engine.gpu_writes import ScanGate
from morphogen.party.device_fold import (
    commit_rotation,
    device_writable,
    fold_on_device,
    stage_rotation,
)
from morphogen.party.host_fold import (
    fold_on_host,
    host_writable,
    plan_in_place,
    write_in_place,
)
from morphogen.party.leases import ScanLeases
from morphogen.party.tables import TableLoader, TableSlice
from morphogen.party.version import Segment, Version, page_with
from morphogen.protocol.changes import Change, ChangeBatch
from morphogen.protocol.dpf import DomainError, DpfKey, as_batch
from morphogen.protocol.identity import EpochIdentity
from morphogen.protocol.packed import AnyBatch, PackedKeyBatch
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.tables import advertised

DEFAULT_CHUNK_PAGES = 1024  # 4 MiB: the unit folds count in (and copy, where not in place)
# Changes a log's fold is written into the pages at a time as a shard replays it (64 MiB as rows)
REPLAY_ROWS = 16384
T = TypeVar("T")
# A staged version left by an admin operation that never committed nor aborted (its router
# died) may be replaced by another operation after this long.
DEFAULT_STALE_STAGE_S = 300.0


class EpochError(RuntimeError):
    """An epoch transition that does not fit the shard's state (stale, out of order, ...)."""


class StagingConflict(EpochError):
    """Another admin operation holds this shard's staging slot."""


def _as_diffs(base: Version, pages: np.ndarray, replace: np.ndarray,
              rows: np.ndarray) -> np.ndarray:
    """`rows` with each replacement turned into the XOR diff it makes against its page as the
    updates before it leave the page (the base's pending ones, then this batch's, in order)."""
    out = np.array(rows)  # rows may be the batch's own, read-only
    for i in np.flatnonzero(replace).tolist():
        page = int(pages[i])
        now = page_with(base, base.pending, page)
        for j in np.flatnonzero(pages[:i] == page).tolist():
            now ^= out[j]
        out[i] = now ^ rows[i]
    return out


class ShardState:
    """The current (and at most one staged) version of one shard, with transitions.

    Thread-safe: scans run concurrently with prepare/commit/fold, which serialise among
    themselves. The staging slot belongs to one admin operation at a time (`op`, an opaque
    id): another operation's prepare is refused (`StagingConflict`) unless the staged version
    is older than `stale_stage_s` (its operation died), and commit/abort with an `op` touch
    only that operation's version. At most two versions' page copies exist at once: current
    and staged (plus whatever in-flight scans still hold until they finish).
    """

    def __init__(
        self,
        engine: Engine,
        snapshot: Snapshot,
        first_page: int,
        stop_page: int,
        *,
        epoch_id: int | None = None,
        chunk_pages: int = DEFAULT_CHUNK_PAGES,
        stale_stage_s: float = DEFAULT_STALE_STAGE_S,
    ) -> None:
        if chunk_pages < 1:
            raise ValueError("chunk_pages must be at least 1")
        self._engine = engine
        self._chunk = chunk_pages
        self._stale_s = float(stale_stage_s)
        self._lock = threading.RLock()
        epoch = snapshot.epoch_id if epoch_id is None else epoch_id
        self._leases = ScanLeases(self._fresh_version(snapshot, first_page, stop_page, int(epoch)))
        self._staged: Version | None = None
        self._staged_op: str | None = None
        self._staged_at = 0.0
        self._loading = False  # a prepare_snapshot is loading its range
        self._table_loader = TableLoader(engine)
        # Folds write pending updates into the pages scans read (the device copy on a GPU
        # shard, device_fold; the host pages on the CPU engines, host_fold), between scans
        self._gate = ScanGate()
        self._broken: BaseException | None = None

    # -- reads
    @property
    def current(self) -> Version:
        return self._leases.current

    @property
    def epoch_id(self) -> int:
        return self.current.epoch_id

    @property
    def identity(self) -> EpochIdentity:
        return self.current.identity

    def scan(self, keys: Sequence[DpfKey] | AnyBatch,
             table: TableSlice | None = None) -> tuple[EpochIdentity, np.ndarray]:
        """`(identity, partials)`: every key over this shard's pages (of `table` only, when
        given), all on the version that was current when the scan started (held by a lease
        until it ends)."""
        identity, acc, _ = self.scan_timed(keys, table)
        return identity, acc

    def scan_timed(
        self, keys: Sequence[DpfKey] | AnyBatch, table: TableSlice | None = None
    ) -> tuple[EpochIdentity, np.ndarray, dict[str, float]]:
        """`scan` plus its seconds by phase (Version.scan_timed); with `table`, of this
        shard's pages inside that table only, the keys in the table's domain."""
        batch = keys if isinstance(keys, PackedKeyBatch) else as_batch(keys)
        check_format(self._engine, batch)  # an engine without packed kernels refuses them
        self._refuse_if_broken()
        with self._gate.scan(), self.lease() as version:
            # again under the gate: a scan that waited there while a write failed must not
            # answer from the pages it left (a fold half written, a replay's slices)
            self._refuse_if_broken()
            if table is not None:
                table.check(version.snapshot.manifest, version.first_page, version.stop_page)
                want = table.table.domain_bits
                if batch.domain_bits != want:
                    raise DomainError(f"keys of domain {batch.domain_bits}, table "
                                      f"{table.table.name!r} has domain {want}")
                acc, phases = version.scan_table_timed(batch, table, self._table_loader)
                return version.identity, acc, phases
            if batch.domain_bits != version.snapshot.domain_bits:
                # a rotation may change the domain: keys made for the old one are refused,
                # never answered (a smaller domain would alias pages, a larger one costs a
                # wrong walk)
                raise DomainError(
                    f"keys of domain {batch.domain_bits}, epoch {version.epoch_id} has domain "
                    f"{version.snapshot.domain_bits}"
                )
            check_domain(batch, version.first_page, version.stop_page - version.first_page)
            acc, phases = version.scan_timed(batch)
            return version.identity, acc, phases

    @contextlib.contextmanager
    def lease(self) -> Iterator[Version]:
        """The current version, its segments kept open until the block ends (a scan's
        lease): a commit, rotation or fold meanwhile retires them but closes them only after.
        A lease alone does not keep a fold from writing into the pages it shares with the
        next version: reading its answers needs the scan gate too, as `scan_timed` holds it."""
        version = self._leases.acquire()
        try:
            yield version
        finally:
            self._leases.release(version)

    @property
    def rotation_in_progress(self) -> bool:
        staged = self._staged
        return self._loading or (
            staged is not None and staged.snapshot is not self.current.snapshot
        )

    def info(self) -> dict[str, Any]:
        v = self.current
        staged = self._staged
        return {
            "epoch_id": v.epoch_id,
            "identity": v.identity.digest,
            "identity_snapshot": v.identity.snapshot_checksum,
            "update_chain": "0x" + v.identity.chain,
            "pending_updates": len(v.pending),
            "folded_chunks": len(v.folded),
            "segments": len(v.segments),
            "rotation_in_progress": self.rotation_in_progress,
            "staged_epoch_id": None if staged is None else staged.epoch_id,
            "snapshot_epoch_id": v.snapshot.epoch_id,
            "snapshot_checksum": v.snapshot.manifest.checksum,
            "num_pages": v.snapshot.num_pages,
            "domain_bits": v.snapshot.domain_bits,
            "first_page": v.first_page,
            "stop_page": v.stop_page,
            "tables": advertised(v.snapshot.manifest.tables or ()),
        }

    # -- two-phase transitions
    def prepare_updates(
        self,
        epoch_id: int,
        changes: Sequence[Change] | ChangeBatch,
        *,
        base_epoch: int | None = None,
        op: str | None = None,
        force: bool = False,
        identity: EpochIdentity | None = None,
    ) -> int:
        """Stage `epoch_id` = current + these changes; returns how many touch this shard.

        `base_epoch`, when given, must be the current epoch: the caller computed the changes
        against it (a shard that restarted from an older snapshot must not take them).
        `force`: replace whatever another operation staged (the party's log decides who
        publishes, so a staged version of another operation is an orphan).
        `identity`: the identity the changes lead to, when they stand for many publications
        (an epoch log's fold) rather than one batch of the update chain.
        """
        with self._lock:
            base = self._check_next(epoch_id, op, force)
            if base_epoch is not None and base.epoch_id != base_epoch:
                raise EpochError(
                    f"updates were made for epoch {base_epoch}, this shard is at {base.epoch_id}"
                )
            num_pages = base.snapshot.num_pages
            if not isinstance(changes, ChangeBatch):
                changes = ChangeBatch.from_changes(changes)
            if changes.max_page() >= num_pages:
                raise ValueError(
                    f"page {changes.max_page()} is outside the matrix of {num_pages} pages"
                )
            pages, replace, rows = changes.rows(base.first_page, base.stop_page)
            if replace.any():
                rows = _as_diffs(base, pages, replace, rows)
            self._replace_staged(
                Version(
                    identity=identity or base.identity.after_updates(epoch_id, changes.digest),
                    snapshot=base.snapshot,
                    first_page=base.first_page,
                    stop_page=base.stop_page,
                    segments=base.segments,
                    pending=base.pending.then(pages, rows),
                    folded=base.folded,
                ),
                op,
            )
            return len(pages)

    def replay_updates(self, epoch_id: int, changes: ChangeBatch, *, base_epoch: int,
                       identity: EpochIdentity, rows: int | None = None) -> int | None:
        """Make `epoch_id` = current + `changes` (an epoch log's fold, replayed as a shard
        starts) current at once, writing them into the pages in place `rows` changes at a
        time; returns how many touch this shard, or None, changing nothing, where its
        pages take no writes in place (the caller stages the changes as any others).

        A fold is the net change of every update since the last rotation: up to every page
        of the matrix, so staged as pending rows it would hold some 4 KiB a page beside the
        pages themselves, and the changed bytes are some 60. Written a slice at a time it
        holds one slice. The scan gate's write side is held throughout, so no scan reads a
        page of a slice before the identity changes with the last one; a failed write leaves
        the pages undefined and the shard stops serving, as a fold's does."""
        rows = rows or REPLAY_ROWS
        if identity.epoch_id != epoch_id:
            raise ValueError(f"identity of epoch {identity.epoch_id} given for epoch {epoch_id}")
        with self._lock:
            base = self._check_next(epoch_id, None, force=True)
            if base.epoch_id != base_epoch:
                raise EpochError(
                    f"updates were made for epoch {base_epoch}, this shard is at {base.epoch_id}"
                )
            if changes.max_page() >= base.snapshot.num_pages:
                raise ValueError(f"page {changes.max_page()} is outside the matrix of "
                                 f"{base.snapshot.num_pages} pages")
            on_device = device_writable(base)
            if not on_device and not host_writable(base):
                return None
            self._replace_staged(None, None)

            def write() -> int:
                version, taken = base, 0
                for pages, replace, data in changes.row_slices(base.first_page, base.stop_page,
                                                               rows):
                    if replace.any():
                        data = _as_diffs(version, pages, replace, data)
                    step = dataclasses.replace(version, pending=version.pending.then(pages, data))
                    writes = plan_in_place(step)
                    if on_device:
                        version = fold_on_device(step, writes, self._leases.swap)
                    else:
                        version = write_in_place(step, writes, self._chunk, self._leases.swap)
                    taken += len(pages)
                self._leases.swap(dataclasses.replace(version, identity=identity))
                return taken

            return self._write_under_gate(write)

    def prepare_snapshot(
        self,
        epoch_id: int,
        snapshot: Snapshot,
        first_page: int,
        stop_page: int,
        *,
        op: str | None = None,
        force: bool = False,
    ) -> None:
        """Stage `epoch_id` = a new snapshot's range (loaded now, while the old one serves)."""
        with self._lock:
            self._check_next(epoch_id, op, force)
            # the slot is ours from here: drop any earlier staged version before loading, so
            # that no more than two copies of the shard exist at once
            self._replace_staged(None, None)
            self._loading = True
            try:
                pages = snapshot.read_verified(first_page, stop_page)
                version = None
                if device_writable(self.current):  # a GPU shard keeps its device copy
                    version = stage_rotation(self.current, snapshot, first_page, pages,
                                             epoch_id)
                if version is None:
                    version = self._fresh_version(snapshot, first_page, stop_page, epoch_id,
                                                  pages)
            finally:
                self._loading = False
            self._replace_staged(version, op)

    def commit(self, epoch_id: int, *, op: str | None = None) -> None:
        with self._lock:
            staged = self._staged
            if staged is None or staged.epoch_id != epoch_id:
                if self.current.epoch_id == epoch_id:
                    return  # a repeated commit (a retried admin call) is harmless
                raise EpochError(f"epoch {epoch_id} is not staged on this shard")
            if op is not None and self._staged_op != op:
                raise StagingConflict(f"epoch {epoch_id} was staged by another admin operation")
            old = self.current
            if staged.device_diffs is not None:
                rotation = staged
                staged = self._write_under_gate(lambda: commit_rotation(rotation,
                                                                    self._leases.swap))
            else:
                self._leases.swap(staged)
            self._staged = None
            self._staged_op = None
            self._leases.retire(old.segments, keep=staged.segments)
            if staged.pending and device_writable(staged):
                # a GPU shard writes the updates into device memory now: no answer pays the
                # CPU pass over them afterwards (the answers are the same bytes either way)
                self._fold_on_device(staged)

    def commit_staged(self, epoch_id: int, digest: str) -> bool:
        """Commit the staged version if it is epoch `epoch_id` of identity `digest`, whichever
        operation staged it; False, changing nothing, otherwise. The identity names the data
        (the snapshot's chunk hashes, the chain of update batches), so a version staged under
        it holds exactly what staging it again would load."""
        with self._lock:
            staged = self._staged
            if staged is None or staged.epoch_id != epoch_id or staged.identity.digest != digest:
                return False
            self.commit(staged.epoch_id, op=self._staged_op)
            return True

    @property
    def staged(self) -> tuple[Version, str | None] | None:
        """The staged version and the operation that staged it."""
        staged = self._staged
        return None if staged is None else (staged, self._staged_op)

    def abort(self, epoch_id: int, *, op: str | None = None) -> None:
        with self._lock:
            staged = self._staged
            if staged is None or staged.epoch_id != epoch_id:
                return
            if op is not None and self._staged_op != op:
                return  # not ours to drop
            self._replace_staged(None, None)

    # -- background maintenance
    def fold_pending(self) -> int:
        """Write the current version's pending updates into the pages scans read.

        Swaps in a version with the same epoch id and identical answers, only if nothing was
        staged meanwhile. Returns the number of updates folded.

        On the CPU engines the updates are XORed into the shard's own pages in place, under
        the scan gate (morphogen.party.host_fold: the words an update changes written,
        whatever the shard's size); an engine that scans a copy of its own gets private
        copies of the touched chunks instead. On a GPU shard they are written into the device
        copy in place (morphogen.party.device_fold), which a commit of updates already does, so
        little is left pending there.
        """
        with self._lock:
            base = self.current
            if not base.pending or self._staged is not None:
                return 0
            if device_writable(base):
                self._fold_on_device(base)
                return len(base.pending)
            if host_writable(base):
                writes = plan_in_place(base)  # a plan that fails leaves every page as it was
                self._write_under_gate(lambda: write_in_place(base, writes, self._chunk,
                                                              self._leases.swap))
                return len(base.pending)
            folded_version = fold_on_host(base, self._engine, self._chunk)
            self._leases.swap(folded_version)
            self._leases.retire(base.segments, keep=folded_version.segments)
            return len(base.pending)

    # -- internals
    def _refuse_if_broken(self) -> None:
        if self._broken is not None:
            raise RuntimeError("the pages are undefined after a failed write; this shard "
                               "must be replaced") from self._broken

    def _write_under_gate(self, action: Callable[[], T]) -> T:
        """`action` (a write into the pages scans read and its version swap: device_fold,
        host_fold) under the scan gate, with the lock held: no scan runs while the pages
        change, and the version swaps before the next one. A failed write leaves the pages
        undefined: the shard stops serving."""
        with self._gate.write():
            try:
                return action()
            except BaseException as exc:
                self._broken = exc
                raise

    def _fold_on_device(self, base: Version) -> None:
        writes = plan_in_place(base)  # as fold_pending's on the host: before the gate
        self._write_under_gate(lambda: fold_on_device(base, writes, self._leases.swap))

    def _check_next(self, epoch_id: int, op: str | None, force: bool = False) -> Version:
        cur = self.current
        if epoch_id <= cur.epoch_id:
            raise EpochError(f"epoch {epoch_id} is not after the current epoch {cur.epoch_id}")
        staged = self._staged
        if (
            not force
            and staged is not None
            and self._staged_op != op
            and time.monotonic() - self._staged_at < self._stale_s
        ):
            raise StagingConflict(
                f"epoch {staged.epoch_id} is being staged by another admin operation"
            )
        return cur

    def _replace_staged(self, version: Version | None, op: str | None) -> None:
        old = self._staged
        self._staged = version
        self._staged_op = op
        self._staged_at = time.monotonic()
        if old is not None:
            keep = self.current.segments + (version.segments if version is not None else ())
            self._leases.retire(old.segments, keep=keep)

    def close(self) -> None:
        """Retire every version (current and staged): each closes once its scans end."""
        with self._lock:
            staged = self._staged
            self._staged = None
            self._leases.retire(self.current.segments + (staged.segments if staged else ()))

    def _fresh_version(
        self, snapshot: Snapshot, first_page: int, stop_page: int, epoch_id: int,
        pages: np.ndarray | None = None,
    ) -> Version:
        if not 0 <= first_page < stop_page <= snapshot.num_pages:
            raise ValueError(f"shard range [{first_page}, {stop_page}) is not in the snapshot")
        # A verified private copy, never the mapping: the identity below names the chunk
        # hashes, and only bytes checked against them (and that no one can change afterwards)
        # may be scanned under it; the GPU engine uploads these same checked bytes.
        if pages is None:
            pages = snapshot.read_verified(first_page, stop_page)
        seg = Segment(first_page, pages, self._engine.load(pages, first_page=first_page))
        identity = EpochIdentity.of_snapshot(epoch_id, snapshot.fingerprint())
        return Version(identity, snapshot, first_page, stop_page, (seg,))
