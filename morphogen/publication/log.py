"""A party's durable epoch log: the one decided history of its publications.

The protocol is written down in docs/publication.md; in short: a publisher *proposes* a
publication (an `updates` or `rotation` record naming its publication id and a lease), prepares
it on the shards, then writes its *decision* (`commit` or `abort`) here before any replica
commits it. Replicas replay and catch up to committed entries only, so nothing that a crash or
a race later aborts is ever served. At most one proposal is undecided at a time: that is the
party's one publisher. A proposal whose publisher stops renewing its lease (`renew` records) is
aborted by whoever proposes next. A publication id committed once is answered from the log,
never applied again; compaction carries the ids it drops in a leading `history` record.

Files, in the log's directory:
  `log.json`    the marker: format and the log's id. Written once, by whoever creates the log
      (the application builder); every router and shard replica checks it before it trusts the
      directory, so a node whose path is not the shared log refuses to start.
  `epochs.log`  one frame per record: b"MGL2", u32 LE payload length, the length XOR
      0xFFFFFFFF, blake2b-128 of the payload (16 bytes), the payload (UTF-8 JSON of the
      `LogEntry` fields that are set); appended with one write on an O_APPEND descriptor under
      an exclusive flock, then fsynced.
  `updates-<epoch:012d>-<digest16>.bin`  one batch: b"MGB1", u32 LE page size, u64 LE count
      n, n page numbers (i64 LE), n replace flags (u8 0/1), n pages of data; written under a
      temporary name, fsynced, renamed and the directory fsynced before its record is appended.

Readers refuse whatever is wrong with a complete record, naming the file and the byte offset.
An incomplete final frame (a crash, or an append in progress) was never acknowledged, hence
never published: readers ignore it and the next writer truncates it under the lock.

`EpochLog.in_memory()` keeps the same records in the process (a party without a log
directory): one publisher and idempotent publication ids, nothing durable.

With an object-store URI (`s3://bucket/prefix`, `gs://...`) the same records are write-once
objects, one per record, and the next record's sequence number is the lock
(`morphogen.storage.log_objects`): no shared file system needed.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.protocol.changes import ChangeBatch
from morphogen.protocol.identity import EpochIdentity, batch_digest
from morphogen.storage.durable import fsync_dir, write_atomic
from morphogen.storage.location import check_log_location, is_remote
from morphogen.storage.log_objects import LogObjects, RaceLost

log = logging.getLogger(__name__)

LOG_FILE = "epochs.log"
BLOBS = "blobs"  # the update batches' prefix in an object-store log
RACE_RETRIES = 50
MARKER_FILE = "log.json"
LOG_FORMAT = 2
FRAME_MAGIC = b"MGL2"
_OLD_MAGIC = b"MGL1"
BLOB_MAGIC = b"MGB1"
# The length is stored twice (plain and inverted) so that a damaged length in the last record
# reads as corruption, not as a torn tail that a writer would silently cut off.
_FRAME = struct.Struct("<4sII16s")
_BLOB = struct.Struct("<4sIQ")
_MAX_PAYLOAD = 4 << 20
_TMP_PREFIX = ".tmp-"
# Committed publication ids a compaction keeps (the newest): a publication re-sent after this
# many later ones is no longer recognised as a duplicate.
HISTORY_MAX = 20000

PROPOSALS = ("rotation", "updates")
DECISIONS = ("commit", "abort")

_IDENTITY = ("identity", "snapshot_checksum", "chain")
_PROPOSAL = ("pub", "request", "publisher", "lease_ms")
_REQUIRED: dict[str, tuple[str, ...]] = {
    "rotation": _IDENTITY + _PROPOSAL + ("path", "checksum"),
    "updates": _IDENTITY + _PROPOSAL + ("base_epoch", "blob", "blob_digest", "count"),
    "renew": ("of", "publisher", "lease_ms"),
    "commit": ("of",),
    "abort": ("of",),
    "history": ("pubs",),
}
_INTS = ("seq", "epoch_id", "base_epoch", "count", "of", "lease_ms")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_PUB = re.compile(r"[A-Za-z0-9_.:-]{1,80}")
_BLOB_NAME = re.compile(r"updates-[0-9]{12,}-[0-9a-f]{16}\.bin")


class EpochLogError(RuntimeError):
    """The log is corrupt, absent or not this party's (the message names file and place)."""


