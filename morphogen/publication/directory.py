"""An epoch log in a directory every node of the party sees.

Files, in the log's directory:
  `log.json`    the marker: format and the log's id. Written once, by whoever creates the log
      (the application builder); every router and shard replica checks it before it trusts the
      directory, so a node whose path is not the shared log refuses to start.
  `epochs.log`  one frame per record (morphogen.publication.records), appended with one write
      on an O_APPEND descriptor under an exclusive flock, then fsynced.
  `updates-<epoch:012d>-<digest16>.bin`  one batch, written under a temporary name, fsynced,
      renamed and the directory fsynced before its record is appended.

An incomplete final frame (a crash, or an append in progress) was never acknowledged, hence
never published: readers ignore it and the next writer truncates it under the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from morphogen.publication.compaction import Compaction
from morphogen.publication.records import (
    BLOB_NAME,
    MARKER_FILE,
    EpochLogError,
    LogState,
    check_marker,
    marker_id,
    new_marker,
    on_node,
)
from morphogen.storage.durable import fsync_dir, write_atomic

log = logging.getLogger(__name__)

LOG_FILE = "epochs.log"
_TMP_PREFIX = ".tmp-"
# A temporary file untouched this long was left by a writer that died: no write of a batch
# pauses between its writes for minutes.
TMP_STALE_S = 900.0

Scan = Callable[[bytes], tuple[LogState, int]]


class DirectoryLog:
    durable = True

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LOG_FILE  # the records file

    def _where(self) -> str:
        return on_node(self.directory)

    # -- the marker
    def write_marker(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        marker = self.directory / MARKER_FILE
        if marker.exists():
            return
        if self.path.exists() and self.path.stat().st_size:
            raise EpochLogError(
                f"{self._where()}: an epoch log without a {MARKER_FILE} (written by an older "
                "version): move the directory aside and rotate both parties to one snapshot")
        tmp = self.directory / f"{_TMP_PREFIX}{secrets.token_hex(6)}-{MARKER_FILE}"
        tmp.write_bytes(new_marker())
        try:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.link(tmp, marker)  # write-once: a concurrent creator's marker wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(self.directory)

    def read_marker(self, expect: str | None) -> str:
        if not self.directory.is_dir():
            raise EpochLogError(
                f"{self._where()}: no epoch log directory (epoch_log_dir must be a directory "
                "that every node of the party sees, created by the application)")
        try:
            log_id, fmt = marker_id((self.directory / MARKER_FILE).read_text())
        except FileNotFoundError:
            raise EpochLogError(
                f"{self._where()}: not an epoch log (no {MARKER_FILE}): this node does not see "
                "the party's shared epoch log directory") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise EpochLogError(f"{self._where()}: unreadable {MARKER_FILE} ({exc})") from None
        return check_marker(self._where(), log_id, fmt, expect)

    # -- reading
    def raw(self) -> bytes:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            if not (self.directory / MARKER_FILE).exists():
                self.read_marker(None)  # names what is wrong with the directory
            return b""

    def blob_path(self, name: str) -> Path:
        return self.directory / name

    def read_blob(self, name: str) -> bytes:
        return (self.directory / name).read_bytes()

    # -- writing
    def write_file(self, name: str, parts: tuple[bytes, ...]) -> None:
        """`name` in the log directory holds `parts` whole or not at all, durably."""
        write_atomic(self.directory / name, parts,
                     tmp=self.directory / f"{_TMP_PREFIX}{secrets.token_hex(6)}-{name}")

    def has_file(self, name: str) -> bool:
        return (self.directory / name).is_file()

    def remove_files(self, names: list[str]) -> None:
        for name in names:
            (self.directory / name).unlink(missing_ok=True)

    @contextlib.contextmanager
    def locked(self, scan: Scan) -> Iterator[tuple[Callable[[bytes], None], LogState]]:
        """The records under an exclusive flock, a torn tail cut: yields (append, state)."""
        if not (self.directory / MARKER_FILE).exists():
            self.read_marker(None)  # never write into a directory that is not a log
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                st = os.fstat(fd)
                now = os.stat(self.path)
            except FileNotFoundError:
                now = None
            except BaseException:
                os.close(fd)
                raise
            if now is not None and (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
                break
            os.close(fd)  # a compaction replaced the file while we waited: lock the new one
        try:
            raw = self.path.read_bytes()  # the locked file: only a lock holder replaces it
            state, end = scan(raw)
            if end < len(raw):
                log.warning("%s: truncating an incomplete final record at byte %d (%d bytes, "
                            "never acknowledged)", self.path, end, len(raw) - end)
                os.ftruncate(fd, end)
                os.fsync(fd)
            if end == 0:
                fsync_dir(self.directory)  # the records file may be new

            def append(record: bytes) -> None:
                if os.write(fd, record) != len(record):
                    raise EpochLogError(f"{self.path}: short write appending a record")
                os.fsync(fd)

            yield append, state
        finally:
            os.close(fd)  # releases the lock

    def rewrite(self, state: LogState, plan: Compaction) -> None:
        """Replace the records with `plan`'s, in one rename. Until that rename the old records
        are the log, the updates being folded among them, so no batch they name is deleted
        before it; and a replica that read them just before (one replaying as it starts)
        still finds their batches after it. So the batches the new records drop go at the
        next compaction, as files that neither its old records nor its new ones name: those
        go here, before the rename, while the lock excludes every writer (a writer writes its
        batch and its record under one lock; a fold written before the lock is checked for
        under it), with temporaries that no writer has touched for `TMP_STALE_S`."""
        named = plan.used | {e.blob for e in state.entries}
        for p in self.directory.iterdir():
            if (BLOB_NAME.fullmatch(p.name) and p.name not in named) or self._stale_tmp(p):
                p.unlink(missing_ok=True)
        self.write_file(LOG_FILE, tuple(plan.frames))

    @staticmethod
    def _stale_tmp(p: Path) -> bool:
        """A temporary file no writer is still writing (one that died left it): a write in
        progress outside the lock (a fold, a staged part) keeps its file's mtime fresh."""
        if not p.name.startswith(_TMP_PREFIX):
            return False
        try:
            return time.time() - p.stat().st_mtime > TMP_STALE_S
        except FileNotFoundError:
            return False
