"""The GPU engine's workspace pool on its own (no backend): one caller per workspace, waiting
callers served first come first served, overlap accounting, and close()."""

from __future__ import annotations

import threading
import time

import pytest

from morphogen.engine.gpu_pool import WorkspacePool


def wait_until(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def waiting(pool: WorkspacePool) -> int:
    with pool._cond:
        return len(pool._waiting)


def test_a_lease_holds_one_workspace_and_gives_it_back():
    a, b = object(), object()
    pool = WorkspacePool([a, b])
    assert pool.size == 2 and pool.workspaces == (a, b)
    with pool.lease() as first, pool.lease() as second:
        assert {first.workspace, second.workspace} == {a, b}
        assert first.wait_ms >= 0 and second.wait_ms >= 0
    with pool.lease() as again:  # both back
        assert again.workspace in (a, b)
    with pytest.raises(ValueError):
        WorkspacePool([])


def test_waiting_callers_are_served_in_arrival_order():
    pool = WorkspacePool([object()])
    order: list[int] = []
    held = pool.lease()
    held.__enter__()
    threads = []
    for i in range(4):
        def take(i=i):
            with pool.lease() as lease:
                order.append(i)
                assert lease.wait_ms > 0
        t = threading.Thread(target=take)
        t.start()
        threads.append(t)
        wait_until(lambda i=i: waiting(pool) == i + 1)  # queued in this order
    held.__exit__(None, None, None)
    for t in threads:
        t.join(5)
    assert order == [0, 1, 2, 3]


def test_overlap_is_reported_per_launch():
    pool = WorkspacePool([object(), object()])
    with pool.lease() as a:
        assert not pool.overlapped(a)  # alone so far
        with pool.lease() as b:
            assert pool.overlapped(b)  # a was held when b began
            assert pool.overlapped(a)  # b began while a was held
        assert pool.overlapped(a)  # b was still held when a's previous launch ended
        assert not pool.overlapped(a)  # since then a has been alone


def test_close_waits_for_leases_and_fails_waiters():
    pool = WorkspacePool([object()])
    held = pool.lease()
    held.__enter__()
    outcome: list[str] = []

    def take():
        try:
            with pool.lease():
                outcome.append("ran")
        except RuntimeError as exc:
            outcome.append(str(exc))

    waiter = threading.Thread(target=take)
    waiter.start()
    wait_until(lambda: waiting(pool) == 1)
    closer = threading.Thread(target=pool.close)
    closer.start()
    waiter.join(5)
    assert outcome == ["the shard was closed before this scan ran"]
    time.sleep(0.05)
    assert closer.is_alive()  # still waiting for the lease in flight
    held.__exit__(None, None, None)
    closer.join(5)
    assert not closer.is_alive()
    with pytest.raises(RuntimeError, match="closed"), pool.lease():
        pass


def test_an_error_inside_a_lease_gives_the_workspace_back():
    pool = WorkspacePool([object()])
    with pytest.raises(KeyError), pool.lease():
        raise KeyError("launch failed")
    with pool.lease() as lease:
        assert lease.wait_ms < 1000


def test_an_interrupted_waiter_loses_no_workspace(monkeypatch):
    pool = WorkspacePool([object()])
    held = pool.lease()
    held.__enter__()
    calls = []
    real_wait = pool._cond.wait

    def interrupted_wait(timeout=None):
        calls.append(1)
        if len(calls) == 1:
            held.__exit__(None, None, None)  # the workspace is handed to the waiter ...
            raise KeyboardInterrupt  # ... which is interrupted before it wakes
        return real_wait(timeout)

    monkeypatch.setattr(pool._cond, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt), pool.lease():
        pass
    monkeypatch.undo()
    assert waiting(pool) == 0
    with pool.lease() as lease:  # the workspace went back to the pool
        assert lease.wait_ms < 1000
    pool.close()
