"""Private reads shared by the calls in flight: group commit over rounds of lookups.

A call's reads come in rounds (what its last run touched and was not known), and a round costs
one private request of each table whatever it holds. So the rounds of calls in flight are
merged: what calls ask while a round is being read waits and goes out together in the next one,
read by one of the waiting threads. A wallet opening twenty token balances at once pays for a
handful of rounds, not twenty calls' worth. The head, where a call needs it (a given block, or
none seen yet), is read the same way: one read of the signed descriptor for the calls that
arrived while the last one was out (each call still gets a head read that began after it
arrived).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from morphogen.wallet.commit import GroupCommit
from morphogen.wallet.state import CallCache, PrivateState
from morphogen.wallet.versions import Served

# How long a round waits at most for the calls coming to theirs: a few runs' time.
GATHER_S = 0.05


@dataclass
class Want:
    """What a call's run touched and nothing it holds answers: accounts, code (by hash) and
    storage words (address, 32-byte slot)."""

    accounts: set[bytes] = field(default_factory=set)
    code: set[bytes] = field(default_factory=set)
    words: set[tuple[bytes, bytes]] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.accounts or self.code or self.words)

    def merge(self, other: Want) -> None:
        self.accounts |= other.accounts
        self.code |= other.code
        self.words |= other.words


def lacking(want: Want, state: PrivateState, cache: CallCache) -> Want:
    """What of `want` neither `cache` (one version's reads) nor the code kept holds."""
    return Want({a for a in want.accounts if a not in cache.accounts},
                {h for h in want.code if state.known_code(h) is None},
                {w for w in want.words if w not in cache.words})


class Coming:
    """A call `Rounds` waits for, until it arrives (once)."""

    def __init__(self, rounds: Rounds) -> None:
        self._rounds, self._done = rounds, False

    def arrived(self) -> None:
        with self._rounds._lock:
            if self._done:
                return
            self._done = True
            self._rounds._active -= 1
        self._rounds._rounds.changed()  # a call answered without a round: none waits on it


class Rounds:
    """The rounds and head reads of the calls of one endpoint."""

    def __init__(self, state: PrivateState, *, gather_s: float = GATHER_S) -> None:
        self.state = state
        self.rounds = 0  # rounds read (padding included), for the benchmark and the tests
        self._active = 0  # calls coming to their first round, and those announced
        self._announced: list[list[int]] = []  # per batch: its calls not started yet
        self._lock = threading.Lock()
        self._rounds: GroupCommit[tuple[Served, CallCache, Want, bool],
                                  tuple[Served | None, bool]] = GroupCommit(
            self._read, coming=lambda: self._active, gather_s=gather_s)
        self._heads: GroupCommit[None, Served] = GroupCommit(
            lambda items: [self.state.head()] * len(items))

    def head(self) -> Served:
        return self._heads.submit(None)

    @contextmanager
    def expecting(self, calls: int) -> Iterator[None]:
        """A batch's `calls` counted as coming before their threads start (they start a few
        milliseconds apart, and a round would otherwise leave the late ones to the next)."""
        left = [calls]
        with self._lock:
            self._active += calls
            self._announced.append(left)
        try:
            yield
        finally:
            with self._lock:
                self._active -= left[0]  # the ones that never started (a bad param, say)
                self._announced.remove(left)
            self._rounds.changed()

    @contextmanager
    def coming(self) -> Iterator[Coming]:
        """A call from its start to its first round (or its answer, reading none): a round
        waits for the calls coming (`GATHER_S` at most) before it goes out. Later rounds of
        a call are not waited for: with the call's memo, most calls need one."""
        with self._lock:
            announced = next((a for a in self._announced if a[0] > 0), None)
            if announced is not None:
                announced[0] -= 1  # counted already
            else:
                self._active += 1
        mark = Coming(self)
        try:
            yield mark
        finally:
            mark.arrived()

    def fetch(self, served: Served, cache: CallCache, want: Want,
              coming: Coming | None = None, *, held: bool = False
              ) -> tuple[Served | None, bool]:
        """`want` read (an empty `want`: a padding round): `(at, read)`, `at` the version it
        was read at, into `cache` where that is `served` (else the call runs again at the
        version returned), None where a publication came mid-round (nothing kept). `held`:
        the caller's version is confirmed by other means (GET /epoch), so where the rounds
        before this one have read all of a non-empty `want` into `cache` (calls at a version
        just reached, queued behind the round that read the working set there), no round
        is read: `(served, False)`. Otherwise `read` is True, and `at` is what a round that
        began after the call came says the parties serve."""
        return self._rounds.submit((served, cache, want, held),
                                   None if coming is None else coming.arrived)

    def _read(self, items: Sequence[tuple[Served, CallCache, Want, bool]]
              ) -> list[tuple[Served | None, bool]]:
        groups: dict[int, tuple[Served, CallCache, Want, list[bool]]] = {}
        for served, cache, want, held in items:
            if id(cache) not in groups:
                groups[id(cache)] = (served, cache, Want(), [])
            groups[id(cache)][2].merge(want)
            groups[id(cache)][3].append(held and bool(want))
        outcome: dict[int, tuple[Served | None, bool]] = {}
        for key, (served, cache, want, held_all) in groups.items():
            if all(held_all):  # none of these reads needs the round to name a version
                want = lacking(want, self.state, cache)
                if not want:
                    outcome[key] = (served, False)
                    continue
            self.rounds += 1
            outcome[key] = (self.state.read_round(served, cache, want.accounts, want.code,
                                                  want.words), True)
        return [outcome[id(cache)] for _, cache, _, _ in items]
