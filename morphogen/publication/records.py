"""The epoch log's records: what each says, how it is framed, which may follow which.

Every backend (morphogen.publication.directory, .objects, .memory) stores the same frames: a
record is b"MGL2", u32 LE payload length, the length XOR 0xFFFFFFFF, blake2b-128 of the
payload (16 bytes), then the payload (UTF-8 JSON of the `LogEntry` fields that are set). An
update batch is a file or object of its own: b"MGB1", u32 LE page size, u64 LE count n, n page
numbers (i64 LE), n replace flags (u8 0/1), n pages of data. Readers refuse whatever is wrong
with a complete record (`decode`, `misfit`) and the writer applies the same checks before it
writes, so a record a reader would refuse never reaches a log.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import socket
import struct
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.protocol import sparse
from morphogen.protocol.changes import ChangeBatch
from morphogen.protocol.identity import DIGEST_VERSIONS, EpochIdentity

MARKER_FILE = "log.json"
LOG_FORMAT = 2
FRAME_MAGIC = b"MGL2"
OLD_MAGIC = b"MGL1"
BLOB_MAGIC = b"MGB1"  # the data as n whole pages (still read)
SPARSE_MAGIC = b"MGB2"  # the data as its changed bytes (`morphogen.protocol.sparse`)
# The length is stored twice (plain and inverted) so that a damaged length in the last record
# reads as corruption, not as a torn tail that a writer would silently cut off.
FRAME = struct.Struct("<4sII16s")
_BLOB = struct.Struct("<4sIQ")
# The longest payload a reader accepts (a longer length reads as a damaged frame); `frame`
# refuses to write one, so every reader can read what any writer wrote.
MAX_PAYLOAD = 4 << 20

PROPOSALS = ("rotation", "updates")
# What replay applies: the proposals, and a compaction's `fold` of many committed updates into
# one batch (written by compaction only, committed as it stands: it decides nothing new).
SERVED = PROPOSALS + ("fold",)
DECISIONS = ("commit", "abort")

_IDENTITY = ("identity", "snapshot_checksum", "chain")
_PROPOSAL = ("pub", "request", "publisher", "lease_ms")
_REQUIRED: dict[str, tuple[str, ...]] = {
    "rotation": _IDENTITY + _PROPOSAL + ("path", "checksum"),
    "updates": _IDENTITY + _PROPOSAL + ("base_epoch", "blob", "blob_digest", "count"),
    "fold": _IDENTITY + ("base_epoch", "blob", "blob_digest", "count"),
    "renew": ("of", "publisher", "lease_ms"),
    "commit": ("of",),
    "abort": ("of",),
    "history": ("pubs",),
}
# Fields a record may carry or not: records of an earlier version lack them.
_OPTIONAL: dict[str, tuple[str, ...]] = {
    "rotation": ("lease_for_ms",), "updates": ("lease_for_ms",), "renew": ("lease_for_ms",)}
_INTS = ("seq", "epoch_id", "base_epoch", "count", "of", "lease_ms", "lease_for_ms")
_HEX64 = re.compile(r"[0-9a-f]{64}")
PUB_ID = re.compile(r"[A-Za-z0-9_.:-]{1,80}")
BLOB_NAME = re.compile(r"(?:updates|fold)-[0-9]{12,}-[0-9a-f]{16}\.bin")
# One part of a publication sent in several requests is staged until its last part arrives,
# named by the whole batch's digest (`part_name`), so that parts of two batches never mix. No
# compaction sweeps them (BLOB_NAME does not match): the last part's request removes them.
MAX_PARTS = 99_999


class EpochLogError(RuntimeError):
    """The log is corrupt, absent or not this party's (the message names file and place)."""


class EpochLogUnreachable(EpochLogError):
    """The log's store did not answer as it should (`kind` as in `morphogen.storage.failures`);
    `transient` where trying again later may succeed."""

    def __init__(self, message: str, kind: str, transient: bool) -> None:
        super().__init__(message)
        self.kind = kind
        self.transient = transient


class EpochLogConflict(EpochLogError):
    """A write that does not fit the log's state (another publisher moved it)."""


