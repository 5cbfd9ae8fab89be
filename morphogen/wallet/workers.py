"""The processes that run revm (pyrevm) for eth_call and eth_estimateGas: one run at a time
each, handed out fairly between clients, and stopped when it runs too long.

pyrevm holds Python's interpreter lock while it waits on its fork's HTTP reads, so it runs in
processes of its own (spawned: no thread of the endpoint is copied), never in the process that
answers those reads. Each process has a driver thread here that gives it the next run and
waits for the answer:

- **Fairness.** Runs wait in one queue per client (an HTTP connection), and the drivers take
  the clients in turn, one run each: a connection's batch of a hundred calls does not hold
  another's single call behind it; that call waits for at most one run of each process.
- **Run time only.** A run's limit counts from when its process starts it, not from when it
  was queued. A run past it has its process killed (a run reads nothing from the parties and
  changes nothing, so nothing is lost) and is answered `RunTimedOut`; a new process takes its
  place. A process that dies under a run (killed, out of memory, a crash in the EVM) is
  replaced and the run given once more.
- **Given-up requests.** A run belongs to a `Request` (an HTTP request's JSON-RPC work, set
  around it by the endpoint with `client`), which is given up when its client goes away or
  its deadline passes. Its runs still queued are then dropped before they start (answered
  `Cancelled`), and one running is stopped at its time limit, which is never past the
  request's deadline: a client that disconnects mid-batch leaves no work to the processes
  beyond the runs already started.
- **A gas estimate** is the nodes' search (geth's `eth/gasestimator`, reth's, anvil's): one
  run with the gas cap, one at the gas used plus its refund and the call stipend, times 64/63,
  which nearly always succeeds, then bisection between the gas used and that, each step at
  most twice the last failure. Every step runs on the same EVM, its state reverted to a
  snapshot between them, so the fork's reads are made once, not once a step (a 40 M-gas loop
  is estimated in about 20 steps of milliseconds each). The search is exact, as anvil's:
  `ESTIMATE_ERROR_RATIO` set to geth's 0.015 stops it once the range is within 1.5% of its
  top (a few steps fewer, an answer up to 1.5% above the least gas). The call's EVM time
  limit bounds it either way.
"""

from __future__ import annotations

import logging
import multiprocessing
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

SPEC = "PRAGUE"
CALL_STIPEND = 2_300
# How far above the least gas an estimate may stop: 0, exact, as anvil answers (geth: 0.015)
ESTIMATE_ERROR_RATIO = 0.0
START_S = 120.0  # a process's start (importing pyrevm), at most
log = logging.getLogger(__name__)

# The client a thread's runs are queued for, and the request they are for: set around a
# request by the endpoint (the connection it came on); runs without one share one queue.
_current = threading.local()


class RunTimedOut(RuntimeError):
    """A run went past its time limit and was stopped."""


class Cancelled(RuntimeError):
    """The request was given up (its client went away, or its deadline passed): nothing
    more is run for it."""


class Request:
    """One HTTP request's JSON-RPC work (a request or a whole batch) as its runs see it:
    given up by `cancel` (the server, when the client goes away) or once `deadline_s` has
    passed. What is waiting to run for it is dropped then (`on_cancel`)."""

    def __init__(self, deadline_s: float | None = None) -> None:
        self.deadline = None if deadline_s is None else time.monotonic() + deadline_s
        self._why: str | None = None
        self._hooks: dict[int, Callable[[], None]] = {}
        self._next_hook = 0
        self._lock = threading.Lock()

    def cancel(self, why: str) -> None:
        with self._lock:
            if self._why is not None:
                return
            self._why = why
            hooks, self._hooks = list(self._hooks.values()), {}
        for hook in hooks:
            hook()

    def left(self) -> float | None:
        """Seconds to the deadline (None: none)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def given_up(self) -> str | None:
        """Why the request was given up; None while it stands."""
        if self._why is None and self.deadline is not None and time.monotonic() >= self.deadline:
            self.cancel("its deadline passed")
        return self._why

    def check(self) -> None:
        why = self.given_up()
        if why is not None:
            raise Cancelled(f"the request was given up: {why}")

    def on_cancel(self, hook: Callable[[], None]) -> Callable[[], None]:
        """`hook` called once when the request is given up (at once if it is); returns what
        forgets it."""
        with self._lock:
            if self._why is None:
                n = self._next_hook
                self._next_hook += 1
                self._hooks[n] = hook
                return lambda: self._forget(n)
        hook()
        return lambda: None

    def _forget(self, n: int) -> None:
        with self._lock:
            self._hooks.pop(n, None)


@contextmanager
def client(key: Hashable, request: Request | None = None) -> Iterator[None]:
    """Runs made by this thread inside are queued as `key`'s, for `request`."""
    before = getattr(_current, "key", None), getattr(_current, "request", None)
    _current.key, _current.request = key, request
    try:
        yield
    finally:
        _current.key, _current.request = before


