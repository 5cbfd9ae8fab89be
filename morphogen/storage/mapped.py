"""A new file written in place through a shared mapping, its blocks reserved before the first
byte is written.

A build that writes gigabytes into a file (the key index's slots and heap) writes them through
a mapping of the file, not into memory first and then out: a second pass over every byte
saved. But a mapping cannot report a full disk: the kernel sends SIGBUS at the first page it
cannot back, and the process dies without a word of why. So the file's whole size is
allocated first (`posix_fallocate`), where a disk without the room is an `OSError` naming the
file, before any byte is written; the blocks read as zeros until written.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def new_mapped(path: str | os.PathLike[str], dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The file `path` (made, or emptied) of `shape` zeros of `dtype`, mapped writable. A
    disk without room for it raises `OSError` and leaves no file."""
    path = Path(path)
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    with path.open("wb") as f:
        try:
            reserve(f.fileno(), size, path)
        except OSError:
            path.unlink(missing_ok=True)
            raise
    if not size:  # a mapping cannot be empty
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype, "r+", shape=shape)


def reserve(fd: int, size: int, name: os.PathLike[str] | str) -> None:
    """The open file `fd` (`name`) made `size` bytes long, every block of it allocated: an
    `OSError` naming it where the disk has not the room."""
    try:
        if size and hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
        else:
            os.ftruncate(fd, size)
    except OSError as exc:
        raise OSError(exc.errno, f"{name}: no room for {size:,} bytes ({exc.strerror})") from None
