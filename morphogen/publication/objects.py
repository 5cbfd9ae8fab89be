"""An epoch log in an object store (`s3://bucket/prefix`, `gs://...`): the same records as
write-once objects, one per record, and the next record's sequence number is the lock
(`morphogen.storage.log_objects`): no shared file system needed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from morphogen.publication.compaction import Compaction
from morphogen.publication.records import (
    BLOB_NAME,
    MARKER_FILE,
    EpochLogError,
    EpochLogUnreachable,
    LogState,
    check_marker,
    marker_id,
    new_marker,
    on_node,
)
from morphogen.storage.failures import failure
from morphogen.storage.log_objects import LogObjects

BLOBS = "blobs"  # the update batches' prefix

Scan = Callable[[bytes], tuple[LogState, int]]


class ObjectLog:
    durable = True

    def __init__(self, uri: str) -> None:
        self.objects = LogObjects(uri)
        self.directory = self.objects.uri  # a URI, for messages
        self.path = f"{self.objects.uri}/records"
        self._mutex = threading.Lock()
        self._generation = 0

    def _where(self) -> str:
        return on_node(self.directory)

    def _unreachable(self, exc: BaseException) -> EpochLogUnreachable:
        err = failure(f"{self._where()}: cannot read the epoch log", exc)
        return EpochLogUnreachable(str(err), err.kind, err.transient)

    # -- the marker
    def write_marker(self) -> None:
        try:
            self.objects.get(MARKER_FILE)
            return
        except FileNotFoundError:
            pass
        if self.objects.read()[0]:
            raise EpochLogError(f"{self._where()}: epoch log records without a "
                                f"{MARKER_FILE}: not a log this version wrote")
        self.objects.create(MARKER_FILE, new_marker())  # write-once: a concurrent creator wins

    def read_marker(self, expect: str | None) -> str:
        try:
            log_id, fmt = marker_id(self.objects.get(MARKER_FILE))
        except FileNotFoundError:
            raise EpochLogError(
                f"{self._where()}: not an epoch log (no {MARKER_FILE}): the application "
                "creates it; check the URI and that this node's credentials reach "
                "it") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise EpochLogError(f"{self._where()}: unreadable {MARKER_FILE} ({exc})") \
                from None
        except Exception as exc:  # noqa: BLE001 - the store's errors, with the URI
            raise self._unreachable(exc) from None
        return check_marker(self._where(), log_id, fmt, expect)

    # -- reading
    def raw(self) -> bytes:
        try:
            return self.objects.read()[0]
        except (ValueError, RuntimeError) as exc:
            raise EpochLogError(f"{self._where()}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the store's errors, with the URI
            raise self._unreachable(exc) from None

    def blob_path(self, name: str) -> str:
        return f"{self.directory}/{BLOBS}/{name}"

    def read_blob(self, name: str) -> bytes:
        return self.objects.get(f"{BLOBS}/{name}")

    # -- writing
    def write_file(self, name: str, parts: tuple[bytes, ...]) -> None:
        # an update batch's name holds its epoch and digest: a second writer of the same name
        # writes the same bytes, so a plain put is safe
        self.objects.put(f"{BLOBS}/{name}", b"".join(parts))

    def has_file(self, name: str) -> bool:
        try:
            return self.objects.exists(f"{BLOBS}/{name}")
        except Exception as exc:  # noqa: BLE001 - the store's errors, with the URI
            raise self._unreachable(exc) from None

    def remove_files(self, names: list[str]) -> None:
        try:
            self.objects.delete([f"{BLOBS}/{name}" for name in names])
        except Exception as exc:  # noqa: BLE001 - the store's errors, with the URI
            raise self._unreachable(exc) from None

    @contextlib.contextmanager
    def locked(self, scan: Scan) -> Iterator[tuple[Callable[[bytes], None], LogState]]:
        """The records as read now: yields (create, state), where `create` raises RaceLost
        when another writer created the next record first (the caller reads again)."""
        objects = self.objects
        with self._mutex:  # one writer per process; other processes race for the seq
            try:
                raw, gen = objects.read()
            except (ValueError, RuntimeError) as exc:
                raise EpochLogError(f"{self._where()}: {exc}") from None
            state, _ = scan(raw)  # objects are whole: no torn tail

            def create(record: bytes) -> None:
                # the next seq is the lock: RaceLost when another writer created it first
                objects.append(gen, len(state.entries), record)

            self._generation = gen
            yield create, state

    def rewrite(self, state: LogState, plan: Compaction) -> None:
        # the seal is one more record: a writer that read before it loses its seq and reads
        # again, now from the sealed state
        self.objects.seal(self._generation, len(state.entries), b"".join(plan.frames))
        # What may go is decided by epoch, whichever record named a batch: this sweep runs
        # after the seal, with no lock, while writers go on in the next generation.
        # - An update batch only below the head. A proposal appended from now on builds on
        #   this head or a later one, so its batch's epoch is above it; a batch of an aborted
        #   proposal above the head may be named again by a re-send of the same changes (same
        #   epoch, same digest, same name), committed and served before this sweep ran, so it
        #   stays until a compaction whose head has passed it. Below the head: batches of
        #   dropped records, and those no record names (a publisher died or stalled between
        #   upload and record).
        # - A fold batch only at or below the plan's floor (see Compaction.fold_floor).
        # - Never one the sealed records name: a replica that read them just before the seal
        #   (one replaying as it starts) still finds their batches. They go at the next
        #   compaction, as the generation that names them does.
        head = state.head.epoch_id if state.head is not None else -1
        named = plan.used | {e.blob for e in state.entries}
        dropped = set()
        for name in self.objects.names_under(BLOBS):
            blob = name.rpartition("/")[2]
            if not BLOB_NAME.fullmatch(blob) or blob in named:
                continue
            kind, epoch = blob.split("-")[0], int(blob.split("-")[1])
            if epoch <= (plan.fold_floor if kind == "fold" else head):
                dropped.add(blob)
        self.objects.delete([f"{BLOBS}/{b}" for b in sorted(dropped)])
        self.objects.drop_generations_before(self._generation)
