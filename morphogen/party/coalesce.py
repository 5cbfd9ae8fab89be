"""Request coalescing: concurrent requests become one scan.

A scan costs one pass over the pages whatever the number of keys it carries (up to the engine's
batch), so merging concurrent requests into one shard call multiplies throughput. The coalescer
collects submissions for a short window (or until a maximum number of items), runs them as ONE
call, and hands each caller its own slice of the result, in order. It is the one place where
requests merge: the engines below it run each call as they receive it.

Two limits shape the batches:
- `window_s`: how long the first request of a batch waits for company. 0 turns coalescing off:
  every submission is its own call.
- `max_in_flight`: how many calls run at once, whatever their size (the bound a shard sees from
  this router). While it is reached, new submissions keep accumulating, so under load batches
  grow by themselves (natural batching) instead of queueing one small call per request.

A submission of `max_items` or more is a call of its own: it cannot share one, and it waits for a
slot but never for a window.

Only parts of one group share a call (`group`: a key of each part, e.g. the table and key domain
a query is of, since one scan covers one page range in one domain). A call takes the oldest
waiting part and the parts of its group behind it; the other groups' parts keep their place.

With `eager` (the default) a submission that finds the coalescer idle (nothing running,
nothing waiting) is dispatched at once: a lone client pays no window, and the window only
applies once there is traffic to merge with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sized
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T", bound=Sized)

# run(parts) -> (meta, results): results has one row per item of the parts, in order, and
# supports slicing.
RunFn = Callable[[list[T]], Awaitable[tuple[Any, Any]]]


@dataclass
class _Waiter(Generic[T]):
    part: T
    size: int
    alone: bool  # a call of its own (coalescing off, or a full call by itself)
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


class Coalescer(Generic[T]):
    """Merge concurrent `submit(part)` calls into batched `run(parts)` calls.

    A part is anything with a length (its items: keys). `submit` returns
    `(meta, results[offset:offset + len(part)])`; an exception from `run` reaches every
    submission of that call. Must be used from one event loop.
    """

    def __init__(
        self,
        run: RunFn[T],
        *,
        window_s: float = 0.002,
        max_items: int = 96,
        max_in_flight: int = 2,
        eager: bool = True,
        group: Callable[[T], Hashable] | None = None,
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
        self._group = group or (lambda part: None)
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

    async def submit(self, part: T) -> tuple[Any, Any]:
        size = len(part)
        if not size:
            raise ValueError("nothing to submit")
        alone = not self.enabled or size >= self.max_items
        idle = not self._pending and self._in_flight < self.max_in_flight and (
            alone or (self.eager and self._in_flight == 0))
        if idle:
            # run it right here, no task hop; later arrivals queue behind this call
            self._in_flight += 1
            self.stats.record(1, size)
            try:
                return await self._run([part])
            finally:
                self._slot_freed()
        loop = asyncio.get_running_loop()
        waiter: _Waiter[T] = _Waiter(part, size, alone, loop.create_future())
        self._pending.append(waiter)
        self._pending_items += size
        if alone or self._pending_items >= self.max_items:
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
        kept: list[_Waiter[T]] = []
        count = 0
        key: Hashable = None
        full = False  # a part of the group did not fit: the ones behind it wait too (order)
        for w in self._pending:
            if w.future.done():  # the caller went away (cancelled): skip its keys
                self._pending_items -= w.size
                continue
            if not batch:
                key = self._group(w.part)
            elif full or self._group(w.part) != key:
                kept.append(w)
                continue
            elif w.alone or batch[0].alone or count + w.size > self.max_items:
                full = True
                kept.append(w)
                continue
            batch.append(w)
            count += w.size
            self._pending_items -= w.size
        self._pending = kept
        return batch

    def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while self._due and self._pending and self._in_flight < self.max_in_flight:
            batch = self._take_batch()
            # leftovers were already waiting: they are due as soon as a slot frees up
            self._due = bool(self._pending)
            if not self._due and self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if not batch:
                continue
            self._in_flight += 1
            task = loop.create_task(self._execute(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _execute(self, batch: list[_Waiter[T]]) -> None:
        self.stats.record(len(batch), sum(w.size for w in batch))
        try:
            meta, results = await self._run([w.part for w in batch])
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
                if not w.future.done():
                    w.future.set_result((meta, results[offset : offset + w.size]))
                offset += w.size
        finally:
            self._slot_freed()

    def _slot_freed(self) -> None:
        self._in_flight -= 1
        if self._pending:
            # Whatever queued while a call ran has waited long enough: the freed slot takes it
            # at once rather than after the rest of a window.
            self._due = True
        self._dispatch()
