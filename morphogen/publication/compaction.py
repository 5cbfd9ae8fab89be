"""What a compacted epoch log keeps: a history record naming the committed publication ids
(the newest `HISTORY_MAX`, as many of them as fit in `HISTORY_BYTES`), then the committed
entries from the last rotation on, renumbered, each with its commit. The update batches no
kept entry names may go.

Which records to keep is the same for every backend; how the log is rewritten is each
backend's (`rewrite`), under the lock of its writers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from morphogen.publication.records import MAX_PAYLOAD, LogEntry, LogState, frame, json_text

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


@dataclass(frozen=True)
class Compaction:
    records: list[LogEntry]  # the compacted log, from seq 0
    frames: list[bytes]  # their bytes, each checked against the readers' limit
    used: set[str | None]  # the update batches its records name


def _newest_that_fit(rows: list[list[object]]) -> list[list[object]]:
    """The newest `rows` (oldest first) whose encoding, one comma each, fits HISTORY_BYTES."""
    size, kept = 0, 0
    for row in reversed(rows):
        size += len(json_text(row)) + 1
        if size > HISTORY_BYTES:
            break
        kept += 1
    return rows[len(rows) - kept:]


def compacted(state: LogState) -> Compaction:
    """The records of `state` once compacted (callers check that a proposal is decided).
    Framed here, before a backend deletes or writes anything: a record readers would refuse
    raises ValueError and leaves the log as it was."""
    kept = state.live()
    keep_seq = {e.seq for e in kept}
    kept_pubs = {e.pub for e in kept}
    history = sorted((p for p in state.pubs.values() if p.pub not in kept_pubs),
                     key=lambda p: p.epoch_id)[-HISTORY_MAX:]
    records = [LogEntry(0, "history", 0, pubs=_newest_that_fit(
        [[p.pub, p.epoch_id, p.identity, p.request] for p in history]))]
    for e in state.entries:
        if e.seq in keep_seq:
            records.append(LogEntry(**{**asdict(e), "seq": len(records)}))
            records.append(LogEntry(len(records), "commit", e.epoch_id, of=len(records) - 1))
    return Compaction(records, [frame(e) for e in records], {e.blob for e in kept})
