"""One way to open a snapshot, wherever it lives: a local path or an object-store URI."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from morphogen.snapshot.reader import Snapshot
from morphogen.storage.location import is_remote, local_path


def default_cache_dir() -> Path:
    base = os.environ.get("MORPHOGEN_CACHE_DIR") or Path.home() / ".cache" / "morphogen"
    return Path(base) / "snapshots"


def open_any(uri: str | os.PathLike[str], *, verify: bool = False,
             cache_dir: str | os.PathLike[str] | None = None) -> Any:
    """A `Snapshot` for a path or ``file://`` URI, a `RemoteSnapshot` for ``s3://``,
    ``gs://`` or ``https://`` (its chunks cached under `cache_dir`)."""
    if is_remote(uri):
        from morphogen.snapshot.remote import RemoteSnapshot

        return RemoteSnapshot.open(str(uri), str(cache_dir or default_cache_dir()), verify=verify)
    return Snapshot.open(local_path(uri).expanduser(), verify=verify)
