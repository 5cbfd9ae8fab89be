"""EVM process stand-ins for the workers' queueing tests: threads whose runs each hold until
the test lets them end, so which run starts when is the test's to decide, never the clock's."""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from morphogen.wallet.workers import CallWorkers, Cancelled, Request, client

WAIT_S = 30.0  # bounds every wait on a condition; none is expected to come near it


class FakeProcess:
    """An EVM process stand-in: a run's tx names it (`label`) and holds it until
    `release[label]` is set (or the process is killed); every run started is in `ran`."""

    pids = itertools.count(1000)

    def __init__(self, world: World) -> None:
        self.world, self.pid = world, next(self.pids)
        self.conn = self
        self._out: queue.Queue[dict] = queue.Queue()
        self._killed = threading.Event()

    def send(self, args: tuple) -> None:
        label = args[2]["label"]
        with self.world.lock:
            self.world.ran.append(label)
        threading.Thread(target=self._run, args=(label,), daemon=True).start()

    def _run(self, label: str) -> None:
        hold = self.world.release.setdefault(label, threading.Event())
        while not hold.wait(0.01):
            if self._killed.is_set():
                return
        self._out.put({"ok": True, "out": label.encode(), "reason": "", "gas": 1, "runs": 1})

    def poll(self, timeout: float) -> bool:
        try:
            self._pending = self._out.get(timeout=timeout)
        except queue.Empty:
            return False
        return True

    def recv(self) -> dict:
        return self._pending

    def kill(self) -> None:
        self._killed.set()
        with self.world.lock:
            self.world.killed += 1

    def close(self) -> None:
        pass


class World:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ran: list[str] = []
        self.killed = 0
        self.release: dict[str, threading.Event] = {}

    def let(self, label: str) -> None:
        self.release.setdefault(label, threading.Event()).set()


def queue_runs(workers: CallWorkers, key: str, request: Request | None, labels: list[str],
               results: dict) -> list[threading.Thread]:
    """A thread a label, each running it as `key`'s (a `Cancelled` answer kept as the
    result)."""
    def one(label: str) -> None:
        with client(key, request):
            try:
                results[label] = workers.run("", {}, {"label": label}, False, WAIT_S)["out"]
            except Cancelled as exc:
                results[label] = exc

    threads = [threading.Thread(target=one, args=(lab,)) for lab in labels]
    for t in threads:
        t.start()
    return threads


@contextmanager
def fake_workers() -> Iterator[tuple[World, CallWorkers]]:
    """A world and one EVM process of it; on the way out every run is let end and the
    workers closed."""
    w = World()
    workers = CallWorkers(1, start=lambda: FakeProcess(w))
    try:
        yield w, workers
    finally:
        for e in list(w.release.values()):
            e.set()
        workers.close()
