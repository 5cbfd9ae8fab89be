"""Advice to the kernel on pages of a mapping, a run of consecutive pages a call, in a kernel
that does not hold the interpreter's lock: read them in ahead (`WILLNEED`: a cold cache's
reads of thousands of scattered pages queued together, about 4x faster here than one fault
at a time) or map them writable now (`POPULATE_WRITE`, Linux 5.14 and later).

Advice is only ever a speed-up: where the kernel refuses it, `advise` says so and nothing
else changes. It reads and writes no byte of the mapping.
"""

from __future__ import annotations

import logging
import threading

import numba
import numpy as np
from numba import types

from morphogen.constants import PAGE_SIZE

log = logging.getLogger(__name__)

WILLNEED = 3          # <sys/mman.h>
POPULATE_WRITE = 23   # <linux/mman.h>

# libc's madvise, bound by name where the kernel is loaded (and cached with it)
_madvise = types.ExternalFunction("madvise", types.intc(types.uintp, types.uintp, types.intc))


def runs(which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first page and the length of each run of consecutive pages of `which` (sorted,
    unique page numbers)."""
    which = np.asarray(which, np.int64)
    if not len(which):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(which) != 1) + 1])
    ends = np.concatenate([starts[1:], [len(which)]])
    return which[starts], ends - starts


@numba.njit(cache=True, nogil=True)
def _advise(base, first, lengths, page, advice):
    """madvise each run; the index of the first the kernel refused, or -1."""
    for i in range(len(first)):
        if _madvise(base + np.uintp(first[i] * page), np.uintp(lengths[i] * page), advice):
            return i
    return -1


_LINKED: list[bool] = []


def _linked() -> bool:
    """Whether the kernel could be built here (a platform without madvise cannot)."""
    if not _LINKED:
        try:
            _advise(np.uintp(0), np.zeros(0, np.int64), np.zeros(0, np.int64), PAGE_SIZE,
                    WILLNEED)
            _LINKED.append(True)
        except Exception:  # noqa: BLE001 - numba's lowering or linking error: no advice
            log.debug("no madvise here: pages are not advised", exc_info=True)
            _LINKED.append(False)
    return _LINKED[0]


def advise(base: int, which: np.ndarray, advice: int, stop: threading.Event | None = None,
           *, chunk: int = 64, page: int = PAGE_SIZE) -> bool:
    """Advise pages `which` (sorted, unique numbers of `page`-byte pages) of the mapping at
    address `base`, `chunk` runs of consecutive pages a call, until `stop` is set. False
    where the kernel refuses the advice, or the platform has none (the rest is not asked)."""
    if not _linked():
        return False
    first, lengths = runs(which)
    for at in range(0, len(first), chunk):
        if stop is not None and stop.is_set():
            break
        if _advise(np.uintp(base), first[at:at + chunk], lengths[at:at + chunk], page,
                   advice) >= 0:
            return False
    return True


def warm() -> None:
    """Load (or compile) the kernel now: a follower calls it as it starts."""
    _linked()