class EpochLogBusy(EpochLogConflict):
    """Another publisher holds the log (an undecided proposal whose lease runs)."""

    def __init__(self, message: str, remaining_s: float,
                 holder: tuple[int, str | None, str | None] | None = None) -> None:
        super().__init__(message)
        self.remaining_s = remaining_s
        self.holder = holder  # the undecided proposal's (seq, pub, publisher)


@dataclass(frozen=True)
class LogEntry:
    seq: int  # 0, 1, 2 ... in file order (renumbered by `compact`)
    kind: str  # a proposal ("rotation" | "updates"), "renew", a decision, "history", "fold"
    epoch_id: int
    identity: str | None = None  # proposals: EpochIdentity.digest after this entry
    path: str | None = None  # rotation: snapshot directory
    checksum: str | None = None  # rotation: manifest checksum
    base_epoch: int | None = None  # updates, fold: the epoch the batch applies to
    blob: str | None = None  # updates, fold: blob file name, relative to the log directory
    blob_digest: str | None = None  # updates, fold: ChangeBatch.digest (either version)
    count: int | None = None  # updates: number of changes
    # the whole identity, so that a reader can check that each entry's chain follows the last
    snapshot_checksum: str | None = None
    chain: str | None = None
    pub: str | None = None  # proposals: the publication id (the admin's idempotency key)
    request: str | None = None  # proposals: digest of what was asked (same id, same request)
    publisher: str | None = None  # proposals and renewals: who holds the lease
    # proposals and renewals: the lease's end by the writer's wall clock, for people reading
    # the log only (another machine's clock decides nothing: morphogen.publication.lease)
    lease_ms: int | None = None
    lease_for_ms: int | None = None  # proposals and renewals: the lease's length
    of: int | None = None  # renew and decisions: seq of the proposal they are about
    pubs: list[list[Any]] | None = None  # history: [pub, epoch_id, identity, request] each

    def epoch_identity(self) -> EpochIdentity | None:
        """The identity a proposal or a fold leads to (None for other records)."""
        if self.kind not in SERVED or self.snapshot_checksum is None or self.chain is None:
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
    lease_ms: int = 0  # its lease end by its writer's wall clock (shown, never trusted)
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


def blob_name(epoch_id: int, digest: str, kind: str = "updates") -> str:
    """An update batch's name: its epoch first, which a compaction's sweep reads."""
    return f"{kind}-{int(epoch_id):012d}-{digest[:16]}.bin"


def part_name(digest: str, part: int, parts: int) -> str:
    """The staged file of part `part` (1-based) of `parts` of the batch with `digest`."""
    if not 1 <= part <= parts <= MAX_PARTS:
        raise ValueError(f"part {part} of {parts}")
    return f"part-{digest[:32]}-{part:05d}-of-{parts:05d}.bin"


def now_ms() -> int:
    return int(time.time() * 1000)


def new_publisher_id() -> str:
    """Who proposes: unique per publisher process and attempt."""
    return f"{socket.gethostname()[:32]}-{os.getpid()}-{secrets.token_hex(4)}"


