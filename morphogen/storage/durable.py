"""Files that survive a crash at any instant: a file is there whole or not at all.

Write to a temporary name beside the target, fsync, rename over the target, fsync the
directory. A process killed before the rename leaves only the temporary (callers clean their
own up); one killed after it leaves the new file, durable once the directory is synced.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable
from pathlib import Path


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or a creation in `path` durable. A failure raises: what is written next
    (an acknowledgement, a pointer to the new file) must not outrun it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str],
                 data: bytes | bytearray | memoryview | Iterable[bytes], *,
                 tmp: Path | None = None) -> None:
    """Replace `path` with `data` (bytes, or parts written in order), all or nothing. `tmp`
    names the temporary (in the same directory) where a caller sweeps its own leftovers."""
    path = Path(path)
    tmp = tmp or path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    parts = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