class EpochLogConflict(EpochLogError):
    """A write that does not fit the log's state (another publisher moved it)."""


class EpochLogBusy(EpochLogConflict):
    """Another publisher holds the log (an undecided proposal whose lease runs)."""

    def __init__(self, message: str, remaining_s: float) -> None:
        super().__init__(message)
        self.remaining_s = remaining_s


@dataclass(frozen=True)
class LogEntry:
    seq: int  # 0, 1, 2 ... in file order (renumbered by `compact`)
    kind: str  # a proposal ("rotation" | "updates"), "renew", a decision, or "history"
    epoch_id: int
    identity: str | None = None  # proposals: EpochIdentity.digest after this entry
    path: str | None = None  # rotation: snapshot directory
    checksum: str | None = None  # rotation: manifest checksum
    base_epoch: int | None = None  # updates: the epoch the batch applies to
    blob: str | None = None  # updates: blob file name, relative to the log directory
    blob_digest: str | None = None  # updates: identity.batch_digest of the batch
    count: int | None = None  # updates: number of changes
    # the whole identity, so that a reader can check that each entry's chain follows the last
    snapshot_checksum: str | None = None
    chain: str | None = None
    pub: str | None = None  # proposals: the publication id (the admin's idempotency key)
    request: str | None = None  # proposals: digest of what was asked (same id, same request)
    publisher: str | None = None  # proposals and renewals: who holds the lease
    lease_ms: int | None = None  # proposals and renewals: lease end, unix milliseconds
    of: int | None = None  # renew and decisions: seq of the proposal they are about
    pubs: list[list[Any]] | None = None  # history: [pub, epoch_id, identity, request] each

    def epoch_identity(self) -> EpochIdentity | None:
        """The identity a proposal leads to (None for other records)."""
        if self.kind not in PROPOSALS or self.snapshot_checksum is None or self.chain is None:
            return None
        return EpochIdentity(self.epoch_id, self.snapshot_checksum, self.chain)


_FIELDS = frozenset(f.name for f in fields(LogEntry))


@dataclass(frozen=True)
class Published:
    """A committed publication, as a re-sent request is answered."""

    pub: str
    epoch_id: int
    identity: str
    request: str


@dataclass
class LogState:
    """What the records say together."""

    entries: list[LogEntry] = field(default_factory=list)
    committed: list[LogEntry] = field(default_factory=list)  # committed proposals, in order
    pending: LogEntry | None = None  # the undecided proposal
    lease_ms: int = 0  # its lease end
    pubs: dict[str, Published] = field(default_factory=dict)  # committed publication ids
    aborted: int = 0

    @property
    def head(self) -> LogEntry | None:
        """The last committed proposal: what the party serves."""
        return self.committed[-1] if self.committed else None

    def live(self) -> list[LogEntry]:
        """What a replay applies: committed entries from the last rotation on."""
        return _from_last_rotation(self.committed)

    def copy(self) -> LogState:
        """An independent copy (entries are immutable; the containers are not)."""
        return replace(self, entries=list(self.entries), committed=list(self.committed),
                       pubs=dict(self.pubs))

    def lease_left_s(self, now_ms: int) -> float:
        return max(0.0, (self.lease_ms - now_ms) / 1000.0) if self.pending else 0.0


def blob_name(epoch_id: int, digest: str) -> str:
    return f"updates-{int(epoch_id):012d}-{digest[:16]}.bin"


def now_ms() -> int:
    return int(time.time() * 1000)


def new_publisher_id() -> str:
    """Who proposes: unique per publisher process and attempt."""
    return f"{socket.gethostname()[:32]}-{os.getpid()}-{secrets.token_hex(4)}"


def _frame(entry: LogEntry) -> bytes:
    data = {k: v for k, v in asdict(entry).items() if v is not None}
    payload = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.blake2b(payload, digest_size=16).digest()
    return _FRAME.pack(FRAME_MAGIC, len(payload), len(payload) ^ 0xFFFFFFFF, digest) + payload