def current_client() -> Hashable:
    return getattr(_current, "key", None)


def current_request() -> Request | None:
    return getattr(_current, "request", None)


class WorkerDied(RuntimeError):
    """The process running a run died twice under it."""


# -- in a worker process -----------------------------------------------------------------

def _evm(url: str, block: dict, tx: dict,
         accounts: Sequence[tuple[str, int, int, bytes, bytes]]) -> Any:
    import pyrevm

    listed = [(a, list(slots)) for a, slots in tx.get("access_list") or ()]
    env = pyrevm.Env(cfg=pyrevm.CfgEnv(chain_id=block["chain_id"]),
                     # base fee 0: a call at gas price 0 (revm refuses a price below it)
                     block=pyrevm.BlockEnv(number=block["number"],
                                           timestamp=block["timestamp"], basefee=0,
                                           gas_limit=block["gas_limit"],
                                           coinbase=block.get("coinbase"),
                                           prevrandao=block.get("prevrandao")),
                     # message_call keeps the access list of the environment's transaction
                     tx=pyrevm.TxEnv(access_list=listed) if listed else None)
    # the EVM's own gas limit is what GASLIMIT answers (it overrides the block's)
    evm = pyrevm.EVM(env=env, fork_url=url, fork_block=hex(block["number"]), spec_id=SPEC,
                     gas_limit=block["gas_limit"])
    # the accounts known up front go into the fork's own cache, where its reads would have
    # put them (no warmer: the cache is below the journal that tracks access)
    for address, balance, nonce, code_hash, code in accounts:
        evm.insert_account_info(address, pyrevm.AccountInfo(
            balance=balance, nonce=nonce, code_hash=code_hash, code=code or None))
    return evm


