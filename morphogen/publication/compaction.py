"""What a compacted epoch log keeps: a history record naming the committed publication ids
(the newest `HISTORY_MAX`, as many of them as fit in `HISTORY_BYTES`), then the committed
entries from the last rotation on, renumbered, each with its commit. The update batches no
kept entry names may go.

Updates since that rotation beyond the newest `FOLD_KEEP` are folded into `fold` entries, each
one batch with the net change of a run of them (morphogen.protocol.changes.composed), so a log
that takes a block's changes every few seconds and never rotates still starts a router or a
replica from a bounded number of records and batches. A replica up to `FOLD_KEEP`
publications behind catches up record by record; one further behind restarts and replays
from its snapshot.

The folds are kept in levels, oldest and largest first, as a binary counter keeps its digits:
a compaction folds the updates it drops into a new fold, together with the newest folds no
larger than what it folds. A fold of P pages is rewritten each time what comes after it has
grown to P, so a page is folded again about log2(F / B) times for a fold of F pages and
compactions of B, and a compaction costs what it adds, not everything since the rotation:
a party that follows a chain and never rotates would otherwise rewrite up to the whole
matrix's worth of diffs every 64 blocks. The folds number at most about log2(F / B) + 1.

Which records to keep is the same for every backend; how the log is rewritten is each
backend's (`rewrite`), under the lock of its writers. The fold's batch is composed before
that lock is taken (`fold_run`, `make_fold`): a fold of millions of pages takes seconds, and
writers must not wait for it. `compacted` then uses the fold only where the run it stands for
is still in the log as it was (another compaction may have folded it meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from morphogen.protocol.changes import ChangeBatch, composed
from morphogen.publication.records import (
    MAX_PAYLOAD,
    LogEntry,
    LogState,
    blob_name,
    encode_batch,
    frame,
    json_text,
)

# Committed publication ids a compaction keeps (the newest): a publication re-sent after this
# many later ones is no longer recognised as a duplicate.
HISTORY_MAX = 20000
# What the kept ids may take in the history record. The history is the one record that grows
# with the log's age, and readers refuse a record over MAX_PAYLOAD: 20,000 rotations (their
# requests carry the snapshot path) encode to more than that, and a history readers refuse
# stops every replica of the party. The rest of the record (seq, kind, epoch, the keys) is
# under 100 bytes; a 64 KiB margin keeps the bound safe however that part encodes, and costs
# at most ~300 of the 20,000 ids (at ~225 bytes each). The writer checks the frame anyway.
HISTORY_BYTES = MAX_PAYLOAD - (64 << 10)
# Committed updates a compaction keeps as records (the newest); older ones since the last
# rotation are folded. A replica this many publications behind still catches
# up from the records.
FOLD_KEEP = 64
# Records a compaction would drop before a publication of updates starts one: bounds what a
# new reader of the log reads (about this many records, plus the compacted ones).
COMPACT_AFTER = 128

Load = Callable[[list[LogEntry]], list[ChangeBatch]]


@dataclass(frozen=True)
class Compaction:
    records: list[LogEntry]  # the compacted log, from seq 0
    frames: list[bytes]  # their bytes, each checked against the readers' limit
    used: set[str | None]  # the update batches its records name
    # Fold batches at or below this epoch may go: every fold a later compaction writes is
    # above it (it folds the updates after the newest fold kept, and any folds it takes
    # with them), so a sweep that stalls after its seal never deletes a fold a later, live
    # record names.
    fold_floor: int = -1


@dataclass(frozen=True)
class Fold:
    """A fold made ahead of a compaction: the entry standing for `run` (consecutive committed
    entries of the log: folds, then updates) and its batch's bytes, written before the lock."""

    run: tuple[LogEntry, ...]
    entry: LogEntry
    parts: tuple[bytes, ...]


def _newest_that_fit(rows: list[list[object]]) -> list[list[object]]:
    """The newest `rows` (oldest first) whose encoding, one comma each, fits HISTORY_BYTES."""
    size, kept = 0, 0
    for row in reversed(rows):
        size += len(json_text(row)) + 1
        if size > HISTORY_BYTES:
            break
        kept += 1
    return rows[len(rows) - kept:]


def _changes(state: LogState) -> tuple[list[LogEntry], int]:
    """(the committed entries a replay needs, oldest first; where the changes since the last
    rotation start among them)."""
    live = state.live()
    return live, 1 if live and live[0].kind == "rotation" else 0


