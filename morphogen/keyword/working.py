"""Where an owner keeps the current version's pages and keys: files mapped into memory,
written in place by `OwnerTable.apply`, for the directory's one writer
(`OwnerTable.map_working_pages`), so that the process holds what a block touches, not the
table.

`working/pages.bin` holds the pages, `working/keys/` the tag -> key index (`KeyIndex`);
`working/working.json` says which version they are, whether whole, and in which boot of the
machine. An apply marks it unclean before it writes
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
import shutil
from pathlib import Path

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.keyword.key_index import META, KeyIndex
from morphogen.keyword.versions import VersionStore

WORKING_DIR, WORKING_FILE, DATA, KEYS = "working", "working.json", "pages.bin", "keys"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:  # no such file: every start rebuilds the working pages
        return secrets.token_hex(8)


_BOOT = _boot_id()


def _record(version: int, clean: bool) -> dict:
    return {"version": version, "clean": clean, "boot": _BOOT}


def load(root: Path, store: VersionStore, version: int) -> tuple[np.ndarray, KeyIndex]:
    """`version`'s pages, mapped from the working file, and its keys, from the working index;
    both rebuilt first unless the record says they hold exactly them, whole, in this boot."""
    wdir = root / WORKING_DIR
    wdir.mkdir(exist_ok=True)
    data, keys, n = wdir / DATA, wdir / KEYS, store.num_pages(version)
    if not (_read(root) == _record(version, True)
            and data.is_file() and data.stat().st_size == n * PAGE_SIZE
            and (keys / META).is_file()):
        mark(root, version, clean=False)
        store.materialize(version, data)
        shutil.rmtree(keys, ignore_errors=True)
        with store.key_index(version, keys) as index:
            # on disk before the first block, as the pages are (`materialize`): the copy's
            # blocks are new to the file system, and left to the kernel's write-back they
            # meet the first blocks' own syncs, which then wait for them (at 16 M records,
            # five of sixteen blocks took 0.18 to 0.24 s to apply against 0.11 to 0.13 s,
            # none once synced: bench/chain_scale.py, docs/chain.md)
            index.sync(durable=True)
        mark(root, version, clean=True)
    # a plain array over the mapping: np.memmap's indexing costs more than the edits
    pages = np.memmap(data, np.uint8, "r+", shape=(n, PAGE_SIZE)).view(np.ndarray)
    return pages, KeyIndex(keys)


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