def run_call(url: str, block: dict, tx: dict, estimate: bool,
             accounts: Sequence[tuple[str, int, int, bytes, bytes]] = ()) -> dict:
    """One call (or a gas estimate) at `block`, its state read through `url`."""
    evm = _evm(url, block, tx, accounts)

    def attempt(gas: int) -> tuple[bool, bytes, str, int, int]:
        checkpoint = evm.snapshot()  # each attempt is a transaction of its own
        try:
            out = evm.message_call(tx["from"], tx["to"], tx["data"], tx["value"], gas, 0)
        except Exception as exc:  # pyrevm raises on revert and halt, naming which
            text = str(exc)
            data = re.search(r"0x((?:[0-9a-fA-F]{2})*)", text) if "Revert" in text else None
            return False, bytes.fromhex(data.group(1)) if data else b"", text[:300], 0, 0
        finally:
            evm.revert(checkpoint)
        res = evm.result
        used, refund = (res.gas_used, res.gas_refunded) if res is not None else (0, 0)
        return True, bytes(out), "", used, refund

    runs = 1
    ok, out, reason, used, refund = attempt(tx["gas"])
    if not estimate or not ok:
        return {"ok": ok, "out": out, "reason": reason, "gas": used, "runs": runs}
    lo, hi = max(used - 1, 0), tx["gas"]
    optimistic = (used + refund + CALL_STIPEND) * 64 // 63
    if optimistic < hi:
        runs += 1
        if attempt(optimistic)[0]:
            hi = optimistic
        else:
            lo = optimistic
    while lo + 1 < hi and (hi - lo) / hi > ESTIMATE_ERROR_RATIO:
        mid = min((lo + hi) // 2, 2 * lo)
        runs += 1
        if attempt(mid)[0]:
            hi = mid
        else:
            lo = mid
    return {"ok": True, "out": out, "reason": "", "gas": hi, "runs": runs}


def _serve(conn: Any) -> None:
    """A worker process: runs asked over `conn`, one at a time, until it closes."""
    import pyrevm  # noqa: F401 - loaded before the first run, not during it

    conn.send("ready")
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        try:
            conn.send(run_call(*job))
        except Exception as exc:  # noqa: BLE001 - the run's failure, by its type only
            conn.send({"crash": type(exc).__name__})


# -- in the endpoint -----------------------------------------------------------------------

class _Job:
    def __init__(self, args: tuple, limit_s: float, key: Hashable,
                 request: Request | None) -> None:
        self.args, self.limit_s, self.key, self.request = args, limit_s, key, request
        self.done = threading.Event()
        self.result: dict | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0  # the run's time in its process
        self.tries = 0


class _Process:
    """An EVM process: `conn` takes a run's arguments and gives its result."""

    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child,), daemon=True,
                                name="morphogen-evm")
        self.proc.start()
        child.close()
        if not self.conn.poll(START_S) or self.conn.recv() != "ready":
            self.kill()
            raise RuntimeError(f"an EVM process did not start within {START_S:g} s")

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(10)
        self.conn.close()


