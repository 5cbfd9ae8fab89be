"""How long another publisher's lease has left, judged on this process's own clock.

A lease record (a proposal or its `renew`) says how long the lease lasts (`lease_for_ms`), and
each reader times it itself: the lease starts when the reader first sees the record that last
renewed it, on the reader's monotonic clock, and ends once the reader has seen no newer
renewal for the length plus `LEASE_SLACK`. The writer's wall clock (`lease_ms`, the end as the
writer saw it) is never consulted: a publisher whose clock ran ten minutes fast would otherwise
block every publication for ten minutes after it died, and one whose clock ran slow would see
its live lease taken.

Why no reader ends a lease the writer still counts on: the writer counts its lease from before
it wrote the record, a reader from after it read it, so the reader's end is the later one, up
to the difference in the two monotonic clocks' rates (parts per million; the slack covers
far more). Whoever aborts a proposal does so under the log's lock (flock, or the create-only
next record) and in the same step as its own proposal, so two readers that both judge a lease
ended still leave one undecided proposal; a publisher whose proposal was aborted learns it at
its decision (EpochLogConflict) and commits nothing.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time

from morphogen.publication.records import EpochLogBusy, LogEntry, LogState

# Monotonic clocks of two machines run at rates a few parts per million apart: 2% is room for
# any of them, and for a reader that reads the log a little late.
LEASE_SLACK = 0.02
# A proposal of an earlier version carries only its writer's wall-clock end: it is given the
# longest lease a party may configure (PartyConfig.admin_lease_s), so that no live writer of
# that version loses it early.
LEGACY_LEASE_S = 300.0

monotonic = time.monotonic  # the clock leases are timed on (a test sets its own)

# A publisher that finds another's proposal undecided looks again after FIRST_POLL_S, twice as
# long each time the same proposal is still undecided, up to MAX_POLL_S.
FIRST_POLL_S = 0.005
MAX_POLL_S = 0.1
poll_clock = time.monotonic  # times a waiter's reads: real time, whatever `monotonic` is


def lease_length_s(record: LogEntry) -> float:
    """The length of the lease `record` (a proposal or a renewal) grants."""
    if record.lease_for_ms is None:
        return LEGACY_LEASE_S
    return record.lease_for_ms / 1000.0


def _key(state: LogState) -> tuple[int, str | None, str | None, int] | None:
    """What names the latest renewal of the undecided proposal: while a proposal is undecided
    only its renewals may follow it, so the last record is the proposal or its latest `renew`."""
    pending = state.pending
    if pending is None or not state.entries:
        return None
    return pending.seq, pending.pub, pending.publisher, state.entries[-1].seq


class LeaseWatch:
    """One reader's view of the undecided proposal's lease (one per EpochLog; thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: tuple[tuple[int, str | None, str | None, int], float] | None = None
        # ^ the latest renewal seen, and the lease's end on this clock

    def _end(self, state: LogState, key: tuple[int, str | None, str | None, int],
             start: float) -> float:
        length = lease_length_s(state.entries[-1]) * (1 + LEASE_SLACK)
        with self._lock:
            seen = self._seen
            if seen is not None and seen[0] == key:
                return seen[1]
            end = start + length
            if seen is not None and seen[0][:3] == key[:3]:
                end = max(end, seen[1])  # a shorter renewal does not shorten the lease
            self._seen = (key, end)
            return end

    def wrote(self, state: LogState, started: float) -> None:
        """This process wrote the proposal or renewal last in `state`, starting at `started`:
        its own lease counts from before its write, earlier than any other reader's."""
        key = _key(state)
        if key is not None:
            self._end(state, key, started)

    def left_s(self, state: LogState) -> float:
        """Seconds until the undecided proposal's lease ends as this reader sees it (0: ended,
        or nothing undecided)."""
        key = _key(state)
        if key is None:
            return 0.0
        now = monotonic()
        return max(0.0, self._end(state, key, now) - now)


class BusyWait:
    """How long a publisher waits before it reads the log again, while another publisher's
    proposal is undecided (one per proposal attempt, created just before its first read).

    The other publisher's decision is followed within milliseconds by its next proposal when
    it has more to publish, and a waiter only gets in if it reads the log in between. So the
    wait starts short and starts short again whenever the log has moved on to another
    proposal; it grows only while one proposal stays undecided (a slow prepare, a dead
    publisher), where reading often would only cost requests. A fixed 250 ms sleep missed that
    gap again and again: the two-writer p99 was many times the median. A wait is about as long
    as the last read took at least, so a waiter does not spend most of its time reading a long
    log (CPU the other publisher and the store need). The jitter keeps two waiters from reading
    in step. Never past the lease's end (plus 10 ms, so that the next read finds it ended): then
    the proposal is aborted at once.
    """

    def __init__(self) -> None:
        self._holder: tuple[int, str | None, str | None] | None = None
        self._step = FIRST_POLL_S
        self._woke = poll_clock()

    def next_s(self, busy: EpochLogBusy) -> float:
        if busy.holder is None or busy.holder != self._holder:
            self._holder, self._step = busy.holder, FIRST_POLL_S
        else:
            self._step = min(2 * self._step, MAX_POLL_S)
        read_s = poll_clock() - self._woke
        return min(busy.remaining_s + 0.01, max(self._step, read_s) * random.uniform(0.5, 1.5))

    async def sleep(self, busy: EpochLogBusy) -> None:
        await asyncio.sleep(self.next_s(busy))
        self._woke = poll_clock()
