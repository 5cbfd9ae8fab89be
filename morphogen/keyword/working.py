"""Where an owner keeps the current version's pages: a file mapped into memory, written in
place by `OwnerTable.apply`, for the directory's one writer (`OwnerTable.map_working_pages`),
so that the process holds the pages a block touches, not the table.

`working/pages.bin` holds the pages; `working/working.json` says which version they are,
whether whole, and in which boot of the machine. An apply marks it unclean before it writes
and clean after the version's pointer moved; a crash in between, or a failed apply, leaves it
unclean, and it is rebuilt from the versions (`VersionStore.materialize`). The pages an apply
writes reach the file through the kernel's page cache, which a killed process does not lose,
so no block waits for them to reach the disk; a machine that restarted may have lost them, so
a record of another boot is rebuilt too.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.keyword.versions import VersionStore

WORKING_DIR, WORKING_FILE, DATA = "working", "working.json", "pages.bin"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:  # no such file: every start rebuilds the working pages
        return secrets.token_hex(8)


_BOOT = _boot_id()


def _record(version: int, clean: bool) -> dict:
    return {"version": version, "clean": clean, "boot": _BOOT}


def mapped(root: Path, store: VersionStore, version: int) -> np.ndarray:
    """`version`'s pages, mapped from the working file; rebuilt first unless its record says
    it holds exactly them, whole, in this boot."""
    wdir = root / WORKING_DIR
    wdir.mkdir(exist_ok=True)
    data, n = wdir / DATA, store.num_pages(version)
    if not (_read(root) == _record(version, True)
            and data.is_file() and data.stat().st_size == n * PAGE_SIZE):
        mark(root, version, clean=False)
        store.materialize(version, data)
        mark(root, version, clean=True)
    # a plain array over the mapping: np.memmap's indexing costs more than the edits
    return np.memmap(data, np.uint8, "r+", shape=(n, PAGE_SIZE)).view(np.ndarray)


def _read(root: Path) -> dict | None:
    try:
        return json.loads((root / WORKING_DIR / WORKING_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None


def mark(root: Path, version: int, *, clean: bool) -> None:
    """Record which version the working file holds and whether whole. Replaced whole, not
    synced: the record matters only within the boot it names."""
    path = root / WORKING_DIR / WORKING_FILE
    tmp = path.with_name(f".{WORKING_FILE}.{secrets.token_hex(4)}")
    tmp.write_text(json.dumps(_record(version, clean)))
    os.replace(tmp, path)
