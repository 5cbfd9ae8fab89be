"""A party's durable epoch log: what it published, in order, so that a shard comes back to it.

The router appends every publication here before any shard sees it, and a shard replica that
starts replays the live entries before it reports ready (`ShardCore.catch_up`). An `abort`
record cancels the live head of its epoch (that publication failed and changed nothing).

Files, in the log's directory:
  `epochs.log`  one frame per record: b"MGL1", u32 LE payload length, the length XOR
      0xFFFFFFFF, blake2b-128 of the payload (16 bytes), the payload (UTF-8 JSON of the
      `LogEntry` fields); appended with one write on an O_APPEND descriptor, then fsynced.
  `updates-<epoch:012d>-<digest16>.bin`  one batch: b"MGB1", u32 LE page size, u64 LE count
      n, n page numbers (i64 LE), n replace flags (u8 0/1), n pages of data; written under a
      temporary name, fsynced, renamed and the directory fsynced before its record is appended.

Readers refuse whatever is wrong with a complete record, naming the file and the byte offset.
An incomplete final frame (a crash, or an append in progress) was never acknowledged, hence
never published: readers ignore it and the next writer truncates it under the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import struct
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from morphogen.changes import ChangeBatch
from morphogen.constants import PAGE_SIZE
from morphogen.identity import EpochIdentity, batch_digest

log = logging.getLogger(__name__)

LOG_FILE = "epochs.log"
FRAME_MAGIC = b"MGL1"
BLOB_MAGIC = b"MGB1"
# The length is stored twice (plain and inverted) so that a damaged length in the last record
# reads as corruption, not as a torn tail that a writer would silently cut off.
_FRAME = struct.Struct("<4sII16s")
_BLOB = struct.Struct("<4sIQ")
_MAX_PAYLOAD = 1 << 20
_TMP_PREFIX = ".tmp-"

_COMMON = ("seq", "kind", "epoch_id")
_IDENTITY = ("identity", "snapshot_checksum", "chain")
_REQUIRED = {
    "rotation": _COMMON + _IDENTITY + ("path", "checksum"),
    "updates": _COMMON + _IDENTITY + ("base_epoch", "blob", "blob_digest"),
    "abort": _COMMON,
}
_INTS = ("seq", "epoch_id", "base_epoch", "count")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_BLOB_NAME = re.compile(r"updates-[0-9]{12,}-[0-9a-f]{16}\.bin")


class EpochLogError(RuntimeError):
    """The log is corrupt or does not hold together (the message names file and place)."""


class EpochLogConflict(EpochLogError):
    """An append that does not follow the log's head (another writer moved it)."""


@dataclass(frozen=True)
class LogEntry:
    seq: int  # 0, 1, 2 ... in file order (renumbered by `compact`)
    kind: str  # "rotation" | "updates" | "abort"
    epoch_id: int
    identity: str | None  # EpochIdentity.digest after this entry; None for an abort
    path: str | None = None  # rotation: snapshot directory
    checksum: str | None = None  # rotation: manifest checksum
    base_epoch: int | None = None  # updates: the epoch the batch applies to
    blob: str | None = None  # updates: blob file name, relative to the log directory
    blob_digest: str | None = None  # updates: identity.batch_digest of the batch
    count: int = 0  # updates: number of changes
    # the whole identity, so that a reader can check that each entry's chain follows the last
    snapshot_checksum: str | None = None
    chain: str | None = None

    def epoch_identity(self) -> EpochIdentity | None:
        """The identity this entry leads to (None for an abort)."""
        if self.kind == "abort" or self.snapshot_checksum is None or self.chain is None:
            return None
        return EpochIdentity(self.epoch_id, self.snapshot_checksum, self.chain)


_FIELDS = frozenset(f.name for f in fields(LogEntry))


def blob_name(epoch_id: int, digest: str) -> str:
    return f"updates-{int(epoch_id):012d}-{digest[:16]}.bin"


