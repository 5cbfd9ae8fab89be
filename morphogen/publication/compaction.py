"""What a compacted epoch log keeps: a history record naming the committed publication ids
(the newest `HISTORY_MAX`, as many of them as fit in `HISTORY_BYTES`), then the committed
entries from the last rotation on, renumbered, each with its commit. The update batches no
kept entry names may go.

Updates since that rotation beyond the newest `FOLD_KEEP` are folded into one `fold` entry:
one batch with the net change of all of them (morphogen.protocol.changes.composed), so a log
that takes a block's changes every few seconds and never rotates still starts a router or a
replica from a bounded number of records and batches. A replica up to `FOLD_KEEP`
publications behind catches up record by record; one further behind restarts and replays
from its snapshot.

Which records to keep is the same for every backend; how the log is rewritten is each
backend's (`rewrite`), under the lock of its writers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

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
# rotation are folded into one batch. A replica this many publications behind still catches
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
    blobs: dict[str, tuple[bytes, ...]] = field(default_factory=dict)  # to write first
    # Fold batches at or below this epoch may go: every fold a later compaction writes is
    # above it (it folds this one's fold or base and more), so a sweep that stalls after its
    # seal never deletes a fold a later, live record names.
    fold_floor: int = -1


def _newest_that_fit(rows: list[list[object]]) -> list[list[object]]:
    """The newest `rows` (oldest first) whose encoding, one comma each, fits HISTORY_BYTES."""
    size, kept = 0, 0
    for row in reversed(rows):
        size += len(json_text(row)) + 1
        if size > HISTORY_BYTES:
            break
        kept += 1
    return rows[len(rows) - kept:]


def _kept(state: LogState) -> tuple[list[LogEntry], list[LogEntry]]:
    """(what a replay needs, oldest first; the part of it to fold into one batch)."""
    live = state.live()
    start = 1 if live and live[0].kind == "rotation" else 0
    changes = live[start:]
    fold = changes[: max(0, len(changes) - FOLD_KEEP)]
    if len(fold) == 1 and fold[0].kind == "fold":
        fold = []  # folded already
    return live, fold


def size_after(state: LogState) -> int:
    """How many records `compacted(state)` would hold (nothing read, nothing framed)."""
    live, fold = _kept(state)
    kept = len(live) - len(fold) + (1 if fold else 0)
    # a fold is only ever the first of the changes, so a new one absorbs the old
    folds = 1 if fold else sum(1 for e in live if e.kind == "fold")
    return 1 + 2 * kept - folds  # history, each kept entry with its commit (a fold has none)


def worth_compacting(state: LogState) -> bool:
    """Whether a compaction would drop `COMPACT_AFTER` records or more (once the proposal
    undecided in `state`, if any, is decided: a compaction waits for that)."""
    return len(state.entries) - size_after(state) >= COMPACT_AFTER


def _fold(fold: list[LogEntry], load: Load) -> tuple[LogEntry, tuple[bytes, ...]]:
    """The fold entry standing for `fold` (consecutive committed entries) and its batch."""
    last = fold[-1]
    loaded = load(fold)
    # digested as its newest batch was: the version its publisher chose for both parties,
    # which every replica reading this log then reads
    batch = composed(loaded).with_digest(loaded[-1].digest_version)
    entry = LogEntry(0, "fold", last.epoch_id, last.identity, base_epoch=fold[0].base_epoch,
                     blob=blob_name(last.epoch_id, batch.digest, "fold"),
                     blob_digest=batch.digest, count=len(batch),
                     snapshot_checksum=last.snapshot_checksum, chain=last.chain)
    return entry, encode_batch(batch)


def compacted(state: LogState, load: Load | None = None) -> Compaction:
    """The records of `state` once compacted (callers check that a proposal is decided);
    `load` reads the batches of entries to fold (without it nothing is folded).
    Framed here, before a backend deletes or writes anything: a record readers would refuse
    raises ValueError and leaves the log as it was."""
    live, fold = _kept(state)
    if load is None:
        fold = []
    kept, blobs = live, {}
    if fold:
        entry, parts = _fold(fold, load)  # type: ignore[arg-type]
        assert entry.blob is not None
        blobs[entry.blob] = parts
        at = live.index(fold[0])
        kept = live[:at] + [entry] + live[at + len(fold):]
    kept_pubs = {e.pub for e in kept}
    history = sorted((p for p in state.pubs.values() if p.pub not in kept_pubs),
                     key=lambda p: p.epoch_id)[-HISTORY_MAX:]
    records = [LogEntry(0, "history", 0, pubs=_newest_that_fit(
        [[p.pub, p.epoch_id, p.identity, p.request] for p in history]))]
    for e in kept:
        records.append(LogEntry(**{**asdict(e), "seq": len(records)}))
        if e.kind != "fold":  # a fold decides nothing: it stands committed
            records.append(LogEntry(len(records), "commit", e.epoch_id, of=len(records) - 1))
    return Compaction(records, [frame(e) for e in records], {e.blob for e in kept}, blobs,
                      _floor(kept))


def _floor(kept: list[LogEntry]) -> int:
    """The epoch of the fold kept, else the epoch the kept entries start from."""
    for e in kept:
        if e.kind == "fold":
            return e.epoch_id
    if not kept:
        return -1
    first = kept[0]
    return first.epoch_id if first.kind == "rotation" else int(first.base_epoch or 0)
