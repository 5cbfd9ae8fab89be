"""Shared helpers of the benchmark scripts: timing medians, percentiles, CSV and plot output."""

from __future__ import annotations

import csv
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def median_seconds(fn: Callable[[], object], runs: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`th percentile (0-100) of `values`, numpy's default (linear between the two
    nearest ranks): the one formula every benchmark's p50/p99 figures use. NaN when empty."""
    return float(np.percentile(values, q)) if len(values) else float("nan")


def drop_cache(path: Path) -> None:
    """The file's pages out of the page cache (synced first: only clean pages can be
    dropped; pages some process still maps stay)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def dir_bytes(path: Path) -> int:
    """The bytes of every file under `path` (what it takes on disk, holes aside)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def write_csv(path: Path, rows: Sequence[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")


def machine_label() -> str:
    import os

    return f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}"


def plot(path: Path, draw: Callable[[object], None]) -> None:
    """Draw with matplotlib where it is installed; a missing plot is not an error."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install 'morphogen[bench]')")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    draw(ax)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def build_updates(batch):
    """What a router hands `EpochLog.propose` for `batch`: the updates entry on top of the
    committed head (on an empty log, epoch 1 of a snapshot named "ck")."""
    from morphogen.protocol.identity import EpochIdentity
    from morphogen.publication.log import updates_entry

    def build(head, seq):
        base = head.epoch_identity() if head is not None else EpochIdentity.of_snapshot(1, "ck")
        epoch = base.epoch_id + 1
        return updates_entry(epoch, base.epoch_id, batch,
                             base.after_updates(epoch, batch.digest), seq), batch

    return build


def serve_two_parties(cluster, snapshot, work: Path, *, admin: bool = True) -> list[str]:
    """Parties a and b on a local cluster (`cluster.local.running`), one CPU shard each,
    serving `snapshot`; with `admin`, publications take the token in `work/token`, logs go
    under `work` and rotations read from `work/snaps`. Returns their URLs."""
    from ray import serve

    from cluster import local
    from deployments.app import build_app
    from morphogen.config import PartyConfig

    urls = []
    for name in ("a", "b"):
        extra = {"admin_token_file": str(work / "token"),
                 "epoch_log_dir": str(work / f"log-{name}"),
                 "admin_snapshot_dir": str(work / "snaps")} if admin else {}
        cfg = PartyConfig(snapshot=str(snapshot), cache_dir=str(work), num_shards=1,
                          engine="cpu", shard_num_cpus=0.25, router_num_cpus=0.1,
                          graceful_shutdown_timeout_s=1.0, **extra)
        serve.run(build_app(cfg), name=name, route_prefix=f"/{name}", blocking=False)
        urls.append(cluster.app_url(f"/{name}"))
    local.wait_routed(urls)
    return urls
