"""The epoch log's records as write-once objects (S3 ``If-None-Match: *``, GCS
``ifGenerationMatch=0``): a party's log with no shared file system.

Keys under the log's prefix::

    log.json                        the marker, created once (create-only)
    records/g000000/000000000000    record 0, the frame bytes of the directory backend
    records/g000000/000000000001    record 1 ...
    records/g000000/000000000007    a seal: the compacted records generation 1 starts with
    records/g000001/000000000003    the next record after them (its seq follows the seal's)
    blobs/updates-...bin        update batches, written before the record that names them

The sequence number is the lock. Every writer reads the records, decides its step on that
state and creates the object of the next sequence number; of two writers only one can create
it, the other gets `RaceLost`, reads again and decides again on the new state: exactly what
the directory backend's flock gives, with the object store as the arbiter. A compaction is one
more such record, the seal, holding the whole compacted state: once it exists nobody can
append to its generation, and the next record goes to the next generation. Generations
before the sealed one are deleted afterwards; a reader that loses an object to that deletion
reads again. Records are immutable, so what was read is kept and only new keys are fetched.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from morphogen.storage.location import Location, open_location

SEAL_MAGIC = b"MGLSEAL1"


class RaceLost(Exception):
    """Another writer created the record this one wanted: read again and decide again."""


class Vanished(Exception):
    """An object listed a moment ago is gone (a compaction deleted an old generation)."""


RECORDS = "records"
# Records fetched at once by a reader that has not seen them (a router or replica starting):
# each GET is a round trip, so a generation of a few hundred records costs a few of them.
PARALLEL_GETS = 32


def _record_key(gen: int, seq: int) -> str:
    return f"{RECORDS}/g{gen:06d}/{seq:012d}"


def _parse(name: str) -> tuple[int, int] | None:
    top, _, rest = name.partition("/")
    if top != RECORDS:
        return None
    gen, _, seq = rest.partition("/")
    if len(gen) == 7 and gen[0] == "g" and gen[1:].isdigit() and len(seq) == 12 \
            and seq.isdigit():
        return int(gen[1:]), int(seq)
    return None


class LogObjects:
    """One log's objects under a URI prefix."""

    def __init__(self, uri: str) -> None:
        import obstore  # here, not at import: the engines' machines may lack it

        self._ob: Any = obstore
        self.location: Location = open_location(uri)
        self.uri = self.location.uri
        self._cache: dict[str, bytes] = {}
        # the record names listed so far: keys only ever grow (zero-padded generation, then
        # seq), so each listing asks only for the keys after the last one known (S3
        # start-after), whatever the log's length
        self._known: list[tuple[int, int, str]] = []
        self._mutex = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def _key(self, name: str) -> str:
        return self.location.key(name)

    # -- single objects
    def get(self, name: str) -> bytes:
        """The object's bytes; FileNotFoundError when absent."""
        return bytes(self._ob.get(self.location.store, self._key(name)).bytes())

    def create(self, name: str, data: bytes) -> bool:
        """Create `name` holding `data` unless it exists; whether this call created it."""
        from obstore.exceptions import AlreadyExistsError

        try:
            self._ob.put(self.location.store, self._key(name), data, mode="create")
        except AlreadyExistsError:
            return False
        return True

    def exists(self, name: str) -> bool:
        try:
            self._ob.head(self.location.store, self._key(name))
        except FileNotFoundError:
            return False
        return True

    def put(self, name: str, data: bytes) -> None:
        self._ob.put(self.location.store, self._key(name), data)

    def delete(self, names: list[str]) -> None:
        for name in names:
            try:
                self._ob.delete(self.location.store, self._key(name))
            except FileNotFoundError:
                pass

    def names_under(self, folder: str) -> list[str]:
        """The names of the objects in `folder` (relative to the log's prefix)."""
        prefix = self._key(folder)
        skip = len(self.location.prefix) + 1 if self.location.prefix else 0
        return [meta["path"][skip:] for meta in
                self._ob.list(self.location.store, prefix=prefix).collect()]

    # -- records
    def _names(self, everything: bool = False) -> list[tuple[int, int, str]]:
        """(generation, seq, name) of the records of the last two generations, in order (or
        of every generation, listed afresh: what a compaction deletes)."""
        with self._mutex:
            known = [] if everything else list(self._known)
        prefix = self._key(RECORDS)  # a path prefix: obstore lists whole segments
        offset = self._key(known[-1][2]) if known else None
        skip = len(self.location.prefix) + 1 if self.location.prefix else 0
        listed = []
        for meta in self._ob.list(self.location.store, prefix=prefix, offset=offset).collect():
            parsed = _parse(meta["path"][skip:])
            if parsed is not None:
                listed.append((*parsed, meta["path"][skip:]))
        if everything:
            return sorted(listed)
        with self._mutex:
            merged = sorted(set(self._known) | set(listed))
            if merged:
                # readers look at the last generation and the seal of the one before; older
                # ones are deleted by compactions, and a name kept of a deleted record is
                # never read (see `_read_once`)
                last = merged[-1][0]
                merged = [n for n in merged if n[0] >= last - 1]
                gone = {n for n in self._known if n[0] < last - 1}
                for _, _, name in gone:  # the cache would otherwise grow with the log's age
                    self._cache.pop(name, None)
            self._known = merged
            return list(merged)

    def _read(self, name: str) -> bytes:
        with self._mutex:
            hit = self._cache.get(name)
        if hit is not None:
            return hit
        try:
            data = self.get(name)
        except FileNotFoundError:
            raise Vanished(name) from None
        with self._mutex:
            self._cache[name] = data
        return data

    def _prefetch(self, names: list[str]) -> None:
        """Fetch into the cache, at once, those of `names` not read yet (one that vanished
        meanwhile is left for `_read` to report)."""
        with self._mutex:
            missing = [n for n in names if n not in self._cache]
            if len(missing) > 1 and self._pool is None:
                self._pool = ThreadPoolExecutor(PARALLEL_GETS, thread_name_prefix="log-get")
            pool = self._pool
        if len(missing) <= 1 or pool is None:
            return

        def fetch(name: str) -> None:
            try:
                data = self.get(name)
            except FileNotFoundError:
                return
            with self._mutex:
                self._cache[name] = data

        list(pool.map(fetch, missing))

    def read(self) -> tuple[bytes, int]:
        """(the frames of the live generation, base records first; that generation), where
        the next record goes. Reads again when a compaction deletes what it was reading."""
        for _ in range(20):
            try:
                return self._read_once()
            except Vanished:
                continue
        raise RuntimeError(f"{self.uri}: the log kept changing under 20 reads in a row")

    def _read_once(self) -> tuple[bytes, int]:
        names = self._names()
        if not names:
            return b"", 0
        last = max(g for g, _, _ in names)
        own = [(s, n) for g, s, n in names if g == last]
        tail = self._read(own[-1][1])
        if tail.startswith(SEAL_MAGIC):  # sealed: the seal holds the whole state
            return tail[len(SEAL_MAGIC):], last + 1
        prior = [n for g, _, n in names if g == last - 1][-1:]
        self._prefetch(prior + [n for _, n in own])
        parts: list[bytes] = []
        if last > 0:
            prior = [(s, n) for g, s, n in names if g == last - 1]
            if not prior:
                raise Vanished(f"{RECORDS}/g{last - 1:06d}")
            seal = self._read(prior[-1][1])
            if not seal.startswith(SEAL_MAGIC):
                raise ValueError(f"{self.uri}: generation {last - 1} ends without a seal "
                                 "(corrupt log)")
            parts.append(seal[len(SEAL_MAGIC):])
        for i, (_seq, name) in enumerate(own):
            data = self._read(name)
            if data.startswith(SEAL_MAGIC):
                if i != len(own) - 1:
                    raise ValueError(f"{self.uri}: records after the seal {name} (corrupt log)")
                return data[len(SEAL_MAGIC):], last + 1
            parts.append(data)
        return b"".join(parts), last

    def append(self, gen: int, seq: int, frame: bytes) -> None:
        """Create record `seq` of generation `gen`; RaceLost unless it is where readers look.

        A writer that read long ago (a stalled process) may create its seq in a generation
        that compactions have since sealed and deleted: the key is free again, the create
        succeeds, and no reader ever reads that generation. So the create counts only when,
        listed afterwards, `gen` is the live generation, or the one just sealed by a seal
        after `seq` (the sealer read this record). Further back the record may be an orphan:
        RaceLost, and the caller reads again and decides again (its steps are idempotent).
        """
        key = _record_key(gen, seq)
        if not self.create(key, frame):
            raise RaceLost(key)
        with self._mutex:
            self._cache[key] = frame
        names = self._names()
        last = max(g for g, _, _ in names)
        if last == gen:
            return
        if last == gen + 1:
            own = [(s, n) for g, s, n in names if g == gen]
            if own and own[-1][0] > seq and self._read(own[-1][1]).startswith(SEAL_MAGIC):
                return
        raise RaceLost(key)

    def seal(self, gen: int, seq: int, frames: bytes) -> None:
        """End generation `gen` with the compacted records the next one starts from."""
        self.append(gen, seq, SEAL_MAGIC + frames)

    def drop_generations_before(self, gen: int) -> int:
        """Delete the records of generations before `gen` (sealed and replaced)."""
        old = [n for g, _, n in self._names(everything=True) if g < gen]
        self.delete(old)
        with self._mutex:
            for n in old:
                self._cache.pop(n, None)
        return len(old)

