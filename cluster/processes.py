"""The processes a local cluster leaves behind, found and ended.

Ray's head processes are children of the driver, its workers children of the raylet, and
Serve's HAProxy a child of a worker. When the raylet dies first (a signal to the whole process
group reaches it too) the workers and their HAProxy are re-parented away from the driver, and an
HAProxy left running keeps the HTTP port answering 500. So the driver makes itself a child
subreaper (Linux): orphans of its tree are re-parented to it, stay its descendants, and are
ended with the rest. Processes are named by (pid, start time) so that a recycled pid is never
signalled.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from pathlib import Path

Proc = tuple[int, int]  # (pid, start time in clock ticks since boot)

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux >= 3.4); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of a process, None when it is gone or unreadable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), fields[0], int(fields[19])


def descendants(root: int | None = None) -> set[Proc]:
    """Live (not zombie) descendants of `root` (default: this process), from /proc."""
    root = os.getpid() if root is None else root
    children: dict[int, list[Proc]] = {}
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        return set()
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        st = _stat(int(entry.name))
        if st is not None and st[1] != "Z":
            children.setdefault(st[0], []).append((int(entry.name), st[2]))
    out: set[Proc] = set()
    todo = [root]
    while todo:
        for proc in children.get(todo.pop(), []):
            if proc not in out:
                out.add(proc)
                todo.append(proc[0])
    return out


def alive(procs: set[Proc]) -> set[Proc]:
    out = set()
    for pid, start in procs:
        st = _stat(pid)
        if st is not None and st[2] == start and st[1] != "Z":
            out.add((pid, start))
    return out


def signal_all(procs: set[Proc], sig: int) -> None:
    for pid, _ in alive(procs):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def end(procs: set[Proc], grace_s: float = 2.0) -> set[Proc]:
    """SIGTERM, then SIGKILL what is still alive after `grace_s`; returns what survived."""
    signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while alive(procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    signal_all(procs, signal.SIGKILL)
    deadline = time.monotonic() + 1.0
    while alive(procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(procs)
