"""The owner's tag -> key index as files, not objects: what eviction needs (a displaced record's
key, to find its other buckets) and what a follower asks (whether a table holds a key), held
in the kernel's page cache instead of the process.

A dict of bytes costs some 150 bytes a record in the process: at mainnet's two billion records
the index alone would outgrow the machine, and it grew with the table while everything else a
block costs stayed flat. Here a record costs one 24-byte slot and its key's bytes, on disk.

Layout of an index folder:

- ``slots.bin``: an open-addressing hash table of 24-byte slots, linear probing from the tag's
  first eight bytes (tags are uniform hashes); a slot is the 16-byte tag, then a little-endian
  u64 ``(heap offset + 1) << 16 | key length``; zero is an empty slot. Deletion shifts the
  probe run back, so there are no tombstones and probes stay short at a steady load.
- ``heap.bin``: the keys' bytes, appended. A key rewritten with the same bytes (every block's
  storage writes) appends nothing; a deleted key's bytes stay until the index is rebuilt.
- ``index.json``: the slot count, the record count and the heap's length, written last.

An index is sized once for its tables' capacity (`slots_for`), at most `MAX_LOAD` full; it
doubles if ever asked for more. Its files are either a version's (written whole in a
temporary folder and renamed into place with it) or the follower's working copy (changed in
place and rebuilt whenever its record is not clean; `morphogen.keyword.working`).
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
from collections.abc import Iterable, Iterator, MutableMapping
from pathlib import Path

import numba
import numpy as np

from morphogen.keyword import radix
from morphogen.keyword.key_columns import KeyColumns
from morphogen.keyword.layout import TAG_SIZE
from morphogen.keyword.records import RecordError
from morphogen.storage import advice
from morphogen.storage.mapped import new_mapped, reserve

SLOTS, HEAP, META = "slots.bin", "heap.bin", "index.json"
SLOT = TAG_SIZE + 8
MAX_KEY = 0xFFFF
LOAD = 0.7       # the slot count asked for a capacity: probes stay a handful long
MAX_LOAD = 0.9   # past this an insert doubles the slots
_MIN_SLOTS = 64
_SLOT_DTYPE = np.dtype([("tag", f"V{TAG_SIZE}"), ("ref", "<u8")])


def slots_for(records: int) -> int:
    """Slots for an index that will hold at most `records` records."""
    return max(_MIN_SLOTS, int(records / LOAD) + 1)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class KeyIndex(MutableMapping[bytes, bytes]):
    """tag -> key over the files of one index folder. One writer; not for concurrent use."""

    def __init__(self, folder: str | os.PathLike[str], *, writable: bool = True) -> None:
        self.folder = Path(folder)
        meta = json.loads((self.folder / META).read_text())
        self._n, self._count, self._heap_end = int(meta["slots"]), int(meta["count"]), \
            int(meta["heap"])
        self._writable = writable
        mode = os.O_RDWR if writable else os.O_RDONLY
        self._slots_fd = os.open(self.folder / SLOTS, mode)
        self._heap_fd = os.open(self.folder / HEAP, mode)
        if os.fstat(self._slots_fd).st_size != self._n * SLOT:
            self.close()
            raise ValueError(f"{self.folder / SLOTS} does not hold {self._n} slots")
        self._mm = mmap.mmap(self._slots_fd, self._n * SLOT,
                             access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)

    # -- made and copied ------------------------------------------------------------------

    @classmethod
    def create(cls, folder: str | os.PathLike[str], slots: int) -> KeyIndex:
        """An empty index of `slots` slots in `folder` (made; replaced if it holds one)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / SLOTS).open("wb") as f:
            f.truncate(slots * SLOT)  # sparse: empty slots cost no disk until written
        (folder / HEAP).write_bytes(b"")
        _write_meta(folder, slots, 0, 0)
        return cls(folder)

    @classmethod
    def build(cls, folder: str | os.PathLike[str],
              items: KeyColumns | Iterable[tuple[bytes, bytes]], slots: int) -> KeyIndex:
        """A new index of `items` at `folder` (made; replaced if it holds one), at least
        `slots` slots. Placed in one pass over arrays, not key by key: the records in order
        of home slot (then tag) take what linear probing gives that order, so where a record
        sits is a function of the records alone. The heap holds the keys in the order given
        (gathering them in slot order would cost a random read a record, the largest part of
        a chain import's one-process step), so the files are a function of the records and
        that order: a build gives them in its table's order."""
        if not isinstance(items, KeyColumns):
            pairs = list(items)
            if any(len(t) != TAG_SIZE for t, _ in pairs):
                raise ValueError(f"a tag is {TAG_SIZE} bytes")
            items = KeyColumns.of(np.frombuffer(b"".join(t for t, _ in pairs), np.uint8),
                                  [k for _, k in pairs])
        m = len(items)
        while m > MAX_LOAD * slots:
            slots *= 2
        words = items.tags.view("<u8").reshape(m, 2)
        homes = words[:, 0] % np.uint64(slots)
        order, tied = _by_home_then_tag(words, homes, slots)
        _refuse_alike(items, words, order, tied)
        at = _positions(homes, order)
        del homes  # a build holds a table's records: its temporaries go as soon as they can
        lengths = items.lengths
        if m and int(lengths.max()) > MAX_KEY:
            raise ValueError(f"a key is bytes of at most {MAX_KEY}")
        refs = items.offsets[:-1] + 1
        refs <<= 16
        refs |= lengths
        heap = int(lengths.sum())
        del lengths
        refs = refs.view("<u8")  # offsets and lengths are not negative
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        # the slots placed straight into the file's pages, which start as zeros (empty): a
        # table built in memory and then written cost a second pass over its bytes
        table = new_mapped(folder / SLOTS, _SLOT_DTYPE, (slots,))
        _fill(table.view(np.uint8).reshape(slots, SLOT), np.ascontiguousarray(items.tags),
              refs.view(np.uint8).reshape(m, 8), order, at)
        free = 0
        for k in np.flatnonzero(at >= slots).tolist():
            # past the last slot: on from the first, to the first empty slot
            while table["ref"][free]:
                free += 1
            i = int(order[k])
            table[free] = (items.tags[i].tobytes(), int(refs[i]))
        table.flush()
        del table
        items.write(folder / HEAP)
        _write_meta(folder, slots, m, heap)
        return cls(folder)

    @staticmethod
    def copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        """The closed (synced) index at `src` copied to a new folder `dst`; streamed, never
        in memory whole. The heap's bytes past its recorded end (a crash's) are left out."""
        src, dst = Path(src), Path(dst)
        dst.mkdir(parents=True)
        meta = json.loads((src / META).read_text())
        shutil.copyfile(src / SLOTS, dst / SLOTS)
        shutil.copyfile(src / HEAP, dst / HEAP)
        os.truncate(dst / HEAP, int(meta["heap"]))
        (dst / META).write_text(json.dumps(meta))

    def sync(self, *, durable: bool = False) -> None:
        """Record the count and the heap's end; `durable`: on disk when it returns (a
        version's copy), else in the page cache (the working copy, whose record says whether
        a crash left it whole)."""
        if durable:
            self._mm.flush()
            os.fsync(self._slots_fd)  # pages written by a copy, not through the mapping
            os.fsync(self._heap_fd)
        _write_meta(self.folder, self._n, self._count, self._heap_end, durable=durable)

    def close(self) -> None:
        if getattr(self, "_mm", None) is not None:
            self._mm.close()
            self._mm = None  # type: ignore[assignment]
        for name in ("_slots_fd", "_heap_fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

    def __enter__(self) -> KeyIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the mapping ----------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def __contains__(self, tag: object) -> bool:
        return isinstance(tag, bytes) and len(tag) == TAG_SIZE and self._find(tag)[1]

    def __getitem__(self, tag: bytes) -> bytes:
        i, found = self._find(_tag(tag))
        if not found:
            raise KeyError(tag)
        return self._key(self._ref(i))

    def __setitem__(self, tag: bytes, key: bytes) -> None:
        tag = _tag(tag)
        if not isinstance(key, bytes | bytearray) or len(key) > MAX_KEY:
            raise ValueError(f"a key is bytes of at most {MAX_KEY}")
        i, found = self._find(tag)
        if found:
            if self._key(self._ref(i)) == key:
                return
        elif self._count + 1 > MAX_LOAD * self._n:
            self._resize(2 * self._n)
            i, _ = self._find(tag)
        ref = self._append(bytes(key))
        at = i * SLOT
        if not found:
            self._mm[at:at + TAG_SIZE] = tag
            self._count += 1
        self._mm[at + TAG_SIZE:at + SLOT] = ref.to_bytes(8, "little")

    def __delitem__(self, tag: bytes) -> None:
        i, found = self._find(_tag(tag))
        if not found:
            raise KeyError(tag)
        n, mm = self._n, self._mm
        j = i
        while True:  # shift the rest of the probe run back over the hole
            j = (j + 1) % n
            if self._ref(j) == 0:
                break
            home = self._home(mm[j * SLOT:j * SLOT + TAG_SIZE])
            # the record at j may move to the hole at i unless its home lies in (i, j]
            if (i < home <= j) if i <= j else (home > i or home <= j):
                continue
            mm[i * SLOT:(i + 1) * SLOT] = mm[j * SLOT:(j + 1) * SLOT]
            i = j
        mm[i * SLOT:(i + 1) * SLOT] = bytes(SLOT)
        self._count -= 1

    def __iter__(self) -> Iterator[bytes]:
        for tags, _refs in self._live():
            yield from (bytes(t) for t in tags)

    def items(self) -> Iterator[tuple[bytes, bytes]]:  # type: ignore[override]
        for tags, refs in self._live():
            for t, r in zip(tags, refs.tolist(), strict=True):
                yield bytes(t), self._key(r)

    # -- inside ---------------------------------------------------------------------------

    def _home(self, tag: bytes) -> int:
        return int.from_bytes(tag[:8], "little") % self._n

    def _ref(self, i: int) -> int:
        at = i * SLOT + TAG_SIZE
        return int.from_bytes(self._mm[at:at + 8], "little")

    def _find(self, tag: bytes) -> tuple[int, bool]:
        """(slot, whether it holds `tag`): its slot, or the empty one that ends its run."""
        mm, n = self._mm, self._n
        i = self._home(tag)
        while True:
            at = i * SLOT
            if mm[at + TAG_SIZE:at + SLOT] == b"\0" * 8:
                return i, False
            if mm[at:at + TAG_SIZE] == tag:
                return i, True
            i = (i + 1) % n

    def read_ahead(self, tags: np.ndarray) -> bool:
        """Ask the kernel to read in the pages where lookups of `tags` (rows of 16 bytes)
        start, their home slots' (`morphogen.storage.advice`): on a cold cache, the reads of
        a block's lookups queued at once. False where the kernel refuses the advice."""
        homes = _words(tags)[:, 0] % np.uint64(self._n)
        first = homes.astype(np.int64) * SLOT
        page = mmap.PAGESIZE
        # a probe run is a slot or two: the page after a home's is read when the run crosses
        which = np.unique(np.concatenate([first // page, (first + 2 * SLOT - 1) // page]))
        which = which[which * page < self._n * SLOT]
        view = np.frombuffer(self._mm, np.uint8)
        try:
            return advice.advise(view.ctypes.data, which, advice.WILLNEED, page=page)
        finally:
            del view  # the mapping may be closed (or resized) once this returns

    def touch(self, tags: np.ndarray) -> int:
        """Read the slots that finding each of `tags` (rows of 16 bytes) reads, each tag's
        home to its slot or the empty slot that ends its run: their pages read in and mapped
        ahead of the lookups (`morphogen.keyword.prefetch`), in a kernel that does not hold
        the interpreter's lock. Writes nothing; returns how many tags the index holds. Like
        every other call, not while another thread uses this index."""
        words = _words(tags)
        slots = np.frombuffer(self._mm, "<u8", count=3 * self._n).reshape(self._n, 3)
        try:
            return int(_touch(slots, words))
        finally:
            del slots  # the mapping may be closed (or resized) once this returns

    def _key(self, ref: int) -> bytes:
        length, offset = ref & MAX_KEY, (ref >> 16) - 1
        return os.pread(self._heap_fd, length, offset) if length else b""

    def _append(self, key: bytes) -> int:
        if not self._writable:
            raise PermissionError(f"{self.folder} is open read-only")
        offset = self._heap_end
        if key:
            os.pwrite(self._heap_fd, key, offset)
        self._heap_end += len(key)
        return (offset + 1) << 16 | len(key)

    def _live(self, chunk: int = 1 << 20) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(tags, refs) of the occupied slots, a chunk of slots at a time."""
        slots = np.frombuffer(self._mm, _SLOT_DTYPE, count=self._n)
        for start in range(0, self._n, chunk):
            part = slots[start:start + chunk]
            live = part["ref"] != 0
            yield part["tag"][live], part["ref"][live]

    def _resize(self, slots: int) -> None:
        """Every record moved to a table of `slots` slots (the heap stays as it is)."""
        moved = [(bytes(t), int(r)) for tags, refs in self._live()
                 for t, r in zip(tags, refs.tolist(), strict=True)]
        self._mm.close()
        os.ftruncate(self._slots_fd, 0)
        # the room taken now: written through the mapping, a full disk would be a SIGBUS
        reserve(self._slots_fd, slots * SLOT, self.folder / SLOTS)
        self._n = slots
        self._mm = mmap.mmap(self._slots_fd, slots * SLOT, access=mmap.ACCESS_WRITE)
        for tag, ref in moved:
            i, _ = self._find(tag)
            self._mm[i * SLOT:(i + 1) * SLOT] = tag + ref.to_bytes(8, "little")


@numba.njit(cache=True, nogil=True)
def _touch(slots, tags):
    """`KeyIndex._find` of every tag over the slots as (tag word, tag word, ref) rows, for
    the pages it reads; the count found (a result, so that the reads are not dropped)."""
    n = slots.shape[0]
    found = 0
    for i in range(tags.shape[0]):
        j = tags[i, 0] % np.uint64(n)
        while slots[j, 2] != 0:
            if slots[j, 0] == tags[i, 0] and slots[j, 1] == tags[i, 1]:
                found += 1
                break
            j = (j + np.uint64(1)) % np.uint64(n)
    return found


def _words(tags: np.ndarray) -> np.ndarray:
    # a copy (writable, of the type `warm` loads the kernel for), however `tags` came
    return np.array(tags, np.uint8, order="C").view("<u8").reshape(-1, 2)


def warm() -> None:
    """Load (or compile) `touch`'s kernel now: a follower calls it as it starts."""
    _touch(np.zeros((1, 3), np.uint64), np.zeros((1, 2), np.uint64))


@numba.njit(cache=True)
def _positions(homes, order):
    """Where linear probing puts the records taken in `order`: each at its home or just past
    the one before it, whichever is further (the slot count not applied: past the end is the
    caller's)."""
    at = np.empty(len(order), np.int64)
    prev = np.int64(-1)
    for k in range(len(order)):
        pos = np.int64(homes[order[k]])
        if prev + 1 > pos:  # prev starts at -1: the first record sits at its home
            pos = prev + 1
        at[k] = pos
        prev = pos
    return at


@numba.njit(cache=True, parallel=True)
def _fill(table, tags, refs, order, at):
    """Record order[k] into slot at[k], where that is inside the table (each slot once)."""
    slots = table.shape[0]
    for k in numba.prange(len(order)):
        pos = at[k]
        if pos < slots:
            i = order[k]
            table[pos, :TAG_SIZE] = tags[i]
            table[pos, TAG_SIZE:] = refs[i]


def _by_home_then_tag(words: np.ndarray, homes: np.ndarray, slots: int
                      ) -> tuple[np.ndarray, bool]:
    """The order of the records by home slot, then by tag, and whether two records tied in
    the one sort of a 64-bit key (the home in the high bits, the tag's first bits below
    it) that gives it. Where they tie (tags alike in those bits: rare), the sort by all
    three."""
    bits = max(1, int(slots - 1).bit_length())
    shift = np.uint64(64 - bits)
    packed = words[:, 0] >> np.uint64(bits)
    packed |= homes << shift
    order, ranked = radix.argsort(packed)
    if len(ranked) > 1 and bool((ranked[1:] == ranked[:-1]).any()):
        return np.lexsort((words[:, 1], words[:, 0], homes)), True
    return order, False


def _refuse_alike(items: KeyColumns, words: np.ndarray, order: np.ndarray, tied: bool) -> None:
    """A tag is a record's name in the index: two records of one tag, or one with the tag
    of an empty slot (zeros), would each read as the other, or as nothing. Found from the
    build's own order: equal tags are neighbours in it (they tie in its sort, which then
    sorted by whole tags), and a zero tag, whose home and bits are zeros, comes first."""
    if len(order) and not words[order[0]].any():
        raise RecordError(f"key 0x{items.key(int(order[0])).hex()[:64]}: its tag is all "
                          "zeros (the empty-slot marker)")
    if tied:
        ranked = words[order]
        same = np.flatnonzero((ranked[1:] == ranked[:-1]).all(axis=1))
        if len(same):
            a, b = (items.key(int(order[i])) for i in (same[0], same[0] + 1))
            what = "the same key twice" if a == b else "keys whose 128-bit tags collide"
            raise RecordError(f"{what}: 0x{a.hex()[:64]} and 0x{b.hex()[:64]}; every key "
                              "appears once")


def _tag(tag: bytes) -> bytes:
    if not isinstance(tag, bytes | bytearray) or len(tag) != TAG_SIZE:
        raise KeyError(tag)
    return bytes(tag)


def _write_meta(folder: Path, slots: int, count: int, heap: int, *, durable: bool = False) -> None:
    path = folder / META
    tmp = folder / f".{META}.tmp"
    tmp.write_text(json.dumps({"slots": slots, "count": count, "heap": heap}))
    if durable:
        _fsync(tmp)
    os.replace(tmp, path)
    if durable:
        _fsync(folder)
