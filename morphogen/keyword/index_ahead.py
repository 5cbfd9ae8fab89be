"""A new table's key index built in a thread while its pages are placed, then moved into the
version that writes it.

The index (tag -> key) is a function of the records, their order and the table's capacity
(`KeyIndex.build`), all known before the first record is placed. Written with the version, it
came after the placement and the tree, on the one-process step of a chain import; built
beside them it takes a core that the placement's serial parts (the random walk, the tree's
hashing) leave idle, and its files are renamed into the version, not copied. The cost: the
index's build memory (some 90 bytes a record) is held during the placement, not after it.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numba

from morphogen.keyword.key_columns import KeyColumns
from morphogen.keyword.key_index import KeyIndex, slots_for


def _threads_share_numba() -> bool:
    """Whether two threads may run parallel kernels at once: not with numba's `workqueue`
    layer (which aborts the process when they do), nor before any layer was chosen."""
    try:
        return numba.threading_layer() != "workqueue"
    except ValueError:
        return False


class IndexAhead(Mapping[bytes, bytes]):
    """The index of `items` for a table of `capacity` slots, built into `folder` (on the
    filesystem of the version that will hold it) in a thread from now on where the kernels
    allow it, else when the version is written. As a mapping it is `items`."""

    def __init__(self, folder: str | os.PathLike[str], items: KeyColumns, capacity: int) -> None:
        self.folder, self.columns = Path(folder), items
        # what `versions._write_keys` gives the same records and capacity: the same files
        self.slots = slots_for(max(capacity, len(items)))
        self._future: Future[None] | None = None
        if _threads_share_numba():
            pool = ThreadPoolExecutor(1, thread_name_prefix="key-index")
            self._future = pool.submit(self._build, True)
            pool.shutdown(wait=False)

    def _build(self, beside: bool = False) -> None:
        if beside:
            # one core of numba's threads (a setting of this thread alone): the placement's
            # kernels keep every core, and this build fills what their serial parts leave
            numba.set_num_threads(1)
        shutil.rmtree(self.folder, ignore_errors=True)
        with KeyIndex.build(self.folder, self.columns, self.slots) as index:
            index.sync(durable=True)

    def _built(self) -> None:
        if self._future is None:
            self._build()
        else:
            self._future.result()

    def move_to(self, dst: str | os.PathLike[str]) -> None:
        """The built index as the new folder `dst` (renamed; copied across filesystems)."""
        self._built()
        try:
            os.replace(self.folder, dst)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            KeyIndex.copy(self.folder, dst)
            with KeyIndex(dst) as copy:
                copy.sync(durable=True)
            shutil.rmtree(self.folder, ignore_errors=True)

    def discard(self) -> None:
        """Once the thread (if any) is done, its folder removed: what a failed build calls,
        so that nothing writes where the caller cleans up."""
        if self._future is not None:
            try:
                self._future.result()
            except Exception:  # noqa: BLE001 - the caller is failing for its own reason
                pass
        shutil.rmtree(self.folder, ignore_errors=True)

    def __getitem__(self, tag: bytes) -> bytes:
        return self.columns[tag]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.columns)

    def __len__(self) -> int:
        return len(self.columns)