def _frame(entry: LogEntry) -> bytes:
    payload = json.dumps(asdict(entry), sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.blake2b(payload, digest_size=16).digest()
    return _FRAME.pack(FRAME_MAGIC, len(payload), len(payload) ^ 0xFFFFFFFF, digest) + payload


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _decode(payload: bytes, where: str) -> LogEntry:
    try:
        data = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise EpochLogError(f"{where}: undecodable record ({exc})") from None
    if not isinstance(data, dict):
        raise EpochLogError(f"{where}: a record is a JSON object")
    if unknown := sorted(set(data) - _FIELDS):
        raise EpochLogError(f"{where}: unknown record fields {unknown}")
    kind = data.get("kind")
    if kind not in _REQUIRED:
        raise EpochLogError(f"{where}: record of unknown kind {kind!r}")
    if missing := [f for f in _REQUIRED[kind] if data.get(f) is None]:
        raise EpochLogError(f"{where}: {kind} record lacks {', '.join(missing)}")
    extra = [f for f in _FIELDS - set(_REQUIRED[kind]) - {"count"} if data.get(f) is not None]
    if extra or (kind != "updates" and data.get("count", 0) != 0):
        raise EpochLogError(f"{where}: {kind} record with fields {sorted(extra) or ['count']}")
    for name, value in data.items():
        ok = (type(value) is int and value >= 0) if name in _INTS else isinstance(value, str)
        if value is not None and not ok:
            raise EpochLogError(f"{where}: bad value for field {name}: {value!r}")
    entry = LogEntry(**data)
    if kind == "abort":
        return entry
    try:
        good = getattr(entry.epoch_identity(), "digest", None) == entry.identity
    except (ValueError, OverflowError):  # a chain that is not hex, an epoch past 64 bits
        good = False
    if not good:
        raise EpochLogError(f"{where}: identity {entry.identity} is not the digest of its "
                            "epoch, snapshot checksum and chain")
    if kind == "updates":
        assert entry.base_epoch is not None and entry.blob_digest is not None
        if entry.base_epoch >= entry.epoch_id:
            raise EpochLogError(f"{where}: updates of epoch {entry.epoch_id} made for the "
                                f"later epoch {entry.base_epoch}")
        if not _HEX64.fullmatch(entry.blob_digest):
            raise EpochLogError(f"{where}: bad batch digest {entry.blob_digest!r}")
        if entry.blob != blob_name(entry.epoch_id, entry.blob_digest):
            raise EpochLogError(f"{where}: blob name {entry.blob!r} does not match the record")
    return entry


def _follows(head: LogEntry | None, e: LogEntry) -> str | None:
    """What is wrong with `e` coming after the live entry `head` (None when it fits)."""
    at = "an empty log" if head is None else f"the head, epoch {head.epoch_id}"
    if e.kind == "abort":
        if head is None or head.epoch_id != e.epoch_id:
            return f"abort of epoch {e.epoch_id} does not name {at}"
        return None
    if head is None:
        return None
    if e.epoch_id <= head.epoch_id:
        return f"epoch {e.epoch_id} does not follow {at}"
    if e.kind == "updates":
        if e.base_epoch != head.epoch_id:
            return f"updates of epoch {e.epoch_id} were made for epoch {e.base_epoch}, not {at}"
        base = head.epoch_identity()
        assert base is not None and e.blob_digest is not None
        if base.after_updates(e.epoch_id, e.blob_digest).digest != e.identity:
            return f"identity {e.identity} of epoch {e.epoch_id} does not follow {head.identity}"
    return None


class EpochLog:
    """The log in `directory` (created when `create`, else it must exist)."""

    def __init__(self, directory: str | os.PathLike[str], *, create: bool = True) -> None:
        self.directory = Path(directory)
        if create:
            self.directory.mkdir(parents=True, exist_ok=True)
        elif not self.directory.is_dir():
            raise EpochLogError(f"{self.directory}: no epoch log directory")
        self.path = self.directory / LOG_FILE  # the records file

    # -- reading
    def _scan(self, raw: bytes) -> tuple[list[LogEntry], list[LogEntry], int]:
        """(every complete record, the live stack, the byte length the records span)."""
        entries: list[LogEntry] = []
        stack: list[LogEntry] = []
        pos = 0
        while pos < len(raw):
            where = f"{self.path}: byte {pos}"
            if len(raw) - pos < _FRAME.size:
                # no complete frame is this short: a torn append, unless it is not one of ours
                if FRAME_MAGIC.startswith(raw[pos : pos + 4]) or _zeros(raw, pos):
                    break
                raise EpochLogError(f"{where}: not a record (bad magic or length)")
            magic, length, inverse, digest = _FRAME.unpack_from(raw, pos)
            if magic != FRAME_MAGIC or length ^ inverse != 0xFFFFFFFF or length > _MAX_PAYLOAD:
                if _zeros(raw, pos):  # an append the file system extended but never wrote
                    break
                raise EpochLogError(f"{where}: not a record (bad magic or length)")
            end = pos + _FRAME.size + length
            if end > len(raw):
                break  # the payload of the last record is incomplete
            payload = raw[pos + _FRAME.size : end]
            if hashlib.blake2b(payload, digest_size=16).digest() != digest:
                raise EpochLogError(f"{where}: record checksum mismatch (corrupt log)")
            entry = _decode(payload, where)
            if entry.seq != len(entries):
                raise EpochLogError(f"{where}: record seq {entry.seq} where {len(entries)} "
                                    "was due")
            if problem := _follows(stack[-1] if stack else None, entry):
                raise EpochLogError(f"{where}: record {entry.seq}: {problem}")
            if entry.kind == "abort":
                stack.pop()
            else:
                stack.append(entry)
            entries.append(entry)
            pos = end
        return entries, stack, pos

    def _read(self) -> tuple[list[LogEntry], list[LogEntry]]:
        try:
            return self._scan(self.path.read_bytes())[:2]
        except FileNotFoundError:
            return [], []

    def entries(self) -> list[LogEntry]:
        """Every complete record, in file order, validated."""
        return self._read()[0]

    def live(self) -> list[LogEntry]:
        """What a replay applies: entries no abort cancelled, from the last rotation on."""
        return _from_last_rotation(self._read()[1])

    def head(self) -> LogEntry | None:
        stack = self._read()[1]
        return stack[-1] if stack else None

    def load_batch(self, entry: LogEntry) -> ChangeBatch:
        """The update batch of an `updates` entry, checked against its record."""
        if entry.kind != "updates" or entry.blob is None:
            raise EpochLogError(f"{self.path}: record {entry.seq} is not an update batch")
        path = self.directory / entry.blob
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise EpochLogError(f"{path}: update batch of epoch {entry.epoch_id} is "
                                f"unreadable ({exc.strerror or exc})") from None
        magic, page_size, n = _BLOB.unpack_from(raw[: _BLOB.size].ljust(_BLOB.size, b"\0"))
        if len(raw) < _BLOB.size or magic != BLOB_MAGIC or page_size != PAGE_SIZE:
            raise EpochLogError(f"{path}: not an update batch file ({len(raw)} bytes, bad "
                                "header)")
        want = _BLOB.size + entry.count * (8 + 1 + PAGE_SIZE)
        if n != entry.count or len(raw) != want:
            raise EpochLogError(f"{path}: {len(raw)} bytes for {n} changes, the record names "
                                f"{entry.count} changes ({want} bytes)")
        pages = np.frombuffer(raw, "<i8", n, _BLOB.size).astype(np.int64)
        flags = np.frombuffer(raw, np.uint8, n, _BLOB.size + 8 * n)
        data = raw[_BLOB.size + 9 * n :]
        if n and int(flags.max()) > 1:
            raise EpochLogError(f"{path}: replace flags other than 0 and 1 (corrupt)")
        if batch_digest(pages, flags, data) != entry.blob_digest:
            raise EpochLogError(f"{path}: batch digest does not match record {entry.seq}")
        return ChangeBatch(pages, flags.astype(bool), data)

    # -- writing
    @contextlib.contextmanager
    def _locked(self) -> Iterator[tuple[int, list[LogEntry], list[LogEntry]]]:
        """The records file open for append under an exclusive lock, its torn tail cut: yields
        (descriptor, entries, live stack)."""
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
            entries, stack, end = self._scan(raw)
            if end < len(raw):
                log.warning("%s: truncating an incomplete final record at byte %d (%d bytes, "
                            "never acknowledged)", self.path, end, len(raw) - end)
                os.ftruncate(fd, end)
                os.fsync(fd)
            if end == 0:
                _fsync_dir(self.directory)  # the records file may be new
            yield fd, entries, stack
        finally:
            os.close(fd)  # releases the lock

    def _append(self, fd: int, stack: list[LogEntry], entry: LogEntry,
                batch: ChangeBatch | None = None) -> LogEntry:
        if problem := _follows(stack[-1] if stack else None, entry):
            raise EpochLogConflict(f"{self.path}: {problem}")
        if batch is not None and entry.blob:  # under the lock: `compact` deletes blobs
            pages = np.ascontiguousarray(batch.pages, "<i8").tobytes()
            flags = np.ascontiguousarray(batch.replace, np.uint8).tobytes()
            head = _BLOB.pack(BLOB_MAGIC, PAGE_SIZE, len(batch))
            self._write_file(entry.blob, (head, pages, flags, batch.data))
        frame = _frame(entry)
        if os.write(fd, frame) != len(frame):
            raise EpochLogError(f"{self.path}: short write appending record {entry.seq}")
        os.fsync(fd)
        return entry

    def append_rotation(self, epoch_id: int, path: str, checksum: str,
                        identity: EpochIdentity) -> LogEntry:
        _check_identity(epoch_id, identity)
        with self._locked() as (fd, entries, stack):
            return self._append(fd, stack, LogEntry(
                len(entries), "rotation", int(epoch_id), identity.digest, path=str(path),
                checksum=str(checksum), snapshot_checksum=identity.snapshot_checksum,
                chain=identity.chain))

    def append_updates(self, epoch_id: int, base_epoch: int, batch: ChangeBatch,
                       identity: EpochIdentity) -> LogEntry:
        _check_identity(epoch_id, identity)
        if base_epoch >= epoch_id:
            raise ValueError(f"updates of epoch {epoch_id} cannot apply to epoch {base_epoch}")
        digest = batch.digest
        with self._locked() as (fd, entries, stack):
            return self._append(fd, stack, LogEntry(
                len(entries), "updates", int(epoch_id), identity.digest,
                base_epoch=int(base_epoch), blob=blob_name(epoch_id, digest), blob_digest=digest,
                count=len(batch), snapshot_checksum=identity.snapshot_checksum,
                chain=identity.chain), batch)

    def append_abort(self, epoch_id: int) -> LogEntry:
        with self._locked() as (fd, entries, stack):
            return self._append(fd, stack, LogEntry(len(entries), "abort", int(epoch_id), None))

    def _write_file(self, name: str, parts: tuple[bytes, ...]) -> None:
        """`name` in the log directory holds `parts` whole or not at all, durably."""
        tmp = self.directory / f"{_TMP_PREFIX}{secrets.token_hex(6)}-{name}"
        try:
            with open(tmp, "wb") as fh:
                for part in parts:
                    fh.write(part)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.directory / name)
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(self.directory)

    def compact(self) -> int:
        """Rewrite the log to hold only `live()` (renumbered from 0) and delete the blobs no
        kept entry names; returns how many records were dropped."""
        with self._locked() as (_fd, entries, stack):
            keep = [LogEntry(**{**asdict(e), "seq": i})
                    for i, e in enumerate(_from_last_rotation(stack))]
            # Blobs go first, while this lock still excludes every writer: once the new file
            # is in place, a writer may lock it and write a blob this sweep must not see.
            # Only dropped records name the blobs removed, and replay never reads those.
            used = {e.blob for e in keep}
            for p in self.directory.iterdir():
                stale = p.name.startswith(_TMP_PREFIX)  # left by a writer that died
                if stale or (_BLOB_NAME.fullmatch(p.name) and p.name not in used):
                    p.unlink(missing_ok=True)
            self._write_file(LOG_FILE, tuple(_frame(e) for e in keep))
        return len(entries) - len(keep)


def _zeros(raw: bytes, pos: int) -> bool:
    return raw.count(0, pos) == len(raw) - pos


def _check_identity(epoch_id: int, identity: EpochIdentity) -> None:
    if identity.epoch_id != epoch_id:
        raise ValueError(f"identity of epoch {identity.epoch_id} given for epoch {epoch_id}")


def _from_last_rotation(stack: list[LogEntry]) -> list[LogEntry]:
    rotations = [i for i, e in enumerate(stack) if e.kind == "rotation"]
    return stack[rotations[-1] :] if rotations else list(stack)
