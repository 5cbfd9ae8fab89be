"""Request coalescing: concurrent requests become one scan.

A scan costs one pass over the pages whatever the number of keys it carries (up to the engine's
batch), so merging concurrent requests into one shard call multiplies throughput. The coalescer
collects submissions for a short window (or until a maximum number of items), runs them as ONE
call, and hands each caller its own slice of the result, in order.

Two limits shape the batches:
- `window_s`: how long the first request of a batch waits for company. 0 turns coalescing off:
  every submission is its own call.
- `max_in_flight`: how many merged calls may run at once. While the limit is reached, new
  submissions keep accumulating, so under load batches grow by themselves (natural batching)
  instead of queueing one small call per request.

A submission of `max_items` or more goes straight to its own call: it cannot share one.

With `eager` (the default) a submission that finds the coalescer idle (nothing running,
nothing waiting) is dispatched at once: a lone client pays no window, and the window only
applies once there is traffic to merge with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# run(items) -> (meta, results) where results[i] belongs to items[i] and supports slicing.
RunFn = Callable[[list[T]], Awaitable[tuple[Any, Any]]]


@dataclass
class _Waiter(Generic[T]):
    items: Sequence[T]
    future: asyncio.Future[tuple[Any, Any]]


@dataclass
class CoalescerStats:
    calls: int = 0
    submissions: int = 0
    items: int = 0
    largest: int = 0

    def record(self, submissions: int, items: int) -> None:
        self.calls += 1
        self.submissions += submissions
        self.items += items
        self.largest = max(self.largest, items)

    @property
    def mean_items_per_call(self) -> float:
        return self.items / self.calls if self.calls else 0.0


class Coalescer(Generic[T]):
    """Merge concurrent `submit(items)` calls into batched `run(all_items)` calls.

    `submit` returns `(meta, results[offset:offset + len(items)])`; an exception from `run`
    reaches every submission of that batch. Must be used from one event loop.
    """

    def __init__(
        self,
        run: RunFn[T],
        *,
        window_s: float = 0.002,
        max_items: int = 96,
        max_in_flight: int = 2,
        eager: bool = True,
    ) -> None:
        if window_s < 0:
            raise ValueError("window_s must be >= 0")
        if max_items < 1 or max_in_flight < 1:
            raise ValueError("max_items and max_in_flight must be >= 1")
        self._run = run
        self.window_s = float(window_s)
        self.max_items = int(max_items)
        self.max_in_flight = int(max_in_flight)
        self.eager = bool(eager)
        self._pending: list[_Waiter[T]] = []
        self._pending_items = 0
        self._timer: asyncio.TimerHandle | None = None
        self._due = False  # the oldest pending submission has waited its window
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = CoalescerStats()

    @property
    def enabled(self) -> bool:
        return self.window_s > 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def submit(self, items: Sequence[T]) -> tuple[Any, Any]:
        if not items:
            raise ValueError("nothing to submit")
        if not self.enabled or len(items) >= self.max_items:
            # Nothing to merge with: coalescing is off, or the submission fills a whole call by
            # itself, and waiting in line for a slot would only add latency.
            self.stats.record(1, len(items))
            return await self._run(list(items))
        if self.eager and not self._pending and self._in_flight == 0:
            # Idle: run it right here, no task hop; later arrivals queue behind this call.
            self._in_flight += 1
            self.stats.record(1, len(items))
            try:
                return await self._run(list(items))
            finally:
                self._slot_freed()
        loop = asyncio.get_running_loop()
        waiter: _Waiter[T] = _Waiter(items, loop.create_future())
        self._pending.append(waiter)
        self._pending_items += len(items)
        if self._pending_items >= self.max_items:
            self._due = True
        elif self._timer is None and not self._due:
            self._timer = loop.call_later(self.window_s, self._on_timer)
        self._dispatch()
        return await waiter.future

    def _on_timer(self) -> None:
        self._timer = None
        if self._pending:
            self._due = True
        self._dispatch()

    def _take_batch(self) -> list[_Waiter[T]]:
        batch: list[_Waiter[T]] = []
        count = 0
        while self._pending:
            w = self._pending[0]
            if batch and count + len(w.items) > self.max_items:
                break
            self._pending.pop(0)
            if w.future.done():  # the caller went away (cancelled): skip its keys
                self._pending_items -= len(w.items)
                continue
            batch.append(w)
            count += len(w.items)
        self._pending_items -= count
        return batch

    def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while self._due and self._pending and self._in_flight < self.max_in_flight:
            batch = self._take_batch()
            if self._pending_items >= self.max_items:
                self._due = True
            elif self._pending:
                # Leftovers were already waiting: they are due as soon as a slot frees up.
                self._due = True
            else:
                self._due = False
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
            if not batch:
                continue
            self._in_flight += 1
            task = loop.create_task(self._execute(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _execute(self, batch: list[_Waiter[T]]) -> None:
        flat: list[T] = [item for w in batch for item in w.items]
        self.stats.record(len(batch), len(flat))
        try:
            meta, results = await self._run(flat)
        except asyncio.CancelledError:
            for w in batch:
                w.future.cancel()
            raise
        except Exception as exc:  # every waiter of the batch must hear about it
            for w in batch:
                if not w.future.done():
                    w.future.set_exception(exc)
        else:
            offset = 0
            for w in batch:
                n = len(w.items)
                if not w.future.done():
                    w.future.set_result((meta, results[offset : offset + n]))
                offset += n
        finally:
            self._slot_freed()

    def _slot_freed(self) -> None:
        self._in_flight -= 1
        if self._pending:
            # Whatever queued while a call ran has waited long enough: the freed slot takes it
            # at once rather than after the rest of a window.
            self._due = True
        self._dispatch()

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for w in self._pending:
            if not w.future.done():
                w.future.cancel()
        self._pending.clear()
        self._pending_items = 0
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
