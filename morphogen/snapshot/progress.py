"""Progress of long writes and checks: bytes done, total and throughput."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

ProgressCallback = Callable[[int, int | None], None]
"""Called as ``progress(done_bytes, total_bytes)``; total is None when not known in advance."""
Progress = bool | ProgressCallback | None


class Meter:
    """Reports bytes done / total and throughput, to a callback or as a stderr line."""

    def __init__(self, progress: Progress, total: int | None, label: str) -> None:
        self._callback: ProgressCallback | None = None
        self._stderr = False
        if callable(progress):
            self._callback = progress
        elif progress:
            self._stderr = True
        self._total = total
        self._label = label
        self._done = 0
        self._t0 = time.monotonic()
        self._last = 0.0
        self._tty = self._stderr and sys.stderr.isatty()
        # A terminal gets one line rewritten in place; a log gets a line every few seconds.
        self._interval = 0.2 if self._tty else 5.0

    def advance(self, nbytes: int) -> None:
        self._done += nbytes
        if self._callback is not None:
            self._callback(self._done, self._total)
        elif self._stderr:
            now = time.monotonic()
            if now - self._last >= self._interval:
                self._last = now
                self._emit(final=False)

    def finish(self) -> None:
        if self._stderr:
            self._emit(final=True)

    def _emit(self, *, final: bool) -> None:
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        rate = self._done / elapsed / 1e6
        done = self._done / 2**30
        if self._total:
            pct = 100.0 * self._done / self._total
            what = f"{done:.2f} / {self._total / 2**30:.2f} GiB ({pct:5.1f}%)"
        else:
            what = f"{done:.2f} GiB"
        line = f"{self._label}: {what} {rate:8.1f} MB/s"
        if final:
            line += f" in {elapsed:.1f} s"
        if self._tty:
            sys.stderr.write("\r" + line + ("\n" if final else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
