"""The data owner's copy of a keyword table, and the updates made to it.

The owner directory holds its versions (`morphogen.keyword.versions`: a full copy once the
changed pages since the last one add up to the table, the changed pages between) and a
pointer to the current one::

    owner.json        {"current": 3, "published": 2, ...}   replaced atomically
    v000001/snapshot  the table as the parties serve it (manifest.json + pages.bin)
    v000001/keys/     tag -> key in files (eviction needs the keys; they never leave the owner)
    v000002/batch.bin  the page updates that turn version 1 into version 2 (+ key changes)

An update never touches a version in place: it builds the next version in a temporary
directory, renames it into place, and only then moves the pointer, so a crash at any step
leaves the owner at the old version or the new, never between. Publishing
(`morphogen.keyword.publishing`) sends every version after `published` to both parties in
order, each under one publication id. A lock file keeps two owner processes apart.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from pathlib import Path
from types import MappingProxyType

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from filelock import FileLock, Timeout

from morphogen.keyword import prefetch, working
from morphogen.keyword.build import (
    DEFAULT_LOAD,
    KeywordTable,
    build_table,
)
from morphogen.keyword.descriptor import Anchor, Descriptor, Part, parts_of
from morphogen.keyword.editor import Befores, Change, Editor
from morphogen.keyword.key_index import KeyIndex
from morphogen.keyword.pages import records_in
from morphogen.keyword.records import RecordError
from morphogen.keyword.signing import public_bytes
from morphogen.keyword.tree import paths, rehash, root_of
from morphogen.keyword.versions import VersionStore
from morphogen.protocol import sparse
from morphogen.protocol.changes import ChangeBatch
from morphogen.storage.durable import write_atomic

log = logging.getLogger(__name__)

OWNER_FILE = "owner.json"
WRITER_LOCK = "writer.lock"
OWNER_FORMAT = "morphogen-keyword-owner/1"
# A full copy once the versions' batches since the last one take as many bytes as the table:
# a copy then costs no more than the block stream it stands for, whatever the table's size,
# and the versions on disk stay under two tables' worth. FULL_EVERY > 0 (an owner's choice)
# also makes every FULL_EVERY-th version full.
FULL_EVERY = 0
DIFF_BYTES = "diff_bytes"  # owner.json: bytes of the batches since the last full copy
KEEP = 4  # published versions kept readable, besides every unpublished one
RESIZED = "resized"  # owner.json: versions whose matrix has another page count than the last


class WriterBusy(RuntimeError):
    """Another writer (a chain follower, an owner command) holds the owner directory."""


def writer_lock(root: str | os.PathLike[str]) -> FileLock:
    """The owner directory's writer lock, taken without waiting (WriterBusy when held): one
    follower or owner command changes and publishes a directory at a time. Held for a whole
    run, unlike the short lock each step takes, so that a follower's blocks and an operator's
    changes never interleave."""
    lock = FileLock(str(Path(root) / WRITER_LOCK), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise WriterBusy(f"{root} is held by another writer (a `morphogen chain follow`, or a "
                         "`morphogen records apply/publish`): one writer per owner directory; "
                         "stop the other first") from None
    return lock


def _write_json_atomic(path: Path, obj: dict) -> None:
    write_atomic(path, json.dumps(obj, indent=1).encode())


def create_owner_dir(table: KeywordTable, root: str | os.PathLike[str], *,
                     full_every: int = FULL_EVERY, keep: int = KEEP,
                     keys_folder: str | os.PathLike[str] | None = None,
                     adopt_pages: bool = False) -> Path:
    """Write a freshly built table as version 1 of a new owner directory; returns the
    snapshot directory the parties serve. A version is a full copy once the versions since
    the last one changed as many pages as the table holds (and every `full_every`-th with
    `full_every` > 0); the others hold the changed pages. `keep` published versions stay
    readable besides the unpublished ones. `keys_folder`: the table's key index, built
    apart (`KeyIndex.build` of its keys, synced) on this file system: moved in, and
    `table.keys` not read. `adopt_pages`: the table's pages map a file of their own
    (`bulk.assemble(pages_at=...)`) on this file system, which becomes the snapshot's pages
    instead of being copied (`write_snapshot(adopt=True)`)."""
    if full_every < 0 or keep < 1:
        raise ValueError("full_every is at least 0 and keep at least 1")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if (root / OWNER_FILE).exists():
        raise FileExistsError(f"{root} already holds a keyword table ({OWNER_FILE}); build into "
                              "a new directory")
    with FileLock(str(root / ".lock")):
        final = VersionStore(root).write(
            1, table.pages, full=True, keys=table.keys, key_puts={}, key_dels=set(),
            batch=None, keys_folder=None if keys_folder is None else Path(keys_folder),
            adopt=adopt_pages)
        _write_json_atomic(root / OWNER_FILE, {
            "format": OWNER_FORMAT, "dataset": table.descriptor.dataset.hex(),
            "public_key": table.descriptor.public_key.hex(), "current": 1, "published": 1,
            "full_every": full_every, "keep": keep})
    return final / "snapshot"


class OwnerTable:
    """The current version of an owner directory, to change and to publish."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        path = self.root / OWNER_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{self.root}: not a keyword owner directory (no "
                                    f"{OWNER_FILE}; `morphogen build --records` makes one)")
        self.state = json.loads(path.read_text())
        if self.state.get("format") != OWNER_FORMAT:
            raise ValueError(f"{path}: not a {OWNER_FORMAT} file")
        self.store = VersionStore(self.root)
        self._lock = FileLock(str(self.root / ".lock"))
        # full copies made after the fact: inline by default (a command's process ends with
        # it); in a thread of their own for a follower (`checkpoints_in_background`)
        self._background = False
        self._mapped = False  # the current pages in memory, or mapped (`map_working_pages`)
        self._checkpointer: threading.Thread | None = None
        self._cache: tuple[int, np.ndarray, MutableMapping[bytes, bytes]] | None = None
        self._befores = Befores()  # the pages a block rewrites, as they were: reused
        self._prefetcher: tuple[threading.Thread, threading.Event] | None = None
        self._prefetch_lock = threading.Lock()

    def checkpoints_in_background(self) -> None:
        """Write full copies in a thread of their own, off the path of `apply` (a follower's:
        a full copy of a mainnet table takes minutes, a block 12 s); `wait_checkpoints`
        before the process ends."""
        self._background = True

    def map_working_pages(self) -> None:
        """Keep the current version's pages in a file mapped into memory (`working/`), written
        in place by `apply`, instead of a copy in the process: what the process holds is then
        the pages a block touches, not the table. For the directory's one writer (a follower
        holds the writer lock): another process reading the directory must not map a file
        the writer is changing, and reads the versions as before."""
        self._mapped = True
        self._drop_cache()

    def prefetch(self, by_table: Mapping[str, Iterable[bytes]]) -> None:
        """Start faulting in, writable, the mapped pages that a block changing these keys
        (table name -> keys) will write, and the key index's slots it reads
        (`morphogen.keyword.prefetch`), in a thread, while the caller waits on something
        else: a follower, on the node for the block's values.
        The next apply, or anything that drops the pages, stops it and waits for it to end
        first. Nothing where the pages are not mapped (`map_working_pages`)."""
        if not self._mapped:
            return
        self._settle()
        pages, index = self._working()
        parts = parts_of(pages)
        wanted = {name: list(keys_) for name, keys_ in by_table.items()}
        stop = threading.Event()

        def run() -> None:
            try:
                writes = prefetch.block(pages, parts, wanted,
                                        index if isinstance(index, KeyIndex) else None, stop)
                if writes and not stop.is_set():
                    # the rows the apply keeps its pages' old bytes in (the apply that stops
                    # this thread waits for it before it uses them); an eviction chain's
                    # pages are not planned, hence the margin
                    self._befores.reserve(writes + writes // 8)
            except Exception:  # noqa: BLE001 - only the apply's speed depends on it
                log.debug("prefetch of a block's pages failed", exc_info=True)

        thread = threading.Thread(target=run, name="prefetch", daemon=True)
        with self._prefetch_lock:
            self._prefetcher = (thread, stop)
        thread.start()

    def _settle(self) -> None:
        """Stop a prefetch still running where it is (its faults not taken yet, the apply
        takes itself) and wait for it: it reads the pages. From any thread (a publication's
        may drop the pages), each prefetch stopped by one of them."""
        with self._prefetch_lock:
            running, self._prefetcher = self._prefetcher, None
        if running is not None:
            thread, stop = running
            stop.set()
            if thread.ident is not None:
                thread.join()

    def wait_checkpoints(self) -> None:
        """Wait for a full copy being written (an unfinished one is abandoned by an exit,
        and the diffs it stood for read as before)."""
        if self._checkpointer is not None:
            self._checkpointer.join()

    def _checkpoint_free(self) -> bool:
        return self._checkpointer is None or not self._checkpointer.is_alive()

    def _checkpoint(self, version: int) -> None:
        def run() -> None:
            try:
                self.store.checkpoint(version)
            except Exception:  # noqa: BLE001 - the diffs still read; the next apply retries
                log.exception("full copy of version %d not written", version)

        if not self._background:
            if self.store.checkpoint(version):
                self.state[DIFF_BYTES] = self.store.bytes_since_full(self.current)
                self.save()
            return
        self._checkpointer = threading.Thread(target=run, name=f"checkpoint-v{version}",
                                              daemon=True)
        self._checkpointer.start()

    @property
    def current(self) -> int:
        return int(self.state["current"])

    @property
    def published(self) -> int:
        return int(self.state["published"])

    @property
    def dataset(self) -> str:
        return str(self.state["dataset"])

    def locked(self) -> FileLock:
        """The owner directory's lock: one process changes or publishes at a time."""
        return self._lock

    def reload(self) -> None:
        self.state = json.loads((self.root / OWNER_FILE).read_text())

    def save(self) -> None:
        _write_json_atomic(self.root / OWNER_FILE, self.state)

    def snapshot_dir(self, version: int | None = None) -> Path | None:
        """The owner's own full copy of a version (None when it is kept as a diff)."""
        return self.store.snapshot_of(version or self.current)

    def pages(self, version: int | None = None) -> np.ndarray:
        """The pages of a retained version, the bytes its full copy holds (a copy of them:
        the caller may change it)."""
        if version is None or version == self.current:
            return self._working()[0].copy()
        return self.store.pages(version)

    def num_pages(self, version: int | None = None) -> int:
        """The page count of a retained version's matrix, without reading its pages."""
        return self.store.num_pages(version or self.current)

    def keys(self, version: int | None = None) -> dict[bytes, bytes]:
        if version is None or version == self.current:
            return dict(self._working()[1])
        return self.store.keys(version)

    def holds(self) -> Mapping[bytes, bytes]:
        """The current version's tag -> key index, read-only and not copied: whether a table
        holds a key is `tag_of(its dataset, key) in owner.holds()`."""
        return MappingProxyType(self._working()[1])

    def _working(self) -> tuple[np.ndarray, MutableMapping[bytes, bytes]]:
        """The current version's pages and keys, kept in memory between calls (a follower
        changes the table every block: reading it from disk each time would cost more than
        the block). Changed in place by `apply`, which drops them when it fails midway."""
        if self._cache is None or self._cache[0] != self.current:
            self._drop_cache()
            v = self.current
            if self._mapped:
                self._cache = (v, *working.load(self.root, self.store, v))
            else:
                self._cache = (v, self.store.pages(v), self.store.keys(v))
        return self._cache[1], self._cache[2]

    def _drop_cache(self) -> None:
        self._settle()
        if self._cache is not None and isinstance(self._cache[2], KeyIndex):
            self._cache[2].close()
        self._cache = None

    def parts(self, version: int | None = None) -> list[Part]:
        """The keyword tables of a version's matrix (one, or several joined)."""
        if version is None or version == self.current:
            return parts_of(self._working()[0])  # read only: no copy of the matrix
        return parts_of(self.store.pages(version))

    def descriptor(self, table: str = "") -> Descriptor:
        """The current version's descriptor of keyword table `table` ("": the only one)."""
        return _part(parts_of(self._working()[0]), table, "descriptor").descriptor

    def apply(self, changes: Iterable[Change], signing_key: Ed25519PrivateKey,
              rng: Callable[[int], int] | None = None, *, changes_id: str | None = None,
              anchor: Anchor | None = None, note: dict | None = None,
              ) -> tuple[int, ChangeBatch]:
        """Apply `changes` in order to a copy of the current version and make it the next
        version. Returns (new version, its page-update batch). Nothing is written when any
        change fails (a full table, an absent key to delete, a wrong value size).

        `changes_id` names the changes (a digest of their file): when the current version was
        made from the same id, nothing is applied and (current, []) is returned, so re-running
        the same command after it succeeded (or after a crash past the pointer's move) never
        applies the changes twice. `anchor` names the chain block the new version reflects;
        `note` (JSON) goes into the owner's state in the same write that moves the pointer (a
        follower's record of the blocks it applied)."""
        rng = rng or secrets.randbelow
        with self._lock:
            self._settle()
            self.reload()
            if changes_id is not None and self.state.get("last_changes") == changes_id:
                return self.current, ChangeBatch.from_triples([])
            pages, keys = self._working()  # changed in place: dropped below if this fails
            if self._mapped:  # changed in place on disk too: rebuilt if this does not finish
                working.mark(self.root, self.current, clean=False)
            try:
                version, batch = self._apply(pages, keys, changes, signing_key, rng, changes_id,
                                             anchor, note)
            except BaseException:
                self._drop_cache()
                raise
            if self._mapped and not batch:  # nothing was written: the file is as it was
                _sync(keys)
                working.mark(self.root, version, clean=True)
            return version, batch

    def _apply(self, pages: np.ndarray, keys: MutableMapping[bytes, bytes],
               changes: Iterable[Change],
               signing_key: Ed25519PrivateKey, rng: Callable[[int], int],
               changes_id: str | None, anchor: Anchor | None, note: dict | None,
               ) -> tuple[int, ChangeBatch]:
        parts = parts_of(pages)
        if any(public_bytes(signing_key.public_key()) != p.descriptor.public_key
               for p in parts):
            raise ValueError("this signing key is not the table's owner key")
        self._befores.clear()
        editors = {p.name: Editor(p.descriptor, pages[p.first:p.first + p.span], keys, rng,
                                  self._befores) for p in parts}
        changes = list(changes)
        by_part: dict[str, list[Change]] = {p.name: [] for p in parts}
        for change in changes:
            by_part[_part(parts, change.table, change.where).name].append(change)
        for name, mine in by_part.items():
            editors[name].prepare([c.key for c in mine])
        for change in changes:  # in the order given: a later change of a key wins
            editors[_part(parts, change.table, change.where).name].apply(change)
        if not any(e.dirty for e in editors.values()) and anchor is None:
            return self.current, ChangeBatch.from_triples([])
        # (a new anchor alone is a version: a block that changed nothing here still moves
        # what the table reflects, and clients bounding blocks or age need to see it)
        # Every keyword table of the matrix moves to the new version, changed or not, so
        # that all of them name the same version and block.
        changed: list[np.ndarray] = []
        was: list[np.ndarray] = []
        now = int(time.time())
        for part in parts:
            at, rows = self._sign(part, pages, editors[part.name], signing_key, now, anchor)
            changed.append(at)
            was.append(rows)
        # each page as its XOR with the page before: a few dozen bytes of a 4 KiB page change
        # (a slot, a hash a tree level, the descriptor), so stored and sent as the bytes that
        # changed, a block costs what it changed rather than what it touched; packed straight
        # from the pages and the rows they were, never a whole 4 KiB diff a page in between
        at = np.concatenate(changed)
        batch = ChangeBatch.from_packed(at, np.zeros(len(at), bool), sparse.pack_xor(
            pages, at, self._befores.rows, np.concatenate(was)))
        key_puts = {t: k for e in editors.values() for t, k in e.key_puts.items()}
        key_dels = {t for e in editors.values() for t in e.key_dels}
        version = self.current + 1
        every = int(self.state.get("full_every", FULL_EVERY))
        full = every > 0 and (version - 1) % every == 0
        self.store.write(version, pages, full=full, keys=keys, key_puts=key_puts,
                         key_dels=key_dels, batch=batch)
        since = int(self.state.get(DIFF_BYTES, 0)) + self.store.batch_bytes(version)
        if not full and since >= pages.nbytes and self._checkpoint_free():
            # where the count says a copy is due, it is taken again from the store: a copy
            # started earlier may have landed since (in the background), or died with its
            # process, or failed; the count is reset only where a copy has landed
            since = self.store.bytes_since_full(version)
        # the batches since the last full copy add up to the table: this version becomes one,
        # after the fact (`_checkpoint`), so the version itself is written as a diff
        due = not full and since >= pages.nbytes and self._checkpoint_free()
        self.state[DIFF_BYTES] = 0 if full else since
        self.state["current"] = version
        self.state["last_changes"] = changes_id  # moves with the pointer, in one write
        if note is not None:
            self.state.update(note)
        self.save()
        self._cache = (version, pages, keys)
        if self._mapped:  # the pages are in the file (the page cache): the record says so
            _sync(keys)
            working.mark(self.root, version, clean=True)
        self._prune()
        if due:
            self._checkpoint(version)
        return version, batch

    def grow(self, table: str, signing_key: Ed25519PrivateKey, *, records: int) -> int:
        """Rebuild keyword table `table` with room for `records` records at the build's
        default load, as the next version (the other tables re-signed as they are, every one
        at the same block as before). Its matrix has another page count, so it is published
        as a rotation to its full snapshot. Returns the new version."""
        with self._lock:
            self._settle()
            self.reload()
            pages, keys = self.pages(), self.keys()
            parts = parts_of(pages)
            grown = _part(parts, table, "grow")
            d = grown.descriptor
            g = d.geometry
            buckets = max(g.num_buckets + 1, -(-records // int(
                g.slots_per_bucket * DEFAULT_LOAD[g.layout] * g.rows_per_page))
                * g.rows_per_page)
            sub = pages[grown.first:grown.first + grown.span]
            rebuilt = build_table(
                records_in(sub, d.geometry, keys), value_size=g.value_size, signing_key=signing_key,
                layout=g.layout, row_size=g.row_size, num_buckets=buckets, dataset=d.dataset,
                version=d.version + 1, anchor=d.anchor, name=d.name)
            now, blocks = int(time.time()), []
            for part in parts:
                if part is grown:
                    blocks.append(rebuilt.pages)
                    continue
                copy = pages[part.first:part.first + part.span].copy()
                self._sign(Part(part.name, 0, part.descriptor), copy,
                           Editor(part.descriptor, copy, keys, secrets.randbelow),
                           signing_key, now, part.descriptor.anchor)
                blocks.append(copy)
            new_pages = np.concatenate(blocks)
            version = self.current + 1
            batch = ChangeBatch(np.arange(len(new_pages), dtype=np.int64),
                                np.ones(len(new_pages), bool), new_pages.tobytes())
            self.store.write(version, new_pages, full=True, keys=keys, key_puts={},
                             key_dels=set(), batch=batch)
            self.state["current"] = version
            self.state["last_changes"] = None
            self.state[DIFF_BYTES] = 0
            self.state.setdefault(RESIZED, []).append(version)
            self.save()
            self._prune()
            return version

    @staticmethod
    def _sign(part: Part, pages: np.ndarray, editor: Editor, signing_key: Ed25519PrivateKey,
              now: int, anchor: Anchor | None) -> tuple[np.ndarray, np.ndarray]:
        """Rehash the paths of `editor`'s dirty pages and sign the part's next descriptor, in
        `pages`. Returns the matrix pages written (data, tree, descriptor, in order) and the
        row of `editor.befores` that holds each as it was."""
        desc, g, at = part.descriptor, part.descriptor.geometry, part.first
        sub = pages[at:at + part.span]
        # the changed pages' paths up to the root go in the same batch: a reader sees the
        # new pages with the new tree and descriptor, or none of them
        firsts = [g.level_first(k) for k in range(1, len(g.levels) + 1)]
        levels = [sub[f:f + n] for f, n in zip(firsts, g.levels, strict=True)]
        data = np.fromiter(sorted(editor.dirty), np.int64, len(editor.dirty))
        rows = [np.fromiter((editor.before[i] for i in data.tolist()), np.int64, len(data))]
        # the tree pages written are known before the rehash, so each level's, as they
        # were, are kept in one copy
        above = paths(data, len(levels))
        for level, written in zip(levels, above, strict=True):
            first = editor.befores.keep(level[written])
            rows.append(np.arange(first, first + len(written)))
        rows.append(np.array([editor.befores.keep(sub[g.descriptor_page:g.descriptor_page + 1])]))
        rehash(levels, sub[:g.data_pages], data)
        new_desc = desc.bumped(root_of(levels[-1][0]), editor.records, time=now, anchor=anchor)
        sub[g.descriptor_page] = np.frombuffer(new_desc.to_page(signing_key), np.uint8)
        where = np.concatenate([data] + [f + a for f, a in zip(firsts, above, strict=True)]
                               + [np.array([g.descriptor_page], np.int64)]) + at
        return where, np.concatenate(rows)

    def _prune(self) -> None:
        """Drop what neither an unpublished version nor the last `keep` need (after the
        pointer moved: a crash before it leaves one version too many, never one too few)."""
        keep = int(self.state.get("keep", KEEP))
        oldest = max(1, min(self.published + 1, self.current - keep + 1))
        self.store.prune(oldest)

    def unpublished(self, first_only: bool = False
                    ) -> list[tuple[int, str, list[tuple[int, str, bytes]]]]:
        """(version, publication id, batch) of every version the parties may not have yet
        (of the first only, with `first_only`)."""
        last = min(self.current, self.published + 1) if first_only else self.current
        return [(v, self.publication_id(v), self.store.batch(v))
                for v in range(self.published + 1, last + 1)]

    def publication_id(self, version: int) -> str:
        return f"kw-{self.dataset[:16]}-v{version}"

    def mark_published(self, version: int, *, reload: bool = True) -> None:
        """Note that both parties have `version`; `reload=False` keeps the state in memory
        (its holder has the lock and changed it)."""
        with self._lock:
            if reload:
                self.reload()
            if version > self.published:
                self.state["published"] = version
            self.save()
            self._prune()

    def records(self, table: str | None = None) -> list[tuple[bytes, bytes]]:
        """(key, value) of every record of the current version, by key: of keyword table
        `table`, or of all of them (None)."""
        pages, keys = self.pages(), self.keys()
        parts = parts_of(pages)
        if table is not None:
            parts = [_part(parts, table, "records")]
        out = []
        for part in parts:
            out += records_in(pages[part.first:part.first + part.span], part.descriptor.geometry,
                              keys)
        return sorted(out)


def _sync(keys: Mapping[bytes, bytes]) -> None:
    if isinstance(keys, KeyIndex):
        keys.sync()


def _part(parts: list[Part], name: str, where: str) -> Part:
    """The keyword table `name` of a matrix ("" names the only one)."""
    if not name and len(parts) == 1:
        return parts[0]
    for p in parts:
        if p.name == name:
            return p
    held = ", ".join(p.name or '""' for p in parts)
    raise RecordError(f"{where}: no keyword table {name or chr(34) * 2} here (the matrix holds "
                      f"{held})")
