"""What a compacted epoch log keeps: a history record naming the committed publication ids
(the newest `HISTORY_MAX`), then the committed entries from the last rotation on, renumbered,
each with its commit. The update batches no kept entry names may go.

Which records to keep is the same for every backend; how the log is rewritten is each
backend's (`rewrite`), under the lock of its writers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from morphogen.publication.records import LogEntry, LogState

# Committed publication ids a compaction keeps (the newest): a publication re-sent after this
# many later ones is no longer recognised as a duplicate.
HISTORY_MAX = 20000


@dataclass(frozen=True)
class Compaction:
    records: list[LogEntry]  # the compacted log, from seq 0
    used: set[str | None]  # the update batches its records name


def compacted(state: LogState) -> Compaction:
    """The records of `state` once compacted (callers check that a proposal is decided)."""
    kept = state.live()
    keep_seq = {e.seq for e in kept}
    kept_pubs = {e.pub for e in kept}
    history = sorted((p for p in state.pubs.values() if p.pub not in kept_pubs),
                     key=lambda p: p.epoch_id)[-HISTORY_MAX:]
    records = [LogEntry(0, "history", 0, pubs=[
        [p.pub, p.epoch_id, p.identity, p.request] for p in history])]
    for e in state.entries:
        if e.seq in keep_seq:
            records.append(LogEntry(**{**asdict(e), "seq": len(records)}))
            records.append(LogEntry(len(records), "commit", e.epoch_id, of=len(records) - 1))
    return Compaction(records, {e.blob for e in kept})