class CallWorkers:
    """`processes` EVM processes, fed fairly from per-client queues. `start`: what starts
    one (a spawned `_Process` by default; the tests' stand-ins run fake runs)."""

    def __init__(self, processes: int = 2, *, start: Callable[[], Any] | None = None) -> None:
        if processes < 1:
            raise ValueError("processes is at least 1")
        ctx = multiprocessing.get_context("spawn")
        self._start = start or (lambda: _Process(ctx))
        self._cond = threading.Condition()
        self._queues: OrderedDict[Hashable, deque[_Job]] = OrderedDict()
        self._closed = False
        # runs given to a process; runs of a given-up request dropped before they started;
        # runs stopped at their time limit (for the tests and the benchmarks)
        self.started = self.dropped = self.stopped = 0
        self._procs: list[Any] = []
        try:
            for _ in range(processes):
                self._procs.append(self._start())
        except BaseException:
            for p in self._procs:
                if p is not None:
                    p.kill()
            raise
        self._drivers = [threading.Thread(target=self._drive, args=(i,), daemon=True,
                                          name=f"morphogen-evm-driver-{i}")
                         for i in range(processes)]
        for d in self._drivers:
            d.start()

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p is not None and p.pid is not None]

    def counts(self) -> dict[str, int]:
        """Runs started, dropped unstarted, stopped at their limit; runs queued now."""
        with self._cond:
            return self._counts()

    def wait_for(self, predicate: Callable[[dict[str, int]], bool], timeout_s: float) -> bool:
        """Whether `predicate(counts())` came true within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not predicate(self._counts()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def _counts(self) -> dict[str, int]:
        return {"started": self.started, "dropped": self.dropped, "stopped": self.stopped,
                "queued": sum(len(q) for q in self._queues.values())}

    def run(self, url: str, block: dict, tx: dict, estimate: bool, limit_s: float,
            accounts: Sequence[tuple[str, int, int, bytes, bytes]] = ()) -> dict:
        """The run's result (its time in the process as "seconds"); `RunTimedOut` past
        `limit_s` of its own run time; `Cancelled` where the thread's request (`client`) is
        given up before the run starts, or its deadline stops it."""
        request = current_request()
        if request is not None:
            request.check()
        job = _Job((url, block, tx, estimate, list(accounts)), limit_s, current_client(),
                   request)
        with self._cond:
            if self._closed:
                raise RuntimeError("the EVM processes are closed")
            self._queues.setdefault(job.key, deque()).append(job)
            self._cond.notify_all()
        if request is None:
            job.done.wait()
        else:
            forget = request.on_cancel(lambda: self._drop(job))
            try:
                left = request.left()
                if not job.done.wait(None if left is None else max(left, 0.0)):
                    request.given_up()  # the deadline: dropped unless started
                    job.done.wait()  # a run started ends by the deadline (`_give`)
            finally:
                forget()
        if job.error is not None:
            raise job.error
        assert job.result is not None
        if "crash" in job.result:
            raise RuntimeError(f"the EVM failed ({job.result['crash']})")
        return {**job.result, "seconds": job.seconds}

    def _drop(self, job: _Job) -> None:
        """`job`'s request was given up: out of its queue, unless a process has it."""
        with self._cond:
            queue = self._queues.get(job.key)
            if queue is None or job not in queue:
                return
            queue.remove(job)
            if not queue:
                del self._queues[job.key]
            self._dropped(job)

    def _dropped(self, job: _Job) -> None:
        """(Holding the lock.) `job` answered `Cancelled`, never started."""
        assert job.request is not None
        self.dropped += 1
        job.error = Cancelled(f"the request was given up: {job.request.given_up()}")
        job.done.set()
        self._cond.notify_all()

    def _next(self) -> _Job | None:
        """The first client's next run, that client then last in turn; runs of given-up
        requests met on the way are dropped."""
        with self._cond:
            while True:
                while not self._closed and not self._queues:
                    self._cond.wait()
                if self._closed:
                    return None
                key, queue = next(iter(self._queues.items()))
                job = queue.popleft()
                if queue:
                    self._queues.move_to_end(key)
                else:
                    del self._queues[key]
                if job.request is not None and job.request.given_up() is not None:
                    self._dropped(job)
                    continue
                self.started += 1
                self._cond.notify_all()
                return job

    def _drive(self, i: int) -> None:
        while (job := self._next()) is not None:
            try:
                self._give(i, job)
            except Exception as exc:  # noqa: BLE001 - no process could be started
                job.error = exc
            job.done.set()
            # a process stopped under a run is replaced once that run is answered (a start
            # takes seconds), before this driver takes another
            if self._procs[i] is None and not self._closed:
                try:
                    self._procs[i] = self._start()
                except Exception as exc:  # noqa: BLE001 - tried again at the next run
                    log.warning("an EVM process did not start: %s", exc)

    def _give(self, i: int, job: _Job) -> None:
        proc = self._procs[i]
        if proc is None:
            proc = self._procs[i] = self._start()
        # never past the request's deadline: its client has stopped waiting by then
        left = job.request.left() if job.request is not None else None
        limit = job.limit_s if left is None else min(job.limit_s, left)
        started = time.monotonic()
        try:
            proc.conn.send(job.args)
            if proc.conn.poll(max(limit, 0.0)):
                job.result = proc.conn.recv()
                job.seconds = time.monotonic() - started
                return
        except (EOFError, OSError):  # the process died under the run
            self._stop(i, "an EVM process died: starting a new one")
            job.tries += 1
            if job.tries > 1:
                raise WorkerDied("the EVM process died twice under one run") from None
            self._give(i, job)
            return
        self._stop(i, None)  # the run goes on past its limit: stopped with its process
        job.seconds = time.monotonic() - started
        with self._cond:
            self.stopped += 1
            self._cond.notify_all()
        if limit < job.limit_s:
            raise Cancelled(f"the request's deadline passed {limit:.1f} s into a run")
        raise RunTimedOut(f"the EVM ran past {job.limit_s:.1f} s")

    def _stop(self, i: int, why: str | None) -> None:
        """Process `i` killed; the next run, or the driver once the run is answered,
        starts another."""
        if why:
            log.warning(why)
        proc, self._procs[i] = self._procs[i], None
        if proc is not None:
            proc.kill()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            left = [j for q in self._queues.values() for j in q]
            self._queues.clear()
            self._cond.notify_all()
        for j in left:
            j.error = RuntimeError("the EVM processes are closed")
            j.done.set()
        for d in self._drivers:
            d.join(timeout=30)
        for p in self._procs:
            if p is not None:
                p.kill()
