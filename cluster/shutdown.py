"""Stopping `morphogen serve` within a stated bound, whatever it is doing when asked.

The first SIGINT or SIGTERM interrupts whatever the main thread waits on (starting Ray, a
deployment that never becomes ready, the serving loop) by raising `StopRequested` there, and
starts a watchdog. The stop itself runs its steps in a helper thread so that a step blocked on
a dead cluster (a signal to the process group kills Ray's head processes too, and every call
then waits on the GCS for a minute) is abandoned as soon as the cluster is seen dead. A second
signal, or the watchdog at `STOP_BOUND_S`, forces: every process of the tree is killed and the
process exits at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from cluster import processes
from cluster.report import eprint

STOP_BOUND_S = 15.0
WAKE_S = 0.5  # how late a signal taken by another thread may be seen


class StopRequested(BaseException):  # noqa: N818 - a request, not an error
    """Raised in the main thread by the first signal. A BaseException so that no `except
    Exception` on the way (Ray's, Serve's) swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Stopper:
    """The signal handlers and the bound of one `serve` process."""

    def __init__(self, bound_s: float = STOP_BOUND_S, label: str = "[serve]") -> None:
        self.bound_s = bound_s
        self.label = label
        self.signum: int | None = None
        self.stop_started: float | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self.tracked: set[processes.Proc] = set()

    def install(self) -> None:
        """(Re)install the handlers: `ray.init` installs its own SIGTERM handler, which exits
        at once, so this is called again after it."""
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def wait(self) -> None:
        """Wait for the first signal, which raises `StopRequested` here. The signals are
        unblocked in this (the main) thread, whatever a library set up, and the wait is short
        sleeps: a signal the kernel hands another thread (one of Ray's) runs the handler only
        when this thread next runs Python, which a sleep of an hour would put off by an hour."""
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        while True:
            time.sleep(WAKE_S)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            eprint(f"{self.label} second {name}: forcing")
            self.force(128 + signum)
        self.signum = signum
        eprint(f"{self.label} {name}: stopping (at most {self.bound_s:.0f} s; "
               f"{name} again forces)")
        self.begin()
        if not self._stopping_now():
            raise StopRequested(signum)

    def _stopping_now(self) -> bool:
        with self._lock:
            stopping, self._stopping = self._stopping, True
            return stopping

    def begin(self) -> None:
        """Start the bound (once): called on the first signal and when a stop begins for any
        other reason (an error, a failed check)."""
        with self._lock:
            if self.stop_started is not None:
                return
            self.stop_started = time.monotonic()
        threading.Thread(target=self._watchdog, name="stop-watchdog", daemon=True).start()

    def enter_stop(self) -> None:
        """From here on a first signal no longer raises: the stop is under way."""
        self._stopping_now()
        self.begin()

    def remaining(self) -> float:
        started = self.stop_started if self.stop_started is not None else time.monotonic()
        return max(0.0, started + self.bound_s - time.monotonic())

    def elapsed(self) -> float:
        return 0.0 if self.stop_started is None else time.monotonic() - self.stop_started

    def _watchdog(self) -> None:
        time.sleep(self.remaining())
        eprint(f"{self.label} not stopped after {self.bound_s:.0f} s: forcing")
        self.force(1)

    def force(self, code: int) -> None:
        """Kill every process of this tree and exit now."""
        procs = self.tracked | processes.descendants()
        processes.signal_all(procs, signal.SIGKILL)
        eprint(f"{self.label} killed {len(procs)} process(es); exiting")
        exit_now(code)

    def run_step(self, fn: Callable[[], Any], abandon_if: Callable[[], bool],
                 budget_s: float | None = None) -> bool:
        """Run one stop step in a helper thread; True when it finished, False when it failed,
        ran out of time, or `abandon_if()` said the cluster it talks to is gone."""
        done = threading.Event()
        failed: list[BaseException] = []

        def target() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported, the stop goes on
                failed.append(exc)
            finally:
                done.set()

        threading.Thread(target=target, name="stop-step", daemon=True).start()
        deadline = time.monotonic() + (self.remaining() if budget_s is None
                                       else min(budget_s, self.remaining()))
        while not done.wait(0.1):
            if abandon_if() or time.monotonic() >= deadline:
                return False
        if failed:
            eprint(f"{self.label} {type(failed[0]).__name__}: {failed[0]}")
        return not failed


def exit_now(code: int) -> None:
    """Exit without interpreter shutdown: Ray's exit hook would wait on a dead cluster."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