def _check_value(name: str, value: Any, where: str) -> None:
    if name in _INTS:
        ok = type(value) is int and value >= 0
    elif name == "pubs":
        ok = isinstance(value, list) and all(
            isinstance(p, list) and len(p) == 4 and isinstance(p[0], str)
            and type(p[1]) is int and isinstance(p[2], str) and isinstance(p[3], str)
            for p in value)
    else:
        ok = isinstance(value, str) and value != ""
    if not ok:
        raise EpochLogError(f"{where}: bad value for field {name}: {str(value)[:80]!r}")


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
    need = ("seq", "kind", "epoch_id") + _REQUIRED[kind]
    if missing := [f for f in need if data.get(f) is None]:
        raise EpochLogError(f"{where}: {kind} record lacks {', '.join(missing)}")
    if extra := sorted(f for f in data if f not in need and data[f] is not None):
        raise EpochLogError(f"{where}: {kind} record with fields {extra}")
    for name, value in data.items():
        if name != "kind":
            _check_value(name, value, where)
    entry = LogEntry(**data)
    if kind not in PROPOSALS:
        return entry
    assert entry.pub is not None and entry.request is not None
    if not _PUB.fullmatch(entry.pub):
        raise EpochLogError(f"{where}: bad publication id {entry.pub[:80]!r}")
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


def _misfit(state: LogState, e: LogEntry) -> str | None:
    """What is wrong with `e` coming after the records of `state` (None when it fits)."""
    pending = state.pending
    if e.kind == "history":
        return None if e.seq == 0 else "a history record other than the first"
    if e.kind in PROPOSALS:
        if pending is not None:
            return (f"proposal of epoch {e.epoch_id} while epoch {pending.epoch_id} "
                    f"(record {pending.seq}) is undecided")
        if e.pub in state.pubs:
            return f"publication {e.pub} is committed already"
        head = state.head
        at = "an empty log" if head is None else f"the head, epoch {head.epoch_id}"
        if head is None:
            return None
        if e.epoch_id <= head.epoch_id:
            return f"epoch {e.epoch_id} does not follow {at}"
        if e.kind == "updates":
            if e.base_epoch != head.epoch_id:
                return (f"updates of epoch {e.epoch_id} were made for epoch {e.base_epoch}, "
                        f"not {at}")
            base = head.epoch_identity()
            assert base is not None and e.blob_digest is not None
            if base.after_updates(e.epoch_id, e.blob_digest).digest != e.identity:
                return (f"identity {e.identity} of epoch {e.epoch_id} does not follow "
                        f"{head.identity}")
        return None
    if pending is None or e.of != pending.seq or e.epoch_id != pending.epoch_id:
        return f"{e.kind} of record {e.of} (epoch {e.epoch_id}) names no undecided proposal"
    if e.kind == "renew" and e.publisher != pending.publisher:
        return f"renewal of record {e.of} by another publisher"
    return None


def _apply(state: LogState, e: LogEntry) -> None:
    state.entries.append(e)
    if e.kind == "history":
        for pub, epoch_id, identity, request in e.pubs or ():
            state.pubs[pub] = Published(pub, epoch_id, identity, request)
    elif e.kind in PROPOSALS:
        state.pending = e
        state.lease_ms = int(e.lease_ms or 0)
    elif e.kind == "renew":
        state.lease_ms = max(state.lease_ms, int(e.lease_ms or 0))
    elif e.kind == "commit":
        p = state.pending
        assert p is not None and p.pub is not None and p.identity and p.request
        state.committed.append(p)
        state.pubs[p.pub] = Published(p.pub, p.epoch_id, p.identity, p.request)
        state.pending = None
    else:  # abort
        state.pending = None
        state.aborted += 1


