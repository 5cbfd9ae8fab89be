"""A shard's scan workspaces and the pool that lends them to concurrent scan calls.

A workspace holds everything one launch needs: its own non-blocking stream (so launches on
different workspaces overlap), pinned host buffers and device buffers. The pool is a plain
bounded lender: a scan call takes a free workspace, waiting its turn (first come, first served)
while none is free, runs its own launches on it and gives it back. Calls are never merged:
merging concurrent requests into one pass is the router's coalescer's job
(morphogen/party/coalesce.py). The pool size is the number of launches in flight; every launch
is a full pass over the pages, so two side by side already keep the device busy (one runs while
the next is packed and copied).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence

import numpy as np

from morphogen.constants import MAX_DOMAIN_BITS, PAGE_SIZE
from morphogen.engine.gpu_backend import Backend
from morphogen.engine.gpu_errors import GpuError
from morphogen.engine.gpu_keys import key_words

log = logging.getLogger(__name__)

DEFAULT_POOL_SIZE = 2
MAX_POOL_SIZE = 32
POOL_SIZE_ENV = "MORPHOGEN_GPU_POOL_SIZE"
# Device memory left free after the pages and workspaces (CuPy, the driver, other kernels).
DEVICE_RESERVE_BYTES = 256 << 20


def clamp_pool_size(value: object) -> int:
    """A pool size from configuration: an integer, clamped to 1..MAX_POOL_SIZE."""
    if isinstance(value, bool):
        raise TypeError("pool_size must be an integer, got a bool")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ValueError(f"pool_size must be an integer, got {value!r}") from None
    if not isinstance(value, int | np.integer):
        raise TypeError(f"pool_size must be an integer, got {type(value).__name__}")
    size = int(value)
    clamped = min(max(size, 1), MAX_POOL_SIZE)
    if clamped != size:
        log.warning("gpu pool_size %d clamped to %d (range 1..%d)", size, clamped, MAX_POOL_SIZE)
    return clamped


def fit_pool_size(wanted: int, workspace_bytes: int, free_bytes: int) -> int:
    """How many of `wanted` workspaces fit `free_bytes` of device memory, DEVICE_RESERVE_BYTES
    kept free; GpuError where not even one fits."""
    fits = (free_bytes - DEVICE_RESERVE_BYTES) // workspace_bytes
    if fits < 1:
        raise GpuError(
            f"no device memory left for a scan workspace ({workspace_bytes} bytes) after the pages"
        )
    if fits < wanted:
        log.warning("gpu pool_size %d reduced to %d to fit device memory", wanted, fits)
    return int(min(wanted, fits))


class Workspace:
    """Everything one launch needs, used by one scan call at a time: its own stream (so that
    launches of different workspaces overlap), pinned host buffers and device buffers."""

    def __init__(self, backend: Backend, index: int, max_keys: int, partial_rows: int) -> None:
        self.index = index
        self.max_keys = max_keys
        self.partial_rows = partial_rows
        key_bytes = max_keys * key_words(MAX_DOMAIN_BITS) * 4
        self.stream = backend.new_stream()
        self.keys_host = backend.alloc_pinned(key_bytes)[:key_bytes].view(np.uint32)
        self.keys_dev = backend.alloc(key_bytes)
        self.partial_dev = backend.alloc(partial_rows * PAGE_SIZE)
        self.out_dev = backend.alloc(max_keys * PAGE_SIZE)
        self.out_host = backend.alloc_pinned(max_keys * PAGE_SIZE)[: max_keys * PAGE_SIZE]
        self.events = tuple(backend.new_event() for _ in range(4))

    @staticmethod
    def device_bytes(max_keys: int, partial_rows: int) -> int:
        return max_keys * (key_words(MAX_DOMAIN_BITS) * 4 + PAGE_SIZE) + partial_rows * PAGE_SIZE


class Lease:
    """One scan call's hold on a workspace (`WorkspacePool.lease`)."""

    __slots__ = ("workspace", "wait_ms", "_overlapped")

    def __init__(self, workspace: Workspace, wait_ms: float) -> None:
        self.workspace = workspace
        self.wait_ms = wait_ms  # how long the call waited for the workspace
        self._overlapped = False  # another lease was held since the last `overlapped()`


class _Waiter:
    __slots__ = ("workspace", "closed")

    def __init__(self) -> None:
        self.workspace: Workspace | None = None
        self.closed = False


class WorkspacePool:
    """Lends a bounded set of workspaces to threads, one caller per workspace at a time.

    `lease()` hands a free workspace to the caller, or queues it until one comes back; a
    returned workspace goes straight to the longest waiting caller. Nobody holds a lock while a
    launch runs, so W workspaces give W launches in flight, each on its own stream.
    """

    def __init__(self, workspaces: Sequence[Workspace]) -> None:
        if not workspaces:
            raise ValueError("the pool needs at least one workspace")
        self._all = tuple(workspaces)
        self._free = list(workspaces)
        self._waiting: deque[_Waiter] = deque()
        self._held: set[Lease] = set()
        self._cond = threading.Condition()
        self._closed = False

    @property
    def size(self) -> int:
        return len(self._all)

    @property
    def workspaces(self) -> tuple[Workspace, ...]:
        """Every workspace of the pool, lent or free."""
        return self._all

    @contextlib.contextmanager
    def lease(self) -> Iterator[Lease]:
        """A workspace for the caller's launches, given back when the block ends. Raises
        RuntimeError where the pool is closed, or closes while the caller waits."""
        start = time.perf_counter()
        with self._cond:
            if self._closed:
                raise RuntimeError("the shard is closed")
            if self._free and not self._waiting:
                ws = self._free.pop()
            else:
                waiter = _Waiter()
                self._waiting.append(waiter)
                try:
                    while waiter.workspace is None and not waiter.closed:
                        self._cond.wait()
                except BaseException:  # interrupted while waiting: hand on what it was given
                    if waiter.workspace is not None:
                        self._hand_on_locked(waiter.workspace)
                    elif waiter in self._waiting:
                        self._waiting.remove(waiter)
                    raise
                if waiter.workspace is None:
                    raise RuntimeError("the shard was closed before this scan ran")
                ws = waiter.workspace
            lease = Lease(ws, (time.perf_counter() - start) * 1e3)
            lease._overlapped = bool(self._held)
            for other in self._held:
                other._overlapped = True
            self._held.add(lease)
        try:
            yield lease
        finally:
            self._give_back(lease)

    def overlapped(self, lease: Lease) -> bool:
        """Whether another lease was held at some moment since `lease` began or since the
        previous call for it (PhaseTimings.shared_launches, counted per launch)."""
        with self._cond:
            was = lease._overlapped
            lease._overlapped = len(self._held) > 1
            return was

    def _give_back(self, lease: Lease) -> None:
        with self._cond:
            self._held.discard(lease)
            self._hand_on_locked(lease.workspace)

    def _hand_on_locked(self, ws: Workspace) -> None:
        """`ws` to the longest waiting caller, else back to the free list."""
        if self._waiting:
            self._waiting.popleft().workspace = ws
        else:
            self._free.append(ws)
        self._cond.notify_all()

    def close(self) -> None:
        """Refuses new leases, fails the callers still waiting (RuntimeError) and returns once
        every lease in flight has given its workspace back."""
        with self._cond:
            self._closed = True
            while self._waiting:
                self._waiting.popleft().closed = True
            self._cond.notify_all()
            while len(self._free) < len(self._all):
                self._cond.wait()
