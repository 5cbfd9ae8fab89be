"""Where a benchmark's CPU time went: seconds of CPU (user + system) per process group, read
from /proc before and after a measured window (Linux). Ray names its worker processes after
what they run (`ray::ServeReplica:app:Router`, `ray::ProxyActor`, ...), which is the grouping:
on a machine whose cores the server shares with the load, every CPU second spent outside the
scan is a second the scan did not get."""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _group(pid: str) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if not raw:
        return None
    first = raw.split(b"\0", 1)[0].decode(errors="replace")
    if first.startswith("ray::"):
        name = first.split()[0]
        # ray::ServeReplica:bench:shard_0 -> ServeReplica:shard_0 (one group per deployment)
        parts = name[5:].split(":")
        return ":".join([parts[0], parts[-1]]) if len(parts) > 2 else name[5:]
    return Path(first).name


def _cpu_seconds(pid: str) -> float:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def snapshot() -> dict[str, tuple[str, float]]:
    """pid -> (group, CPU seconds so far) of every process this user can read."""
    out = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            group = _group(pid)
            if group is not None:
                out[pid] = (group, _cpu_seconds(pid))
    return out


def spent(before: dict[str, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per group since `before` (processes started meanwhile count from zero)."""
    by_group: dict[str, float] = {}
    for pid, (group, now) in snapshot().items():
        delta = now - before.get(pid, (group, 0.0))[1]
        if delta > 0:
            by_group[group] = by_group.get(group, 0.0) + delta
    return dict(sorted(by_group.items(), key=lambda kv: -kv[1]))
