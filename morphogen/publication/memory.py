"""An epoch log kept in the process (`EpochLog.in_memory()`): the same records and checks,
nothing durable. A party without a log directory reads its (empty) status from one; it never
publishes through one, since ids that die with the router cannot keep a re-sent publication
from being applied twice (morphogen.config.ADMIN_NEEDS_LOG).
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from morphogen.publication.compaction import Compaction
from morphogen.publication.records import LogState

Scan = Callable[[bytes], tuple[LogState, int]]


class MemoryLog:
    durable = False

    def __init__(self) -> None:
        self.directory = Path("<memory>")
        self.path = self.directory / "epochs.log"
        self.log_id = secrets.token_hex(8)
        self._frames: list[bytes] = []
        self._blobs: dict[str, bytes] = {}
        self._mutex = threading.Lock()

    def write_marker(self) -> None:
        pass  # nothing to share: the id is this object's

    def read_marker(self, expect: str | None) -> str:
        return self.log_id

    def raw(self) -> bytes:
        with self._mutex:
            return b"".join(self._frames)

    def blob_path(self, name: str) -> Path:
        return self.directory / name

    def read_blob(self, name: str) -> bytes:
        # no mutex: a compaction reads the batches it folds from other threads while it holds
        # the mutex, and a dict look-up (or its replacement by `rewrite`) is atomic
        blob = self._blobs.get(name)
        if blob is None:
            raise FileNotFoundError(2, "no such blob")
        return blob

    def write_file(self, name: str, parts: tuple[bytes, ...]) -> None:
        self._blobs[name] = b"".join(parts)

    def has_file(self, name: str) -> bool:
        return name in self._blobs

    def remove_files(self, names: list[str]) -> None:
        for name in names:
            self._blobs.pop(name, None)

    @contextlib.contextmanager
    def locked(self, scan: Scan) -> Iterator[tuple[Callable[[bytes], None], LogState]]:
        with self._mutex:
            frames = self._frames
            yield frames.append, scan(b"".join(frames))[0]

    def rewrite(self, state: LogState, plan: Compaction) -> None:
        # as the durable backends do: the batches the old records name stay until the next
        # compaction, for a reader that read them just before
        named = plan.used | {e.blob for e in state.entries}
        self._blobs = {k: v for k, v in self._blobs.items() if k in named}
        self._frames[:] = list(plan.frames)