def _retrying(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run a write again, from a fresh read, when another writer took its record's seq
    (object-store logs only: the directory's flock never loses)."""
    @functools.wraps(method)
    def run(self: EpochLog, *args: Any, **kwargs: Any) -> Any:
        for _ in range(RACE_RETRIES):
            try:
                return method(self, *args, **kwargs)
            except RaceLost:
                continue
        raise EpochLogError(f"{self._where()}: {RACE_RETRIES} writes in a row lost the race "
                            "for the next record")
    return run


class EpochLog:
    """The log in `directory`.

    `create`: make the directory and its marker when absent (the application builder does).
    `log_id`: the id the marker must carry (the builder's, passed to every replica): a
    directory that is not this party's shared log is refused, naming this node and the path.
    """

    def __init__(self, directory: str | os.PathLike[str] | None, *, create: bool = True,
                 log_id: str | None = None) -> None:
        self._memory: list[bytes] | None = None
        self._objects: LogObjects | None = None
        self._blobs: dict[str, bytes] = {}
        self._mutex = threading.Lock()
        self._scanned: tuple[bytes, LogState] | None = None  # see `_scan`
        if directory is not None and is_remote(directory):
            try:
                check_log_location(directory)
            except ValueError as exc:
                raise EpochLogError(str(exc)) from None
            self._objects = LogObjects(str(directory))
            self.directory = self._objects.uri  # type: ignore[assignment] - a URI, for messages
            self.path = f"{self._objects.uri}/records"  # type: ignore[assignment]
            if create:
                self._write_marker()
            self.log_id = self._read_marker(log_id)
            return
        if directory is None:  # in_memory()
            self.directory = Path("<memory>")
            self.path = self.directory / LOG_FILE
            self._memory = []
            self.log_id = secrets.token_hex(8)
            return
        self.directory = Path(directory)
        self.path = self.directory / LOG_FILE  # the records file
        if create:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._write_marker()
        self.log_id = self._read_marker(log_id)

    @classmethod
    def in_memory(cls) -> EpochLog:
        return cls(None)

    @property
    def durable(self) -> bool:
        return self._memory is None

    # -- the marker
    def _where(self) -> str:
        return f"node {socket.gethostname()}: {self.directory}"

    def _write_marker(self) -> None:
        if self._objects is not None:
            try:
                self._objects.get(MARKER_FILE)
                return
            except FileNotFoundError:
                pass
            if self._objects.read()[0]:
                raise EpochLogError(f"{self._where()}: epoch log records without a "
                                    f"{MARKER_FILE}: not a log this version wrote")
            body = json.dumps({"format": LOG_FORMAT, "log_id": secrets.token_hex(8)}).encode()
            self._objects.create(MARKER_FILE, body)  # write-once: a concurrent creator wins
            return
        marker = self.directory / MARKER_FILE
        if marker.exists():
            return
        if self.path.exists() and self.path.stat().st_size:
            raise EpochLogError(
                f"{self._where()}: an epoch log without a {MARKER_FILE} (written by an older "
                "version): move the directory aside and rotate both parties to one snapshot")
        body = json.dumps({"format": LOG_FORMAT, "log_id": secrets.token_hex(8)}).encode()
        tmp = self.directory / f"{_TMP_PREFIX}{secrets.token_hex(6)}-{MARKER_FILE}"
        tmp.write_bytes(body)
        try:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.link(tmp, marker)  # write-once: a concurrent creator's marker wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(self.directory)

    def _read_marker(self, expect: str | None) -> str:
        if self._objects is not None:
            try:
                data = json.loads(self._objects.get(MARKER_FILE))
                log_id, fmt = str(data["log_id"]), int(data["format"])
            except FileNotFoundError:
                raise EpochLogError(
                    f"{self._where()}: not an epoch log (no {MARKER_FILE}): the application "
                    "creates it; check the URI and that this node's credentials reach "
                    "it") from None
            except (ValueError, KeyError, TypeError) as exc:
                raise EpochLogError(f"{self._where()}: unreadable {MARKER_FILE} ({exc})") \
                    from None
            except Exception as exc:  # noqa: BLE001 - the store's errors, with the URI
                raise EpochLogError(f"{self._where()}: cannot read the epoch log ({exc})") \
                    from None
            return self._check_marker(log_id, fmt, expect)
        if not self.directory.is_dir():
            raise EpochLogError(
                f"{self._where()}: no epoch log directory (epoch_log_dir must be a directory "
                "that every node of the party sees, created by the application)")
        try:
            data = json.loads((self.directory / MARKER_FILE).read_text())
            log_id, fmt = str(data["log_id"]), int(data["format"])
        except FileNotFoundError:
            raise EpochLogError(
                f"{self._where()}: not an epoch log (no {MARKER_FILE}): this node does not see "
                "the party's shared epoch log directory") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise EpochLogError(f"{self._where()}: unreadable {MARKER_FILE} ({exc})") from None
        return self._check_marker(log_id, fmt, expect)

    def _check_marker(self, log_id: str, fmt: int, expect: str | None) -> str:
        if fmt != LOG_FORMAT:
            raise EpochLogError(f"{self._where()}: epoch log format {fmt}, this version "
                                f"reads {LOG_FORMAT}")
        if expect is not None and log_id != expect:
            raise EpochLogError(
                f"{self._where()}: the epoch log here is {log_id}, the party's is {expect}: "
                "this node sees another directory under the same path (not the shared one), "
                "or the log of another party")
        return log_id

    # -- reading
    def _scan(self, raw: bytes) -> tuple[LogState, int]:
        """(the state of every complete record, the byte length the records span).

        A scan is a function of the bytes alone, so the state of the longest prefix scanned
        before is taken up where the new bytes begin with it: each read decodes only the
        records appended since (a compaction, a cut torn tail or another file: from the
        start). Without this every publication decoded the whole log."""
        seen = self._scanned
        reused = seen is not None and raw.startswith(seen[0])
        if reused:
            state, pos = seen[1].copy(), len(seen[0])
        else:
            state, pos = LogState(), 0
        while pos < len(raw):
            where = f"{self.path}: byte {pos}"
            if len(raw) - pos < _FRAME.size:
                # no complete frame is this short: a torn append, unless it is not one of ours
                if FRAME_MAGIC.startswith(raw[pos : pos + 4]) or _zeros(raw, pos):
                    break
                raise EpochLogError(f"{where}: not a record (bad magic or length)")
            magic, length, inverse, digest = _FRAME.unpack_from(raw, pos)
            if magic == _OLD_MAGIC:
                raise EpochLogError(f"{where}: a record of an older log format")
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
            if entry.seq != len(state.entries):
                raise EpochLogError(f"{where}: record seq {entry.seq} where "
                                    f"{len(state.entries)} was due")
            if problem := _misfit(state, entry):
                raise EpochLogError(f"{where}: record {entry.seq}: {problem}")
            _apply(state, entry)
            pos = end
        if not reused or pos > len(seen[0]):
            self._scanned = (bytes(raw[:pos]), state.copy())
        return state, pos

    def _raw(self) -> bytes:
        if self._memory is not None:
            with self._mutex:
                return b"".join(self._memory)
        if self._objects is not None:
            try:
                return self._objects.read()[0]
            except (ValueError, RuntimeError) as exc:
                raise EpochLogError(f"{self._where()}: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - the store's errors, with the URI
                raise EpochLogError(f"{self._where()}: cannot read the epoch log ({exc})") \
                    from None
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            if not (self.directory / MARKER_FILE).exists():
                self._read_marker(None)  # names what is wrong with the directory
            return b""

    def state(self) -> LogState:
        return self._scan(self._raw())[0]

    def entries(self) -> list[LogEntry]:
        """Every complete record, in file order, validated."""
        return self.state().entries

    def live(self) -> list[LogEntry]:
        """What a replay applies: committed entries from the last committed rotation on."""
        return self.state().live()

    def head(self) -> LogEntry | None:
        """The last committed proposal."""
        return self.state().head

    def load_batch(self, entry: LogEntry) -> ChangeBatch:
        """The update batch of an `updates` entry, checked against its record."""
        if entry.kind != "updates" or entry.blob is None:
            raise EpochLogError(f"{self.path}: record {entry.seq} is not an update batch")
        path = (f"{self.directory}/{BLOBS}/{entry.blob}" if self._objects is not None
                else self.directory / entry.blob)
        try:
            raw = self._read_blob(entry.blob)
        except OSError as exc:
            raise EpochLogError(f"{path}: update batch of epoch {entry.epoch_id} is "
                                f"unreadable ({exc.strerror or exc})") from None
        magic, page_size, n = _BLOB.unpack_from(raw[: _BLOB.size].ljust(_BLOB.size, b"\0"))
        if len(raw) < _BLOB.size or magic != BLOB_MAGIC or page_size != PAGE_SIZE:
            raise EpochLogError(f"{path}: not an update batch file ({len(raw)} bytes, bad "
                                "header)")
        count = int(entry.count or 0)
        want = _BLOB.size + count * (8 + 1 + PAGE_SIZE)
        if n != count or len(raw) != want:
            raise EpochLogError(f"{path}: {len(raw)} bytes for {n} changes, the record names "
                                f"{count} changes ({want} bytes)")
        pages = np.frombuffer(raw, "<i8", n, _BLOB.size).astype(np.int64)
        flags = np.frombuffer(raw, np.uint8, n, _BLOB.size + 8 * n)
        data = raw[_BLOB.size + 9 * n :]
        if n and int(flags.max()) > 1:
            raise EpochLogError(f"{path}: replace flags other than 0 and 1 (corrupt)")
        if batch_digest(pages, flags, data) != entry.blob_digest:
            raise EpochLogError(f"{path}: batch digest does not match record {entry.seq}")
        return ChangeBatch(pages, flags.astype(bool), data)

    def _read_blob(self, name: str) -> bytes:
        if self._memory is not None:
            with self._mutex:
                if name not in self._blobs:
                    raise FileNotFoundError(2, "no such blob")
                return self._blobs[name]
        if self._objects is not None:
            return self._objects.get(f"{BLOBS}/{name}")
        return (self.directory / name).read_bytes()

    # -- writing
    @contextlib.contextmanager
    def _locked(self) -> Iterator[tuple[Callable[[bytes], None], LogState]]:
        """The records under an exclusive lock, a torn tail cut: yields (append, state)."""
        if self._memory is not None:
            with self._mutex:
                memory = self._memory
                yield memory.append, self._scan(b"".join(memory))[0]
            return
        if self._objects is not None:
            objects = self._objects
            with self._mutex:  # one writer per process; other processes race for the seq
                try:
                    raw, gen = objects.read()
                except (ValueError, RuntimeError) as exc:
                    raise EpochLogError(f"{self._where()}: {exc}") from None
                state, _ = self._scan(raw)  # objects are whole: no torn tail

                def create(frame: bytes) -> None:
                    # the next seq is the lock: RaceLost when another writer created it first
                    objects.append(gen, len(state.entries), frame)

                self._generation = gen
                yield create, state
            return
        if not (self.directory / MARKER_FILE).exists():
            self._read_marker(None)  # never write into a directory that is not a log
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
            state, end = self._scan(raw)
            if end < len(raw):
                log.warning("%s: truncating an incomplete final record at byte %d (%d bytes, "
                            "never acknowledged)", self.path, end, len(raw) - end)
                os.ftruncate(fd, end)
                os.fsync(fd)
            if end == 0:
                fsync_dir(self.directory)  # the records file may be new

            def append(frame: bytes) -> None:
                if os.write(fd, frame) != len(frame):
                    raise EpochLogError(f"{self.path}: short write appending a record")
                os.fsync(fd)

            yield append, state
        finally:
            os.close(fd)  # releases the lock

    def _add(self, append: Callable[[bytes], None], state: LogState, entry: LogEntry,
             batch: ChangeBatch | None = None) -> LogEntry:
        frame = _frame(entry)
        # the checks every reader applies, before anything is written: a record a reader
        # would refuse must never reach the log (it would refuse every later read too)
        if entry.seq != len(state.entries):
            raise ValueError(f"record seq {entry.seq} where {len(state.entries)} is due")
        try:
            _decode(frame[_FRAME.size :], f"{self.path}: new record")
        except EpochLogError as exc:
            raise ValueError(str(exc)) from None
        if problem := _misfit(state, entry):
            raise EpochLogConflict(f"{self.path}: {problem}")
        if batch is not None and entry.blob:  # under the lock: `compact` deletes blobs
            pages = np.ascontiguousarray(batch.pages, "<i8").tobytes()
            flags = np.ascontiguousarray(batch.replace, np.uint8).tobytes()
            head = _BLOB.pack(BLOB_MAGIC, PAGE_SIZE, len(batch))
            self._write_file(entry.blob, (head, pages, flags, batch.data))
        append(frame)
        _apply(state, entry)
        return entry

    @_retrying
    def propose(self, pub: str, request: str, publisher: str, lease_s: float,
                build: Callable[[LogEntry | None, int], tuple[LogEntry, ChangeBatch | None]],
                ) -> Published | LogEntry:
        """Append a proposal for publication `pub`, built by `build(head, seq)` on the
        committed head. Returns the `Published` record instead when `pub` is committed
        already (nothing written). An undecided proposal of another publisher whose lease has
        run out is aborted first; one whose lease runs raises EpochLogBusy."""
        if not _PUB.fullmatch(pub):
            raise ValueError("a publication id is 1..80 characters of A-Z a-z 0-9 _ . : -")
        with self._locked() as (append, state):
            done = state.pubs.get(pub)
            if done is not None:
                return done
            pending = state.pending
            if pending is not None:
                t = now_ms()
                if state.lease_ms > t and pending.publisher != publisher:
                    raise EpochLogBusy(
                        f"publication {pending.pub} (epoch {pending.epoch_id}) is in progress",
                        state.lease_left_s(t))
                log.warning("aborting publication %s (epoch %d): its publisher's lease ran "
                            "out undecided", pending.pub, pending.epoch_id)
                self._add(append, state, LogEntry(len(state.entries), "abort",
                                                  pending.epoch_id, of=pending.seq))
            entry, batch = build(state.head, len(state.entries))
            entry = LogEntry(**{**asdict(entry), "pub": pub, "request": request,
                                "publisher": publisher, "lease_ms": now_ms() + int(lease_s * 1000)})
            return self._add(append, state, entry, batch)

    @_retrying
    def renew(self, proposal: LogEntry, lease_s: float) -> None:
        """Extend the lease of `proposal` (raises EpochLogConflict when it was decided)."""
        with self._locked() as (append, state):
            self._add(append, state, LogEntry(
                len(state.entries), "renew", proposal.epoch_id, of=proposal.seq,
                publisher=proposal.publisher, lease_ms=now_ms() + int(lease_s * 1000)))

    @_retrying
    def decide(self, proposal: LogEntry, outcome: str) -> None:
        """Write the outcome of `proposal`, once; raises EpochLogConflict when it was decided
        already (another publisher aborted it after its lease ran out)."""
        if outcome not in DECISIONS:
            raise ValueError(f"a decision is one of {DECISIONS}")
        with self._locked() as (append, state):
            pending = state.pending
            done = state.pubs.get(proposal.pub or "")
            if (outcome == "commit" and pending is None and done is not None
                    and (done.epoch_id, done.identity, done.request)
                    == (proposal.epoch_id, proposal.identity, proposal.request)):
                return  # this commit landed before a retry (an object-store write in doubt)
            # the publisher names one attempt: a seq and a pub alone may recur after a
            # compaction renumbered the records and the admin re-sent the publication
            if pending is None or (pending.seq, pending.pub, pending.publisher) != (
                    proposal.seq, proposal.pub, proposal.publisher):
                raise EpochLogConflict(
                    f"{self.path}: publication {proposal.pub} (epoch {proposal.epoch_id}) was "
                    "decided by another publisher (its lease ran out)")
            self._add(append, state, LogEntry(len(state.entries), outcome, proposal.epoch_id,
                                              of=proposal.seq))

    @_retrying
    def abort_expired(self) -> LogEntry | None:
        """Abort the undecided proposal when its lease has run out; returns it (else None)."""
        with self._locked() as (append, state):
            pending = state.pending
            if pending is None or state.lease_ms > now_ms():
                return None
            self._add(append, state, LogEntry(len(state.entries), "abort", pending.epoch_id,
                                              of=pending.seq))
            return pending

    def append_committed(self, pub: str, build: Callable[[LogEntry | None, int],
                         tuple[LogEntry, ChangeBatch | None]]) -> LogEntry:
        """Propose and commit at once (tools and tests that publish no shard)."""
        entry = self.propose(pub, pub, new_publisher_id(), 60.0, build)
        if isinstance(entry, Published):
            raise EpochLogConflict(f"{self.path}: publication {pub} is committed already")
        self.decide(entry, "commit")
        return entry

    def _write_file(self, name: str, parts: tuple[bytes, ...]) -> None:
        """`name` in the log directory holds `parts` whole or not at all, durably."""
        if self._memory is not None:
            self._blobs[name] = b"".join(parts)
            return
        if self._objects is not None:
            # an update batch's name holds its epoch and digest: a second writer of the same
            # name writes the same bytes, so a plain put is safe
            self._objects.put(f"{BLOBS}/{name}", b"".join(parts))
            return
        write_atomic(self.directory / name, parts,
                     tmp=self.directory / f"{_TMP_PREFIX}{secrets.token_hex(6)}-{name}")

    @_retrying
    def compact(self) -> int:
        """Rewrite the log to hold a history record (the committed publication ids, newest
        `HISTORY_MAX`) and the committed entries from the last rotation on, renumbered, and
        delete the blobs no kept entry names; returns how many records were dropped. Does
        nothing while a proposal is undecided (the next compaction does it)."""
        with self._locked() as (_append, state):
            if state.pending is not None:
                return 0
            kept = state.live()
            keep_seq = {e.seq for e in kept}
            kept_pubs = {e.pub for e in kept}
            history = sorted((p for p in state.pubs.values() if p.pub not in kept_pubs),
                             key=lambda p: p.epoch_id)[-HISTORY_MAX:]
            records = [LogEntry(0, "history", 0, pubs=[
                [p.pub, p.epoch_id, p.identity, p.request] for p in history])]
            for e in state.entries:
                if e.seq in keep_seq:
                    records.append(LogEntry(**{**asdict(e), "seq": len(records)}))
                    records.append(LogEntry(len(records), "commit", e.epoch_id,
                                            of=len(records) - 1))
            if len(records) >= len(state.entries):
                return 0  # nothing to drop
            # Blobs go first, while this lock still excludes every writer: once the new file
            # is in place, a writer may lock it and write a blob this sweep must not see.
            # Only dropped records name the blobs removed, and replay never reads those.
            used = {e.blob for e in kept}
            if self._objects is not None:
                # the seal is one more record: a writer that read before it loses its seq
                # and reads again, now from the sealed state
                self._objects.seal(self._generation, len(state.entries),
                                   b"".join(_frame(e) for e in records))
                dropped = {e.blob for e in state.entries if e.blob and e.blob not in used}
                # and the batches no record names that were made for an epoch the log has
                # passed (a publisher died or stalled between upload and record): a writer
                # still in flight builds on this head, so its batch's epoch is above it
                head = state.head.epoch_id if state.head is not None else -1
                for name in self._objects.names_under(BLOBS):
                    blob = name.rpartition("/")[2]
                    if (_BLOB_NAME.fullmatch(blob) and blob not in used
                            and int(blob.split("-")[1]) <= head):
                        dropped.add(blob)
                self._objects.delete([f"{BLOBS}/{b}" for b in sorted(dropped)])
                self._objects.drop_generations_before(self._generation)
            elif self._memory is not None:
                self._blobs = {k: v for k, v in self._blobs.items() if k in used}
                self._memory[:] = [_frame(e) for e in records]
            else:
                for p in self.directory.iterdir():
                    stale = p.name.startswith(_TMP_PREFIX)  # left by a writer that died
                    if stale or (_BLOB_NAME.fullmatch(p.name) and p.name not in used):
                        p.unlink(missing_ok=True)
                self._write_file(LOG_FILE, tuple(_frame(e) for e in records))
        return len(state.entries) - len(records)


def _zeros(raw: bytes, pos: int) -> bool:
    return raw.count(0, pos) == len(raw) - pos


def _from_last_rotation(committed: list[LogEntry]) -> list[LogEntry]:
    rotations = [i for i, e in enumerate(committed) if e.kind == "rotation"]
    return committed[rotations[-1] :] if rotations else list(committed)


def rotation_entry(epoch_id: int, path: str, checksum: str, identity: EpochIdentity,
                   seq: int) -> LogEntry:
    """A rotation proposal (publication fields added by `EpochLog.propose`)."""
    if identity.epoch_id != epoch_id:
        raise ValueError(f"identity of epoch {identity.epoch_id} given for epoch {epoch_id}")
    return LogEntry(seq, "rotation", int(epoch_id), identity.digest, path=str(path),
                    checksum=str(checksum), snapshot_checksum=identity.snapshot_checksum,
                    chain=identity.chain)


def updates_entry(epoch_id: int, base_epoch: int, batch: ChangeBatch, identity: EpochIdentity,
                  seq: int) -> LogEntry:
    """An updates proposal (publication fields added by `EpochLog.propose`)."""
    if identity.epoch_id != epoch_id:
        raise ValueError(f"identity of epoch {identity.epoch_id} given for epoch {epoch_id}")
    if base_epoch >= epoch_id:
        raise ValueError(f"updates of epoch {epoch_id} cannot apply to epoch {base_epoch}")
    digest = batch.digest
    return LogEntry(seq, "updates", int(epoch_id), identity.digest, base_epoch=int(base_epoch),
                    blob=blob_name(epoch_id, digest), blob_digest=digest, count=len(batch),
                    snapshot_checksum=identity.snapshot_checksum, chain=identity.chain)
