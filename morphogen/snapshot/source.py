"""Where a party's snapshot comes from: a configured path, or a synthetic one built once.

A synthetic snapshot is built in the cache directory under a file lock, written by
`morphogen.snapshot.writer` to temporary names and renamed into place, so that the app builder
and every shard replica (possibly on several nodes of one machine) can all call
`ensure_synthetic` and exactly one of them builds while the others wait and then map the same
file.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from morphogen.config import PartyConfig
from morphogen.snapshot.manifest import MANIFEST_FILE
from morphogen.snapshot.open import open_any
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic
from morphogen.storage.location import is_remote, local_path


def synthetic_dir(cfg: PartyConfig) -> Path:
    name = f"synthetic-p{cfg.synthetic_pages}-s{cfg.synthetic_seed}-e{cfg.synthetic_epoch}"
    return cfg.cache_path() / name


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def ensure_synthetic(cfg: PartyConfig, *, progress: bool = False) -> Path:
    """Build the configured synthetic snapshot if it is not in the cache yet; return its dir."""
    out = synthetic_dir(cfg)
    if (out / MANIFEST_FILE).is_file():
        return out
    with _locked(out.parent / f".{out.name}.lock"):
        if not (out / MANIFEST_FILE).is_file():  # another process may have built it meanwhile
            build_synthetic(
                out,
                cfg.synthetic_pages,
                seed=cfg.synthetic_seed,
                epoch_id=cfg.synthetic_epoch,
                progress=progress,
            )
    return out


def snapshot_path(cfg: PartyConfig, *, progress: bool = False) -> Path:
    """The configured snapshot path, or the synthetic one (built on first use)."""
    if cfg.snapshot is not None:
        return local_path(cfg.snapshot).expanduser()
    return ensure_synthetic(cfg, progress=progress)


def open_snapshot(cfg: PartyConfig, *, verify: bool = False, progress: bool = False) -> Snapshot:
    """The configured snapshot: a local one (or the synthetic one), or a remote one
    (`morphogen.snapshot.remote`) of which nothing but the manifest is read yet."""
    if cfg.snapshot is not None and is_remote(cfg.snapshot):
        return open_any(cfg.snapshot, verify=verify, cache_dir=cfg.snapshot_cache_path())
    return Snapshot.open(snapshot_path(cfg, progress=progress), verify=verify)
