"""What the command line prints besides results: progress lines on stderr, the demo's table."""

from __future__ import annotations

import statistics
import sys
from typing import Any


def eprint(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def latency_row(name: str, pages: int, latencies: list[float], queries: int,
                wall_s: float) -> list[str]:
    """One table row: path, pages, requests, p50 and p99 latency (ms), queries/s."""
    ms = sorted(x * 1000 for x in latencies)
    p50 = statistics.median(ms)
    p99 = ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))]
    return [name, str(pages), str(len(latencies)), f"{p50:.1f}", f"{p99:.1f}",
            f"{queries / wall_s:.1f}"]


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """Columns padded to their widest cell: the first left-aligned, the others right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    print(line(header))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))