def json_text(value: Any) -> str:
    """`value` as a record's payload writes it (ASCII: one byte a character)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def frame(entry: LogEntry) -> bytes:
    """The bytes of one record; ValueError for a record longer than readers accept (a record
    every reader refuses would stop the whole party, so it is refused before it is written)."""
    data = {k: v for k, v in asdict(entry).items() if v is not None}
    payload = json_text(data).encode()
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"a {entry.kind} record of {len(payload)} bytes: readers refuse "
                         f"records over {MAX_PAYLOAD} bytes, so it is not written")
    digest = hashlib.blake2b(payload, digest_size=16).digest()
    return FRAME.pack(FRAME_MAGIC, len(payload), len(payload) ^ 0xFFFFFFFF, digest) + payload


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


def decode(payload: bytes, where: str) -> LogEntry:
    """The record in `payload`, checked on its own; `where` names its place in errors."""
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
    allowed = need + _OPTIONAL.get(kind, ())
    if extra := sorted(f for f in data if f not in allowed and data[f] is not None):
        raise EpochLogError(f"{where}: {kind} record with fields {extra}")
    for name, value in data.items():
        if name != "kind":
            _check_value(name, value, where)
    entry = LogEntry(**data)
    if kind not in SERVED:
        return entry
    if kind in PROPOSALS:
        assert entry.pub is not None and entry.request is not None
        if not PUB_ID.fullmatch(entry.pub):
            raise EpochLogError(f"{where}: bad publication id {entry.pub[:80]!r}")
    try:
        good = getattr(entry.epoch_identity(), "digest", None) == entry.identity
    except (ValueError, OverflowError):  # a chain that is not hex, an epoch past 64 bits
        good = False
    if not good:
        raise EpochLogError(f"{where}: identity {entry.identity} is not the digest of its "
                            "epoch, snapshot checksum and chain")
    if kind in ("updates", "fold"):
        assert entry.base_epoch is not None and entry.blob_digest is not None
        if entry.base_epoch >= entry.epoch_id:
            raise EpochLogError(f"{where}: {kind} of epoch {entry.epoch_id} made for the "
                                f"later epoch {entry.base_epoch}")
        if not _HEX64.fullmatch(entry.blob_digest):
            raise EpochLogError(f"{where}: bad batch digest {entry.blob_digest!r}")
        if entry.blob != blob_name(entry.epoch_id, entry.blob_digest, kind):
            raise EpochLogError(f"{where}: blob name {entry.blob!r} does not match the record")
    return entry


def misfit(state: LogState, e: LogEntry) -> str | None:
    """What is wrong with `e` coming after the records of `state` (None when it fits)."""
    pending = state.pending
    if e.kind == "history":
        return None if e.seq == 0 else "a history record other than the first"
    if e.kind == "fold":
        # its identity is the last folded entry's, checked along the chain when those records
        # were read; what follows it is checked against it as against any head
        head = state.head
        if pending is not None:
            return f"a fold while epoch {pending.epoch_id} (record {pending.seq}) is undecided"
        if head is not None and e.base_epoch != head.epoch_id:
            return f"a fold of the epochs after {e.base_epoch} after the head {head.epoch_id}"
        return None
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


def apply(state: LogState, e: LogEntry) -> None:
    """`state` after `e` (which `misfit` accepted)."""
    state.entries.append(e)
    if e.kind == "history":
        for pub, epoch_id, identity, request in e.pubs or ():
            state.pubs[pub] = Published(pub, epoch_id, identity, request)
    elif e.kind in PROPOSALS:
        state.pending = e
        state.lease_ms = int(e.lease_ms or 0)
    elif e.kind == "renew":
        state.lease_ms = max(state.lease_ms, int(e.lease_ms or 0))
    elif e.kind == "fold":
        state.committed.append(e)
    elif e.kind == "commit":
        p = state.pending
        assert p is not None and p.pub is not None and p.identity and p.request
        state.committed.append(p)
        state.pubs[p.pub] = Published(p.pub, p.epoch_id, p.identity, p.request)
        state.pending = None
    else:  # abort
        state.pending = None
        state.aborted += 1


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


def all_zeros(raw: bytes, pos: int) -> bool:
    """Whether `raw` holds only zeros from `pos` on (an append the file system extended but
    never wrote)."""
    return raw.count(0, pos) == len(raw) - pos


def on_node(place: object) -> str:
    """Where a message comes from: this node and the log's place."""
    return f"node {socket.gethostname()}: {place}"


def new_marker() -> bytes:
    """The marker of a new log: its format and a fresh id."""
    return json.dumps({"format": LOG_FORMAT, "log_id": secrets.token_hex(8)}).encode()


def marker_id(body: bytes | str) -> tuple[str, int]:
    """(log id, format) of a marker (ValueError, KeyError or TypeError when unreadable)."""
    data = json.loads(body)
    return str(data["log_id"]), int(data["format"])


def check_marker(where: str, log_id: str, fmt: int, expect: str | None) -> str:
    """`log_id`, once the marker's format is this version's and its id the one expected."""
    if fmt != LOG_FORMAT:
        raise EpochLogError(f"{where}: epoch log format {fmt}, this version reads {LOG_FORMAT}")
    if expect is not None and log_id != expect:
        raise EpochLogError(
            f"{where}: the epoch log here is {log_id}, the party's is {expect}: "
            "this node sees another directory under the same path (not the shared one), "
            "or the log of another party")
    return log_id


