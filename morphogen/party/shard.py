"""One shard's scanning state, without Ray: its page range, its engine, its epochs, a self-test.

`deployments/shard.py` wraps this in a Serve deployment; `warm_up` runs the same code path on a
few pages so that a jitted engine compiles (and caches) its kernels once, in one process,
before a fleet of shard processes would each compile them at the same time.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from morphogen import engine as engines
from morphogen.constants import KEY_FORMAT_PACKED, PAGE_SIZE
from morphogen.party.epoch import DEFAULT_CHUNK_PAGES, DEFAULT_STALE_STAGE_S, ShardState
from morphogen.party.tables import TableSlice
from morphogen.protocol.changes import Change, ChangeBatch
from morphogen.protocol.dpf import KeyBatch, eval_points, generate_keys
from morphogen.protocol.identity import EMPTY_CHAIN, EpochIdentity
from morphogen.protocol.packed import (
    AnyBatch,
    PackedKeyBatch,
    generate_packed_keys,
    masks_at,
)
from morphogen.publication.log import EpochLog, EpochLogError, LogEntry
from morphogen.snapshot.layout import shard_ranges
from morphogen.snapshot.manifest import SnapshotError
from morphogen.snapshot.open import open_any
from morphogen.snapshot.reader import Snapshot

log = logging.getLogger(__name__)

class ShardCore:
    """Pages `[first_page, stop_page)` of a snapshot under one engine, as a versioned
    `ShardState` (epochs, pending updates, rotation), plus a self-test probe.

    `index`/`num_shards` say which part of a snapshot this shard serves: a rotation to a
    snapshot with another page count recomputes the range with `shard_ranges`.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        first_page: int,
        stop_page: int,
        engine_name: str = "auto",
        engine_options: dict[str, Any] | None = None,
        *,
        index: int = 0,
        num_shards: int = 1,
        chunk_pages: int = DEFAULT_CHUNK_PAGES,
        stale_stage_s: float = DEFAULT_STALE_STAGE_S,
        opener: Callable[..., Snapshot] = open_any,
    ) -> None:
        if not 0 <= first_page < stop_page <= snapshot.num_pages:
            raise ValueError(f"bad shard range [{first_page}, {stop_page})")
        if not 0 <= index < num_shards:
            raise ValueError(f"shard index {index} is not in 0..{num_shards - 1}")
        self.index = index
        self.num_shards = num_shards
        self.opener = opener  # how a rotation's path or URI is opened (the node's chunk cache)
        self.engine = engines.create(engine_name, **(engine_options or {}))
        self.state = ShardState(
            self.engine, snapshot, first_page, stop_page,
            chunk_pages=chunk_pages, stale_stage_s=stale_stage_s,
        )
        # The self-test: one page (a copy: it must not pin a retired version's pages), one
        # key, answer known from the plain-Python DPF walk; taken from the verified load.
        page = np.array(self.state.current.stored_page(first_page)).reshape(1, PAGE_SIZE)
        page.flags.writeable = False  # the jitted kernel's signature for loaded pages
        key, _ = generate_keys(int(snapshot.domain_bits), first_page)
        mask = np.frombuffer(key.eval(first_page), dtype=np.uint8)
        self._probe_batch = KeyBatch.from_keys([key])
        self._probe_expected = np.bitwise_and(page.reshape(-1), np.tile(mask, PAGE_SIZE // 16))
        self._probe = self.engine.load(page, first_page=first_page)
        # and where the engine scans packed keys, both keys of a pair for that page: one
        # selects it and the other not (the plain-Python leaf walk says which)
        self._packed_probe: tuple[PackedKeyBatch, np.ndarray] | None = None
        if KEY_FORMAT_PACKED in engines.key_formats(self.engine):
            pair = generate_packed_keys(int(snapshot.domain_bits), first_page)
            want = np.stack([page.reshape(-1) * np.uint8(k.eval(first_page)) for k in pair])
            self._packed_probe = PackedKeyBatch.from_keys(list(pair)), want

    @classmethod
    def open(
        cls,
        snapshot: Snapshot,
        index: int,
        num_shards: int,
        engine_name: str = "auto",
        engine_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> ShardCore:
        first, stop = shard_ranges(snapshot.num_pages, num_shards)[index]
        return cls(snapshot, first, stop, engine_name, engine_options, index=index,
                   num_shards=num_shards, **kwargs)

    # -- the current version's facts (each read is one consistent version)
    @property
    def snapshot(self) -> Snapshot:
        return self.state.current.snapshot

    @property
    def first_page(self) -> int:
        return self.state.current.first_page

    @property
    def stop_page(self) -> int:
        return self.state.current.stop_page

    @property
    def epoch_id(self) -> int:
        return self.state.epoch_id

    @property
    def identity(self) -> EpochIdentity:
        return self.state.identity

    @property
    def domain_bits(self) -> int:
        return int(self.state.current.snapshot.domain_bits)

    @property
    def engine_name(self) -> str:
        return str(self.engine.name)

    def scan(self, batch: AnyBatch,
             table: TableSlice | None = None) -> tuple[EpochIdentity, np.ndarray]:
        """`(identity, (K, 4096) partial accumulators)` of every key over this shard's pages
        (with `table`: its pages inside that table), all of one epoch (the version current
        when the scan started)."""
        identity, acc, _ = self.scan_timed(batch, table)
        return identity, acc

    def scan_timed(self, batch: AnyBatch, table: TableSlice | None = None
                   ) -> tuple[EpochIdentity, np.ndarray, dict[str, float]]:
        """`scan` plus its seconds by phase (device phases from a GPU engine)."""
        identity, acc, phases = self.state.scan_timed(batch, table)
        return identity, np.asarray(acc, dtype=np.uint8), phases

    # -- epochs (two-phase; see morphogen.party.epoch)
    def prepare_updates(
        self,
        epoch_id: int,
        changes: ChangeBatch | Sequence[Change],
        *,
        base_epoch: int | None = None,
        op: str | None = None,
        force: bool = False,
        identity: EpochIdentity | None = None,
    ) -> int:
        return self.state.prepare_updates(epoch_id, changes, base_epoch=base_epoch, op=op,
                                          force=force, identity=identity)

    def prepare_snapshot(
        self,
        epoch_id: int,
        path: str | os.PathLike[str],
        *,
        checksum: str | None = None,
        verify: bool = False,
        op: str | None = None,
        force: bool = False,
    ) -> tuple[int, int]:
        """Open the snapshot at `path`, stage this shard's range of it as `epoch_id`; returns
        the range. `checksum`, when given, must be the manifest's, i.e. the root of its chunk
        hashes (what the caller verified and named in its target identity); the range loaded
        is then checked against those same chunk hashes."""
        snapshot = self.opener(path, verify=verify)
        try:
            if checksum is not None and snapshot.manifest.checksum != checksum:
                raise SnapshotError(
                    f"{path}: manifest checksum changed since it was verified "
                    "(the snapshot was replaced meanwhile)"
                )
            try:
                first, stop = shard_ranges(snapshot.num_pages, self.num_shards)[self.index]
            except ValueError as exc:
                raise SnapshotError(str(exc)) from None
            self.state.prepare_snapshot(epoch_id, snapshot, first, stop, op=op, force=force)
        except BaseException:
            snapshot.close()
            raise
        return first, stop

    def commit(self, epoch_id: int, *, op: str | None = None) -> None:
        self.state.commit(epoch_id, op=op)

    def abort(self, epoch_id: int, *, op: str | None = None) -> None:
        self.state.abort(epoch_id, op=op)

    def fold_pending(self) -> int:
        return self.state.fold_pending()

    # -- the party's epoch log (morphogen.publication.log)
    def catch_up(self, epoch_log: EpochLog) -> int:
        """Apply the log's committed entries this shard lacks, in order, checking after each
        one that this shard derived the identity the log recorded; returns how many were
        applied. Undecided and aborted entries are never applied. A staged version that is
        exactly the next entry (its publisher logged the commit, then died before it told the
        replicas) is committed as it is; anything else staged is replaced (the log decides).

        A shard that starts from the configured snapshot replays the log to its head before
        it serves, so it comes back at the party's epoch, not the configuration's. Raises
        EpochLogError when the log does not continue from where this shard is (another
        snapshot under the configured path, a log of another party) or names other data.
        """
        entries = epoch_log.live()
        start = self._log_position(entries, epoch_log)
        op = "log-replay"
        todo = entries[start:]
        # read ahead: from an object store each batch is a round trip
        batches = epoch_log.load_batches([e for e in todo if e.kind != "rotation"])
        try:
            for entry in todo:
                batch = None if entry.kind == "rotation" else next(batches)
                if entry.identity is not None and self.state.commit_staged(entry.epoch_id,
                                                                          entry.identity):
                    # Staging it again would load the same bytes (minutes at tens of GiB, or
                    # from object storage) while every scan that wants this epoch is refused.
                    log.info("shard %d: committed its staged epoch %d, decided in the epoch "
                             "log", self.index, entry.epoch_id)
                else:
                    self._apply(entry, batch, op)
                if self.identity.digest != entry.identity:
                    raise EpochLogError(
                        f"{epoch_log.directory}: entry {entry.seq} (epoch {entry.epoch_id}) "
                        f"names {entry.identity}, this shard derived {self.identity.digest}"
                    )
        finally:
            batches.close()
        return len(todo)

    def _apply(self, entry: LogEntry, batch: ChangeBatch | None, op: str) -> None:
        """Stage `entry` from the log (`batch`: its batch, read ahead), replacing whatever is
        staged, and commit it."""
        if entry.kind == "rotation":
            assert entry.path is not None
            self.prepare_snapshot(entry.epoch_id, entry.path, checksum=entry.checksum, op=op,
                                  force=True)
        elif entry.kind == "fold":
            # a fold stands for many publications: its identity is the log's, not one link
            # of the update chain (its batch was checked against the fold's digest on read);
            # written into the pages a slice at a time where they take it, never held whole
            assert batch is not None and entry.base_epoch is not None
            identity = entry.epoch_identity()
            assert identity is not None
            mine = self.identity
            if (mine.epoch_id, mine.snapshot_checksum) != (entry.base_epoch,
                                                           identity.snapshot_checksum):
                raise EpochLogError(
                    f"entry {entry.seq} folds updates made on snapshot "
                    f"{identity.snapshot_checksum} at epoch {entry.base_epoch}; this shard "
                    f"holds {mine.snapshot_checksum} at epoch {mine.epoch_id}")
            if self.state.replay_updates(entry.epoch_id, batch, base_epoch=entry.base_epoch,
                                         identity=identity) is not None:
                return
            self.prepare_updates(entry.epoch_id, batch, base_epoch=entry.base_epoch, op=op,
                                 force=True, identity=identity)
        else:
            assert batch is not None
            self.prepare_updates(entry.epoch_id, batch, base_epoch=entry.base_epoch, op=op,
                                 force=True)
        self.commit(entry.epoch_id, op=op)

    def _log_position(self, entries: list[LogEntry], epoch_log: EpochLog) -> int:
        """Index of the first entry this shard has not applied."""
        mine = self.identity
        for i in range(len(entries) - 1, -1, -1):
            if entries[i].identity == mine.digest:
                return i + 1
        fold = next((e for e in entries if e.kind == "fold"
                     and int(e.base_epoch or 0) < mine.epoch_id <= e.epoch_id), None)
        if fold is not None:
            raise EpochLogError(
                f"{epoch_log.directory}: this shard's epoch {mine.epoch_id} is among those a "
                f"compaction folded into one batch (epochs {int(fold.base_epoch or 0) + 1}.."
                f"{fold.epoch_id}): it fell too far behind to catch up record by record; a "
                "restart replays the log from the snapshot"
            )
        if not entries or entries[0].kind == "rotation":
            return 0
        if entries[0].base_epoch == mine.epoch_id:
            first = entries[0]
            # An updates entry's identity is derived from this shard's, so other data fails
            # its check; a fold's is the log's, so what it was made on is checked here: the
            # snapshot the party started from, as it was, not another build under the path.
            if first.kind == "fold" and (mine.chain != EMPTY_CHAIN
                                         or mine.snapshot_checksum != first.snapshot_checksum):
                raise EpochLogError(
                    f"{epoch_log.directory}: the epoch log's first entry folds the updates made "
                    f"on snapshot {first.snapshot_checksum} (epoch {first.base_epoch}); this "
                    f"shard holds {mine}, of snapshot {mine.snapshot_checksum}: a snapshot "
                    "other than the one the log was written for, or another party's log")
            return 0  # the log continues this snapshot
        raise EpochLogError(
            f"{epoch_log.directory}: the epoch log does not continue from this shard's "
            f"{mine} (its first entry updates epoch {entries[0].base_epoch}): a snapshot "
            "other than the one the log was written for, or another party's log"
        )

    def info(self) -> dict[str, Any]:
        out = self.state.info()
        out.update(shard=self.index, num_shards=self.num_shards, engine=self.engine_name,
                   key_formats=list(engines.key_formats(self.engine)))
        return out

    def self_test(self) -> None:
        """Raise unless the engine computes the known one-page answer."""
        got = np.asarray(self._probe.scan(self._probe_batch)).reshape(-1)
        packed_ok = True
        if self._packed_probe is not None:
            batch, want = self._packed_probe
            packed_ok = np.array_equal(np.asarray(self._probe.scan(batch)), want)
        if not np.array_equal(got, self._probe_expected) or not packed_ok:
            raise RuntimeError("engine self-test gave a wrong accumulator")

    def close(self) -> None:
        self._probe.close()
        self.state.close()


def warm_up(snapshot: Snapshot, engine_name: str, engine_options: dict[str, Any] | None = None,
            pages: int = 64) -> str:
    """Compile the engine's kernels for exactly the shards' call signatures (read-only loaded
    pages, read-only key batches) on a few pages; returns the engine's name."""
    core = ShardCore(snapshot, 0, min(pages, snapshot.num_pages), engine_name, engine_options)
    try:
        core.self_test()
        keys = [generate_keys(core.domain_bits, i % core.stop_page)[0] for i in range(3)]
        batch = KeyBatch.from_keys(keys)
        core.scan(batch)
        eval_points(batch, np.zeros(1, np.int64))  # the pending-update path's kernel
        if "packed" in engines.key_formats(core.engine):
            packed = PackedKeyBatch.from_keys(
                [generate_packed_keys(core.domain_bits, i % core.stop_page)[0]
                 for i in range(3)])
            core.scan(packed)
            masks_at(packed, np.zeros(1, np.int64))
        return core.engine_name
    finally:
        core.close()
