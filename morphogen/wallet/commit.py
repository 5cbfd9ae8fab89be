"""Group commit: the requests that arrive while one read is out share the next read.

Used by the wallet's endpoint for its rounds of lookups, its head reads and its reads of the
parties' /epoch: each request still gets a read that began after it arrived.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class _Slot(Generic[T]):
    __slots__ = ("item", "done", "result", "error")

    def __init__(self, item: T) -> None:
        self.item, self.done = item, False
        self.result: Any = None
        self.error: BaseException | None = None


class GroupCommit(Generic[T, R]):
    """`submit(item)` returns `run(items)`'s answer for it, where `run` takes every item
    submitted while the previous run was in flight, in one call made by one submitting
    thread (no thread of its own). An exception from `run` is every item's.

    With `coming` (how many submitters are on their way, not yet queued), a run waits up to
    `gather_s` for them: calls in flight finish their runs milliseconds apart, and without the
    wait the first would take a round alone and the rest the next one."""

    def __init__(self, run: Callable[[Sequence[T]], Sequence[R]], *,
                 coming: Callable[[], int] | None = None, gather_s: float = 0.0) -> None:
        self._run, self._coming, self._gather_s = run, coming, gather_s
        self._cond = threading.Condition()
        self._queue: list[_Slot[T]] = []
        self._busy = False

    def changed(self) -> None:
        """`coming` may have dropped: a run gathering items looks again."""
        with self._cond:
            self._cond.notify_all()

    def submit(self, item: T, queued: Callable[[], None] | None = None) -> R:
        """`queued` is called once the item is queued, before any run can take it."""
        slot = _Slot(item)
        with self._cond:
            self._queue.append(slot)
            if queued is not None:
                queued()
            self._cond.notify_all()  # a run gathering items counts this one
            while not slot.done:
                if self._busy:
                    self._cond.wait()
                    continue
                self._busy = True
                if self._coming is not None:
                    deadline = time.monotonic() + self._gather_s
                    while self._coming() > 0:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                batch, self._queue = self._queue, []
                self._cond.release()
                try:
                    try:
                        results = list(self._run([s.item for s in batch]))
                        if len(results) != len(batch):
                            raise RuntimeError("a round answered another count of items")
                        for s, r in zip(batch, results, strict=True):
                            s.result = r
                    except BaseException as exc:  # every waiting call gets it, none hangs
                        for s in batch:
                            s.error = exc
                finally:
                    self._cond.acquire()
                    for s in batch:
                        s.done = True
                    self._busy = False
                    self._cond.notify_all()
        if slot.error is not None:
            raise slot.error
        return slot.result
