"""Scan leases: a scan holds the segments of the version it read until it finishes.

A commit, a rotation or a fold retires the segments the new version no longer uses; a retired
segment is closed (device memory freed) when its last scan ends, never under one.
The counters live on the segments (`Lease`, in morphogen.party.version, beside `Segment`);
this module moves them under one lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from morphogen.party.version import Segment, Version


class ScanLeases:
    """One shard's current version and the scans holding segments of it or of older ones.

    The lock is held only for a handful of counter updates (and the swap of the current
    version), so scans never wait on a slow admin step; segments are closed outside it.
    """

    def __init__(self, current: Version) -> None:
        self._lock = threading.Lock()
        self._current = current

    @property
    def current(self) -> Version:
        return self._current

    def swap(self, version: Version) -> None:
        """Make `version` current: scans acquired from now on read it."""
        with self._lock:
            self._current = version

    def acquire(self) -> Version:
        """The current version, with a scan counted on each of its segments."""
        with self._lock:
            version = self._current  # one read: the scan finishes on this version
            for seg in version.segments:
                seg.lease.scans += 1
            return version

    def release(self, version: Version) -> None:
        """The scan on `version` ended: close the retired segments it was the last to hold."""
        done = []
        with self._lock:
            for seg in version.segments:
                seg.lease.scans -= 1
                if seg.lease.retired and seg.lease.scans == 0 and not seg.lease.closed:
                    seg.lease.closed = True
                    done.append(seg)
        _close(done)

    def retire(self, segments: Iterable[Segment], keep: Iterable[Segment] = ()) -> None:
        """Segments no version uses any more: closed now, or by the last scan holding them."""
        kept = {id(s) for s in keep}
        done = []
        with self._lock:
            for seg in segments:
                if id(seg) in kept or seg.lease.retired:
                    continue
                seg.lease.retired = True
                if seg.lease.scans == 0:
                    seg.lease.closed = True
                    done.append(seg)
        _close(done)


def _close(segments: Iterable[Segment]) -> None:
    for seg in segments:
        seg.scanner.close()
        seg.subs.close()