def encode_batch(batch: ChangeBatch) -> tuple[bytes, ...]:
    """The parts of an update batch file, in order: its data as the bytes that changed (a
    block's XOR diffs are nearly all zeros), or as whole pages where that is no larger."""
    pages = np.ascontiguousarray(batch.pages, "<i8").tobytes()
    flags = np.ascontiguousarray(batch.replace, np.uint8).tobytes()
    packed = batch.packed
    if len(packed) < len(batch) * PAGE_SIZE:
        return _BLOB.pack(SPARSE_MAGIC, PAGE_SIZE, len(batch)), pages, flags, packed
    return _BLOB.pack(BLOB_MAGIC, PAGE_SIZE, len(batch)), pages, flags, batch.data


def decode_batch(raw: bytes, entry: LogEntry, path: str | Path) -> ChangeBatch:
    """The update batch of `entry` from its file's bytes, checked against the record. The
    record's digest is of the version its publisher chose (`ChangeBatch.digest_version`):
    the changed bytes' (2, cheap) is tried first, then the whole pages' (1). A batch stored
    as its changed bytes stays so: a replica hands it on to its shards unpacked."""
    count = int(entry.count or 0)
    magic = raw[:4]
    if magic == SPARSE_MAGIC:
        pages, flags, packed = _header(raw, path, count)
        try:
            batch = ChangeBatch.from_packed(pages, flags.astype(bool), packed)
        except sparse.SparseError as exc:
            raise EpochLogError(f"{path}: {exc} (corrupt)") from None
    else:
        pages, flags, data = _decoded(raw, path, count)
        batch = ChangeBatch(pages, flags.astype(bool), data)
    for version in sorted(DIGEST_VERSIONS, reverse=True):  # the newest, cheapest first
        taken = batch.with_digest(version)
        if taken.digest == entry.blob_digest:
            return taken
    raise EpochLogError(f"{path}: batch digest does not match record {entry.seq}")


def decode_part(raw: bytes, path: str | Path) -> ChangeBatch:
    """A staged part from its file's bytes (its digest is checked with the whole batch's)."""
    pages, flags, data = _decoded(raw, path, None)
    return ChangeBatch(pages, flags.astype(bool), data)


def _decoded(raw: bytes, path: str | Path, count: int | None
             ) -> tuple[np.ndarray, np.ndarray, bytes]:
    pages, flags, data = _header(raw, path, count)
    if raw[:4] == BLOB_MAGIC:
        return pages, flags, bytes(data)
    try:
        return pages, flags, sparse.unpack(data, len(pages) * PAGE_SIZE)
    except sparse.SparseError as exc:
        raise EpochLogError(f"{path}: {exc} (corrupt)") from None


def _header(raw: bytes, path: str | Path, count: int | None
            ) -> tuple[np.ndarray, np.ndarray, memoryview]:
    """(pages, flags, the data as stored: whole pages or their sparse form) of a batch file,
    its header and sizes checked."""
    magic, page_size, n = _BLOB.unpack_from(raw[: _BLOB.size].ljust(_BLOB.size, b"\0"))
    if len(raw) < _BLOB.size or magic not in (BLOB_MAGIC, SPARSE_MAGIC) \
            or page_size != PAGE_SIZE:
        raise EpochLogError(f"{path}: not an update batch file ({len(raw)} bytes, bad "
                            "header)")
    head = _BLOB.size + n * 9
    want = head + n * PAGE_SIZE
    if ((count is not None and n != count) or len(raw) < head
            or (magic == BLOB_MAGIC and len(raw) != want)):
        named = f", the record names {count} changes" if count is not None else ""
        size = f" ({want} bytes expected)" if magic == BLOB_MAGIC else ""
        raise EpochLogError(f"{path}: {len(raw)} bytes for {n} changes{named}{size}")
    pages = np.frombuffer(raw, "<i8", n, _BLOB.size).astype(np.int64)
    flags = np.frombuffer(raw, np.uint8, n, _BLOB.size + 8 * n)
    if n and int(flags.max()) > 1:
        raise EpochLogError(f"{path}: replace flags other than 0 and 1 (corrupt)")
    return pages, flags, memoryview(raw)[head:]
