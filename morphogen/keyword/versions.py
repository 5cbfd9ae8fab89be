"""The owner's versions on disk: a full copy every few versions, the changed pages between.

Layout of a version directory (``v000007/``):

- a *full* version holds ``snapshot/`` (the table as the parties serve it) and ``keys/``
  (tag -> key, which eviction needs and which never leaves the owner: a `KeyIndex`, read and
  copied as files; directories written before it hold ``keys.msgpack`` instead, still read);
- a *diff* version holds only what changed from the version before: ``batch.bin`` (the
  batch the parties are sent: each re-signed page as its XOR with the page before, stored as
  the bytes that changed, `morphogen.protocol.sparse`) and ``keys-diff.msgpack`` (keys added
  and removed). Directories written before hold ``batch.msgpack`` (whole pages), still read.

Every version after the first holds a batch, full or not, since publishing sends it. Reading
version *v* opens the last full version at or before it and applies the batches after it in
order (a diff XORed in, a whole page written over), so the result is byte for byte the full
copy *v* would have been. A full copy once the batches since the last one add up to the
table's bytes (`morphogen.keyword.owner.FULL_EVERY`) bounds that work by one table's worth of
batches, and costs no more than the batches it stands for; it is added to a diff version after
the fact (`checkpoint`), off the path of the next versions.

A version is written to a temporary directory and renamed into place before the owner's
pointer moves to it, so a crash leaves no half version under a version's name. Pruning renames
a version away before deleting it, for the same reason.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path

import msgpack
import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.keyword.descriptor import parts_of, tables_of
from morphogen.keyword.key_columns import KeyColumns
from morphogen.keyword.key_index import KeyIndex, slots_for
from morphogen.keyword.layout import TAG_SIZE
from morphogen.protocol.changes import ChangeBatch
from morphogen.snapshot.manifest import DATA_FILE
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.writer import write_snapshot
from morphogen.storage.durable import fsync_dir

Batch = list[tuple[int, str, bytes]]

SNAPSHOT = "snapshot"
KEYS = "keys.msgpack"  # the keys of a full version written before `KEYS_DIR`
KEYS_DIR = "keys"
KEYS_DIFF = "keys-diff.msgpack"
BATCH = "batch.bin"
OLD_BATCH = "batch.msgpack"  # whole pages, [[page, kind, bytes], ..]


class VersionGone(LookupError):
    """A version that retention removed (or that never existed)."""


def vdir(root: Path, version: int) -> Path:
    return root / f"v{version:06d}"


def _pack(path: Path, obj: object) -> None:
    with path.open("wb") as f:
        msgpack.pack(obj, f, use_bin_type=True)
        f.flush()
        os.fsync(f.fileno())


def _unpack(path: Path) -> object:
    return msgpack.unpackb(path.read_bytes(), raw=False)


def _write_batch(path: Path, batch: ChangeBatch) -> None:
    _pack(path, {"pages": batch.pages.astype("<i8").tobytes(),
                 "data": batch.replace.astype(np.uint8).tobytes(),
                 "bytes": batch.packed})


def _apply_batch(pages: np.ndarray, batch: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """A batch (`VersionStore.batch_arrays`) applied to `pages` (an array or a mapped file)."""
    where, whole, rows = batch
    if len(np.unique(where)) == len(where):
        pages[where[whole]] = rows[whole]
        diffs = where[~whole]
        pages[diffs] ^= rows[~whole]
        return
    for page, data, row in zip(where.tolist(), whole.tolist(), rows, strict=True):
        if data:  # a page changed twice in one batch: in order
            pages[page] = row
        else:
            pages[page] ^= row


class VersionStore:
    """The version directories under an owner directory `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def is_full(self, version: int) -> bool:
        return (vdir(self.root, version) / SNAPSHOT / "manifest.json").is_file()

    def exists(self, version: int) -> bool:
        return vdir(self.root, version).is_dir()

    def write(self, version: int, pages: np.ndarray, *, full: bool,
              keys: Mapping[bytes, bytes], key_puts: dict[bytes, bytes], key_dels: set[bytes],
              batch: ChangeBatch | None, keys_folder: Path | None = None,
              adopt: bool = False) -> Path:
        """Write `version` (full: the pages and every key; else the batch and the key
        changes) and rename it into place; returns its directory. A `KeyIndex` as `keys` is
        copied as files (synced first); any other mapping is indexed afresh. `keys_folder`
        (full only): the version's key index, already built and synced on this file system
        (`KeyIndex.build`), moved in instead; `keys` is then not read. `adopt` (full only):
        `pages` map a file of their own that becomes the snapshot's (`write_snapshot`)."""
        final = vdir(self.root, version)
        tmp = self.root / f".{final.name}.tmp-{secrets.token_hex(4)}"
        tmp.mkdir()
        if full:
            write_snapshot(tmp / SNAPSHOT, pages, epoch_id=version,
                           source="morphogen keyword table", tables=tables_of(pages),
                           adopt=adopt)
            if keys_folder is None:
                _write_keys(tmp / KEYS_DIR, pages, keys)
            else:
                _move_index(keys_folder, tmp / KEYS_DIR)
                fsync_dir(tmp)
        else:
            _pack(tmp / KEYS_DIFF, {"put": [[t, k] for t, k in key_puts.items()],
                                    "del": sorted(key_dels)})
        if batch is not None:
            _write_batch(tmp / BATCH, batch)
        if final.exists():  # left by a crash after the rename, before the pointer moved
            self._remove(final)
        os.replace(tmp, final)
        fsync_dir(self.root)
        return final

    def batch(self, version: int) -> Batch:
        """`version`'s changes as (page, "diff" | "data", 4096 bytes)."""
        return self.changes(version).triples()

    def changes(self, version: int) -> ChangeBatch:
        """`version`'s changes as one batch, which keeps the changed bytes it was read as
        (what a publication sends)."""
        folder = vdir(self.root, version)
        if (folder / BATCH).is_file():
            doc = _unpack(folder / BATCH)
            where = np.frombuffer(doc["pages"], "<i8").astype(np.int64)  # type: ignore[index]
            whole = np.frombuffer(doc["data"], np.uint8).astype(bool)  # type: ignore[index]
            return ChangeBatch.from_packed(where, whole, doc["bytes"])  # type: ignore[index]
        if (folder / OLD_BATCH).is_file():
            return ChangeBatch.from_triples(_unpack(folder / OLD_BATCH))  # type: ignore[arg-type]
        raise VersionGone(f"version {version} is no longer kept ({folder / BATCH} is gone)")

    def batch_arrays(self, version: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`version`'s changes as arrays: pages, whether each is a whole page (else an XOR
        diff), and the (n, 4096) bytes."""
        batch = self.changes(version)
        return (batch.pages, batch.replace,
                np.frombuffer(batch.data, np.uint8).reshape(-1, PAGE_SIZE))

    def batch_bytes(self, version: int) -> int:
        """What `version`'s batch takes on disk."""
        folder = vdir(self.root, version)
        return sum(p.stat().st_size for p in (folder / BATCH, folder / OLD_BATCH)
                   if p.is_file())

    def bytes_since_full(self, version: int) -> int:
        """What the batches of the versions after the last full one, up to `version`, take
        on disk."""
        return sum(self.batch_bytes(v) for v in range(self._base(version) + 1, version + 1))

    def _base(self, version: int) -> int:
        """The last full version at or before `version`, every version between it and
        `version` present."""
        v = version
        while v >= 1:
            if not self.exists(v):
                break
            if self.is_full(v):
                return v
            v -= 1
        raise VersionGone(f"version {version} is no longer kept: retention removed the full "
                          f"copy it is read from (version {v} is gone)")

    def num_pages(self, version: int) -> int:
        """The page count of `version` (a matrix that changed size is a full version)."""
        with Snapshot.open(vdir(self.root, self._base(version)) / SNAPSHOT) as snap:
            return int(snap.num_pages)

    def pages(self, version: int) -> np.ndarray:
        """The pages of `version`, exactly the bytes its full copy holds (or would hold)."""
        base = self._base(version)
        with Snapshot.open(vdir(self.root, base) / SNAPSHOT) as snap:
            pages = np.array(snap.read_verified(), dtype=np.uint8)
        for v in range(base + 1, version + 1):
            _apply_batch(pages, self.batch_arrays(v))
        return pages

    def keys(self, version: int) -> dict[bytes, bytes]:
        """tag -> key of `version`, in memory (for a table's records, or a test: a follower
        keeps its keys in files, `key_index`)."""
        base = self._base(version)
        folder = vdir(self.root, base) / KEYS_DIR
        if folder.is_dir():
            with KeyIndex(folder, writable=False) as index:
                keys = dict(index.items())
        else:
            keys = _legacy_keys(vdir(self.root, base) / KEYS)
        for v in range(base + 1, version + 1):
            dels, puts = self._key_diff(v)
            for tag in dels:
                keys.pop(tag, None)
            keys.update(puts)
        return keys

    def key_index(self, version: int, folder: Path) -> KeyIndex:
        """tag -> key of `version` as a new index at `folder` (open, writable, its record
        written but not yet durable): the last full version's copied as files, the key
        changes between laid over it in order. Its work is one copy of the index and the
        changes, never the keys in memory."""
        base = self._base(version)
        src = vdir(self.root, base) / KEYS_DIR
        if src.is_dir():
            KeyIndex.copy(src, folder)
            index = KeyIndex(folder)
        else:
            legacy = _legacy_keys(vdir(self.root, base) / KEYS)
            # room to grow as a table built at its usual load does (doubled if ever short)
            index = KeyIndex.build(folder, legacy.items(), slots_for(2 * len(legacy)))
            del legacy
        try:
            for v in range(base + 1, version + 1):
                dels, puts = self._key_diff(v)
                for tag in dels:
                    index.pop(tag, None)
                for tag, key in puts:
                    index[tag] = key
            index.sync()  # its record names what it holds from here on
        except BaseException:
            index.close()
            raise
        return index

    def _key_diff(self, version: int) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
        diff = _unpack(vdir(self.root, version) / KEYS_DIFF)
        return ([bytes(t) for t in diff["del"]],  # type: ignore[index]
                [(bytes(t), bytes(k)) for t, k in diff["put"]])  # type: ignore[index]

    def snapshot_of(self, version: int) -> Path | None:
        """The snapshot directory of a full version, None for a diff."""
        return vdir(self.root, version) / SNAPSHOT if self.is_full(version) else None

    def materialize(self, version: int, path: Path) -> None:
        """The pages of `version` as a raw page file at `path` (replaced): the last full copy
        before it, the batches between written over it in order, one batch in memory at a
        time. Durable when it returns."""
        base = self._base(version)
        shutil.copyfile(vdir(self.root, base) / SNAPSHOT / DATA_FILE, path)
        if version > base:
            mapped = np.memmap(path, np.uint8, "r+").reshape(-1, PAGE_SIZE)
            for v in range(base + 1, version + 1):
                _apply_batch(mapped, self.batch_arrays(v))
            mapped.flush()
            del mapped
        with path.open("r+b") as f:
            os.fsync(f.fileno())

    def checkpoint(self, version: int) -> bool:
        """Make `version` a full version after it was written as a diff: its snapshot and keys
        added to its directory, built from the last full copy before it and the batches
        between, one batch in memory at a time (the pages go through a file, never the
        process's memory). False when there is nothing to do (already full, or pruned).

        Off the hot path: a follower runs it in a thread while it applies the next blocks
        (`OwnerTable`). The version's directory gets the keys first and the snapshot last,
        its manifest last of all (`write_snapshot`): a crash leaves it a diff version, which
        reads as before. A crash's leftovers (`.ckpt-*`) are removed by the next checkpoint."""
        for stale in self.root.glob(".ckpt-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if not self.exists(version) or self.is_full(version):
            return False
        final = vdir(self.root, version)
        tmp = self.root / f".ckpt-{final.name}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            raw = tmp / "pages.raw"
            self.materialize(version, raw)
            pages = np.memmap(raw, np.uint8, "r").reshape(-1, PAGE_SIZE)
            write_snapshot(tmp / SNAPSHOT, pages, epoch_id=version,
                           source="morphogen keyword table", tables=tables_of(pages))
            del pages
            raw.unlink()
            with self.key_index(version, tmp / KEYS_DIR) as index:
                index.sync(durable=True)
            # a crash between these two renames left the keys of a version still a diff
            # (no manifest): they are replaced, as a directory is not renamed over another
            shutil.rmtree(final / KEYS_DIR, ignore_errors=True)
            os.replace(tmp / KEYS_DIR, final / KEYS_DIR)
            os.replace(tmp / SNAPSHOT, final / SNAPSHOT)
            fsync_dir(final)
            return True
        except (FileNotFoundError, VersionGone):
            if self.exists(version):
                raise
            return False  # pruned meanwhile: nothing to read it from any more
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def prune(self, oldest_kept: int) -> list[int]:
        """Remove the versions that reading `oldest_kept` and every later one does not need:
        those before the last full version at or before it. Version 1 stays: it is the
        snapshot the parties were started with, which a restarted replica replays from."""
        base = self._base(oldest_kept)
        gone = []
        for entry in sorted(self.root.iterdir()):
            name = entry.name
            if name.startswith(".v") and ".tmp-" in name or name.startswith(".gone-"):
                self._remove(entry)  # a crash's leftovers: never named as a version
                continue
            if not (name.startswith("v") and name[1:].isdigit()):
                continue
            v = int(name[1:])
            if 1 < v < base:
                self._remove(entry)
                gone.append(v)
        return gone

    def _remove(self, path: Path) -> None:
        # renamed first: a crash mid-delete must not leave a half version under its name
        if not path.name.startswith((".gone-", ".v")):
            away = self.root / f".gone-{path.name}-{secrets.token_hex(4)}"
            os.replace(path, away)
            fsync_dir(self.root)
            path = away
        shutil.rmtree(path, ignore_errors=True)


def _capacity(pages: np.ndarray) -> int:
    return sum(p.descriptor.geometry.capacity for p in parts_of(pages))


def _move_index(src: Path, dst: Path) -> None:
    """A synced key index folder moved to `dst`: renamed, or copied and synced where the two
    are on different file systems."""
    try:
        os.replace(src, dst)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        KeyIndex.copy(src, dst)
        with KeyIndex(dst) as copy:
            copy.sync(durable=True)
        shutil.rmtree(src)


def _write_keys(folder: Path, pages: np.ndarray, keys: Mapping[bytes, bytes]) -> None:
    if isinstance(keys, KeyIndex):
        keys.sync()
        KeyIndex.copy(keys.folder, folder)
        with KeyIndex(folder) as copy:
            copy.sync(durable=True)
        return
    with KeyIndex.build(folder, keys if isinstance(keys, KeyColumns) else keys.items(),
                        slots_for(max(_capacity(pages), len(keys)))) as index:
        index.sync(durable=True)


def _legacy_keys(path: Path) -> dict[bytes, bytes]:
    raw = _unpack(path)
    tags = raw["tags"]  # type: ignore[index]
    return {tags[i * TAG_SIZE:(i + 1) * TAG_SIZE]: k
            for i, k in enumerate(raw["keys"])}  # type: ignore[index]
