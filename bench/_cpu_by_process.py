"""Where a benchmark's CPU time went: seconds of CPU (user + system) per process group, read
before and after a measured window. Ray names its worker processes after what they run
(`ray::ServeReplica:app:Router`, `ray::ProxyActor`, ...), which is the grouping: on a machine
whose cores the server shares with the load, every CPU second spent outside the scan is a second
the scan did not get."""

from __future__ import annotations

from pathlib import Path

import psutil

# A process is known by its pid and start time: a pid the system reuses within the window is a
# new process, counted from zero, not a continuation of the one that ended.
Key = tuple[int, float]


def _group(cmdline: list[str] | None) -> str | None:
    if not cmdline:
        return None
    first = cmdline[0]
    if first.startswith("ray::"):
        name = first.split()[0]
        # ray::ServeReplica:bench:shard_0 -> ServeReplica:shard_0 (one group per deployment)
        parts = name[5:].split(":")
        return ":".join([parts[0], parts[-1]]) if len(parts) > 2 else name[5:]
    return Path(first).name


def snapshot() -> dict[Key, tuple[str, float]]:
    """(pid, start time) -> (group, CPU seconds so far) of every process this user can read."""
    out = {}
    for proc in psutil.process_iter(["cmdline", "cpu_times", "create_time"]):
        info = proc.info  # attributes it may not read (another user's process) are None
        group, times = _group(info["cmdline"]), info["cpu_times"]
        if group is not None and times is not None:
            out[(proc.pid, info["create_time"])] = (group, times.user + times.system)
    return out


def spent(before: dict[Key, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per group since `before` (processes started meanwhile count from zero)."""
    by_group: dict[str, float] = {}
    for key, (group, now) in snapshot().items():
        delta = now - before.get(key, (group, 0.0))[1]
        if delta > 0:
            by_group[group] = by_group.get(group, 0.0) + delta
    return dict(sorted(by_group.items(), key=lambda kv: -kv[1]))
