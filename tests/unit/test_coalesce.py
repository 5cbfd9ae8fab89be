"""The request coalescer: merging, ordering, limits, errors, cancellation."""

from __future__ import annotations

import asyncio
import time

import pytest

from morphogen.party.coalesce import Coalescer


class _Recorder:
    def __init__(self, delay: float = 0.0, fail: Exception | None = None,
                 hold: asyncio.Event | None = None) -> None:
        self.calls: list[list[int]] = []
        self.delay = delay
        self.fail = fail
        self.hold = hold  # the first call runs until it is set
        self.running = 0
        self.max_running = 0

    async def __call__(self, parts: list[list[int]]):
        items = [x for part in parts for x in part]
        self.calls.append(items)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            if self.hold is not None and len(self.calls) == 1:
                await self.hold.wait()
            await asyncio.sleep(self.delay)
            if self.fail:
                raise self.fail
            return len(self.calls), [x * 10 for x in items]
        finally:
            self.running -= 1


def test_concurrent_submissions_become_one_call_split_in_order() -> None:
    rec = _Recorder()

    async def main():
        c = Coalescer(rec, window_s=0.02, max_items=100, max_in_flight=1, eager=False)
        return await asyncio.gather(*(c.submit([i, i + 100]) for i in range(10)))

    results = asyncio.run(main())
    assert len(rec.calls) == 1
    assert rec.calls[0] == [x for i in range(10) for x in (i, i + 100)]
    for i, (meta, res) in enumerate(results):
        assert meta == 1
        assert res == [i * 10, (i + 100) * 10]


def test_max_items_splits_batches_without_splitting_a_request() -> None:
    rec = _Recorder()

    async def main():
        c = Coalescer(rec, window_s=0.05, max_items=6, max_in_flight=4, eager=False)
        return await asyncio.gather(*(c.submit([i] * 3) for i in range(5)))

    results = asyncio.run(main())
    assert [len(c) for c in rec.calls] == [6, 6, 3]
    assert [r for _, r in results] == [[i * 10] * 3 for i in range(5)]


def test_full_batch_does_not_wait_for_the_window() -> None:
    rec = _Recorder()

    async def main():
        c = Coalescer(rec, window_s=10.0, max_items=4, max_in_flight=1, eager=False)
        return await asyncio.wait_for(asyncio.gather(c.submit([1, 2]), c.submit([3, 4])), 1.0)

    asyncio.run(main())
    assert rec.calls == [[1, 2, 3, 4]]


def test_window_zero_is_off() -> None:
    rec = _Recorder()

    async def main():
        c = Coalescer(rec, window_s=0, max_items=100, max_in_flight=1)
        assert not c.enabled
        return await asyncio.gather(*(c.submit([i]) for i in range(4)))

    asyncio.run(main())
    assert sorted(rec.calls) == [[0], [1], [2], [3]]


def test_in_flight_limit_grows_batches_under_load() -> None:
    async def main():
        # the first call held running until the others have queued (not for a time: a host
        # that stalls the loop longer than the call lasted would let it finish first)
        release = asyncio.Event()
        c = Coalescer(rec := _Recorder(hold=release), window_s=0.001, max_items=1000,
                      max_in_flight=1)
        first = asyncio.create_task(c.submit([0]))
        while not rec.running:
            await asyncio.sleep(0)
        rest = [asyncio.create_task(c.submit([i])) for i in range(1, 20)]
        while c._pending_items < 19:
            await asyncio.sleep(0)
        release.set()
        await asyncio.gather(first, *rest)
        return c, rec

    c, rec = asyncio.run(main())
    assert rec.max_running == 1
    assert rec.calls[0] == [0]
    assert rec.calls[1] == list(range(1, 20))  # everything that queued meanwhile, at once
    assert c.stats.calls == 2 and c.stats.items == 20


def test_error_reaches_every_waiter_of_the_batch() -> None:
    rec = _Recorder(fail=RuntimeError("shard down"))

    async def main():
        c = Coalescer(rec, window_s=0.01, max_items=100, max_in_flight=1, eager=False)
        return await asyncio.gather(*(c.submit([i]) for i in range(3)), return_exceptions=True)

    results = asyncio.run(main())
    assert len(rec.calls) == 1
    assert all(isinstance(r, RuntimeError) for r in results)