def fold_run(state: LogState) -> list[LogEntry]:
    """The consecutive entries a compaction of `state` folds into one new fold (empty when
    it folds nothing): the committed updates beyond the newest `FOLD_KEEP`, with the newest
    folds whose pages are no more than those after them (sizes as the records give them,
    before any page two of them share is counted once)."""
    live, start = _changes(state)
    changes = live[start:]
    n_folds = next((i for i, e in enumerate(changes) if e.kind != "fold"), len(changes))
    folds, updates = changes[:n_folds], changes[n_folds:]
    new = updates[: max(0, len(updates) - FOLD_KEEP)]
    if not new:
        return []
    size = sum(int(e.count or 0) for e in new)
    at = len(folds)
    while at > 0 and int(folds[at - 1].count or 0) <= size:
        at -= 1
        size += int(folds[at].count or 0)
    return folds[at:] + new


def make_fold(run: list[LogEntry], load: Load) -> Fold:
    """The fold standing for `run` (`fold_run`), its batches read with `load`."""
    last = run[-1]
    loaded = load(run)
    # digested as its newest batch was: the version its publisher chose for both parties,
    # which every replica reading this log then reads
    batch = composed(loaded).with_digest(loaded[-1].digest_version)
    entry = LogEntry(0, "fold", last.epoch_id, last.identity, base_epoch=run[0].base_epoch,
                     blob=blob_name(last.epoch_id, batch.digest, "fold"),
                     blob_digest=batch.digest, count=len(batch),
                     snapshot_checksum=last.snapshot_checksum, chain=last.chain)
    return Fold(tuple(run), entry, encode_batch(batch))


def _same(a: LogEntry, b: LogEntry) -> bool:
    """Whether two records are one committed entry (seqs change as a log is compacted)."""
    return (a.kind, a.epoch_id, a.identity, a.blob) == (b.kind, b.epoch_id, b.identity, b.blob)


def _find(live: list[LogEntry], run: tuple[LogEntry, ...]) -> int | None:
    """Where `run` starts in `live`, consecutive and as it was; None when it is not there."""
    for at, e in enumerate(live):
        if _same(e, run[0]):
            part = live[at:at + len(run)]
            ok = len(part) == len(run) and all(
                _same(x, y) for x, y in zip(part, run, strict=True))
            return at if ok else None
    return None


def _kept(state: LogState, fold: Fold | None) -> list[LogEntry]:
    live, _ = _changes(state)
    at = None if fold is None else _find(live, fold.run)
    if fold is None or at is None:
        return live
    return live[:at] + [fold.entry] + live[at + len(fold.run):]


def size_after(state: LogState) -> int:
    """How many records a compaction of `state` would hold, its fold made (nothing read,
    nothing framed)."""
    live, _ = _changes(state)
    run = fold_run(state)  # a slice of `live`, which one fold replaces
    kept = len(live) - len(run) + (1 if run else 0)
    folds = (sum(1 for e in live if e.kind == "fold") - sum(1 for e in run if e.kind == "fold")
             + (1 if run else 0))
    return 1 + 2 * kept - folds  # history, each kept entry with its commit (a fold has none)


def worth_compacting(state: LogState) -> bool:
    """Whether a compaction would drop `COMPACT_AFTER` records or more (once the proposal
    undecided in `state`, if any, is decided: a compaction waits for that)."""
    return len(state.entries) - size_after(state) >= COMPACT_AFTER


def compacted(state: LogState, fold: Fold | None = None) -> Compaction:
    """The records of `state` once compacted (callers check that a proposal is decided), with
    `fold` in place of its run where that run is in `state` as it was (else nothing is
    folded). Framed here, before a backend deletes or writes anything: a record readers would
    refuse raises ValueError and leaves the log as it was."""
    kept = _kept(state, fold)
    kept_pubs = {e.pub for e in kept}
    history = sorted((p for p in state.pubs.values() if p.pub not in kept_pubs),
                     key=lambda p: p.epoch_id)[-HISTORY_MAX:]
    records = [LogEntry(0, "history", 0, pubs=_newest_that_fit(
        [[p.pub, p.epoch_id, p.identity, p.request] for p in history]))]
    for e in kept:
        records.append(LogEntry(**{**asdict(e), "seq": len(records)}))
        if e.kind != "fold":  # a fold decides nothing: it stands committed
            records.append(LogEntry(len(records), "commit", e.epoch_id, of=len(records) - 1))
    return Compaction(records, [frame(e) for e in records], {e.blob for e in kept},
                      _floor(kept))


def _floor(kept: list[LogEntry]) -> int:
    """The epoch of the newest fold kept, else the epoch the kept entries start from."""
    for e in reversed(kept):
        if e.kind == "fold":
            return e.epoch_id
    if not kept:
        return -1
    first = kept[0]
    return first.epoch_id if first.kind == "rotation" else int(first.base_epoch or 0)