def test_cancelled_waiter_does_not_break_the_others() -> None:
    rec = _Recorder(delay=0.02)

    async def main():
        c = Coalescer(rec, window_s=0.01, max_items=100, max_in_flight=1, eager=False)
        a = asyncio.create_task(c.submit([1]))
        b = asyncio.create_task(c.submit([2]))
        await asyncio.sleep(0)
        a.cancel()
        res = await b
        with pytest.raises(asyncio.CancelledError):
            await a
        return res

    meta, res = asyncio.run(main())
    assert res == [20]
    assert rec.calls == [[2]]  # the cancelled request's keys were dropped before the call


def test_eager_when_idle_then_merges() -> None:
    rec = _Recorder(delay=0.03)

    async def main():
        c = Coalescer(rec, window_s=10.0, max_items=100, max_in_flight=1)
        t0 = asyncio.get_running_loop().time()
        first = await c.submit([0])  # idle: no window to wait
        alone = asyncio.get_running_loop().time() - t0
        burst = await asyncio.gather(*(c.submit([i]) for i in range(1, 6)))
        return alone, first, burst

    t = time.monotonic()
    alone, first, burst = asyncio.run(main())
    assert time.monotonic() - t < 5.0  # nobody waited out the 10 s window
    assert alone < 1.0
    assert first[1] == [0]
    # the first of the burst found the coalescer idle and went alone; the rest waited for it
    assert rec.calls == [[0], [1], [2, 3, 4, 5]]
    assert [r for _, r in burst] == [[10], [20], [30], [40], [50]]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        Coalescer(_Recorder(), window_s=-1)
    with pytest.raises(ValueError):
        Coalescer(_Recorder(), max_items=0)

    async def main():
        with pytest.raises(ValueError):
            await Coalescer(_Recorder()).submit([])

    asyncio.run(main())


def test_a_submission_that_fills_a_call_waits_for_a_slot_not_for_the_window() -> None:
    rec = _Recorder(delay=0.05)

    async def main():
        c = Coalescer(rec, window_s=10.0, max_items=4, max_in_flight=1)
        small = asyncio.create_task(c.submit([1]))  # takes the only slot
        await asyncio.sleep(0.01)
        # the 10 s window would make wait_for fail if the big one queued for a merge
        _, big = await asyncio.wait_for(c.submit([5, 6, 7, 8, 9]), 1.0)
        await small
        return big

    big = asyncio.run(main())
    assert big == [50, 60, 70, 80, 90]
    assert rec.calls == [[1], [5, 6, 7, 8, 9]]  # not merged with [1]
    assert rec.max_running == 1  # and not beside it: max_in_flight is a bound


@pytest.mark.parametrize("window_s", [0.0, 0.001])
def test_no_more_calls_than_max_in_flight_whatever_the_submissions(window_s: float) -> None:
    rec = _Recorder(delay=0.01)

    async def main():
        c = Coalescer(rec, window_s=window_s, max_items=4, max_in_flight=2)
        sizes = [1, 6, 2, 4, 1, 9, 3, 1] * 3  # small, full and oversized, concurrently
        got = await asyncio.gather(*(c.submit([i] * n) for i, n in enumerate(sizes)))
        return sizes, got

    sizes, got = asyncio.run(main())
    assert rec.max_running == 2
    assert [r for _, r in got] == [[i * 10] * n for i, n in enumerate(sizes)]
    if window_s == 0:
        assert len(rec.calls) == len(sizes)  # off: one call per submission


def test_only_parts_of_one_group_share_a_call_and_others_keep_their_order() -> None:
    rec = _Recorder()

    async def main():
        c = Coalescer(rec, window_s=0.02, max_items=100, max_in_flight=1, eager=False,
                      group=lambda part: part[0] % 2)
        return await asyncio.gather(*(c.submit([i, i]) for i in (1, 2, 3, 4, 5, 6)))

    results = asyncio.run(main())
    # odd parts first (the oldest is odd); the evens wait for the next call, in order
    assert rec.calls == [[1, 1, 3, 3, 5, 5], [2, 2, 4, 4, 6, 6]]
    assert [r for _, r in results] == [[i * 10] * 2 for i in (1, 2, 3, 4, 5, 6)]
