"""Records -> a cuckoo table over pages, its hash tree and its signed descriptor.

Every record is placed in one of its three candidate buckets, with random-walk eviction when
all three are full. Nothing is ever dropped and there is no stash: a build that cannot place
every record draws new seeds, and after a few draws grows the table; a table of a fixed size
that cannot hold them is refused with its numbers.
"""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numba
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from morphogen.constants import PAGE_SIZE
from morphogen.keyword.descriptor import Anchor, Descriptor
from morphogen.keyword.hashing import candidates_many, pack_keys
from morphogen.keyword.key_columns import KeyColumns
from morphogen.keyword.layout import EMPTY_TAG, TAG_SIZE, Geometry, Layout
from morphogen.keyword.pages import tags_of
from morphogen.keyword.records import Record, RecordError, from_pairs
from morphogen.keyword.signing import DATASET_SIZE, public_bytes
from morphogen.keyword.tree import build as build_tree
from morphogen.keyword.tree import root_of

MAX_KICKS = 1000
SEED_DRAWS = 3  # per size, before growing
GROWTH = 1.08
DEFAULT_LOAD = {"page": 0.95, "row": 0.85}


class TableFullError(ValueError):
    """The records do not fit in a table of the size asked for."""


class Draws:
    """A build's random choices, in the order it makes them: the dataset id, then for each
    placement attempt its three seeds and its random walk's seed. From the OS by default; a
    build given `seed` makes the same choices each time, so that two builders of the same
    records (one process, or many on Ray: `morphogen.chain.bulk`) make the same table."""

    def __init__(self, seed: int | str | None = None) -> None:
        self._rng = None if seed is None else random.Random(seed)

    def bits(self, k: int) -> int:
        return secrets.randbits(k) if self._rng is None else self._rng.getrandbits(k)

    def token(self, n: int) -> bytes:
        return secrets.token_bytes(n) if self._rng is None else self._rng.randbytes(n)

    def seeds(self) -> tuple[int, int, int]:
        return (self.bits(64), self.bits(64), self.bits(64))


@dataclass
class BuildStats:
    records: int
    capacity: int
    load: float
    draws: int
    seconds: float
    attempts: list[dict] = field(default_factory=list)


@dataclass
class KeywordTable:
    """A built table: every page (the descriptor last), the descriptor, and the owner's index
    from tag to key (what eviction needs; it never leaves the owner)."""

    descriptor: Descriptor
    pages: np.ndarray
    keys: Mapping[bytes, bytes]
    stats: BuildStats | None = None


@numba.njit(cache=True)
def _place(cands, slots, occ, fill, max_kicks, rng_seed):
    # random-walk cuckoo insertion of the records in order over buckets of `slots` slots each;
    # returns the record left without a slot, or -1 when every record found one. The capacity
    # is one number, not an array of equal ones: reading it for each candidate cost a cache
    # miss of its own, and at 256 M records the placement ran 1.5x to 2x slower for it
    if slots <= 0:
        return 0 if cands.shape[0] else -1
    np.random.seed(rng_seed)
    for r in range(cands.shape[0]):
        cur = r
        last = -1
        placed = False
        for _ in range(max_kicks):
            best = -1
            best_free = 0
            for j in range(3):
                b = cands[cur, j]
                free = slots - fill[b]
                if free > best_free:
                    best = b
                    best_free = free
            if best >= 0:
                occ[best, fill[best]] = cur
                fill[best] += 1
                placed = True
                break
            # all three full: evict from one of them at random, not the one just left
            n_ok = 0
            for j in range(3):
                if cands[cur, j] != last:
                    n_ok += 1
            if n_ok == 0:  # its three candidates are that one bucket
                n_ok = 3
                last = -1
            pick = np.random.randint(n_ok)
            b = -1
            for j in range(3):
                c = cands[cur, j]
                if c != last:
                    if pick == 0:
                        b = c
                        break
                    pick -= 1
            s = np.random.randint(slots)
            victim = occ[b, s]
            occ[b, s] = cur
            cur = victim
            last = b
        if not placed:
            return cur
    return -1


@numba.njit(cache=True, parallel=True)
def _write_slots(pages, occ, fill, bucket_page, slot_off, tags, values):
    # buckets write disjoint bytes, so they are written on every core: each slot is a random
    # read of a record, the largest part of a big table's placement
    slot_size = tags.shape[1] + values.shape[1]
    for b in numba.prange(occ.shape[0]):
        p = bucket_page[b]
        for s in range(fill[b]):
            r = occ[b, s]
            off = slot_off[b] + s * slot_size
            pages[p, off:off + tags.shape[1]] = tags[r]
            pages[p, off + tags.shape[1]:off + slot_size] = values[r]


def _collect(records: Iterable[Record] | Iterable[tuple], value_size: int
             ) -> tuple[list[bytes], np.ndarray, list[str]]:
    keys: list[bytes] = []
    values = bytearray()
    wheres: list[str] = []
    for rec in records:
        if not isinstance(rec, Record):
            rec = next(from_pairs([rec]))._replace(where=f"record {len(keys)}")
        if len(rec.value) != value_size:
            raise RecordError(f"{rec.where}: value is {len(rec.value)} bytes; this table's "
                              f"values are {value_size} bytes")
        if not rec.key:
            raise RecordError(f"{rec.where}: empty key")
        keys.append(bytes(rec.key))
        values += rec.value
        wheres.append(rec.where)
    return keys, np.frombuffer(bytes(values), np.uint8).reshape(len(keys), value_size), wheres


def _refuse_duplicates(tags: np.ndarray, keys: list[bytes], wheres: list[str]) -> None:
    if len(keys) < 2:
        return
    view = np.ascontiguousarray(tags).view(np.dtype((np.void, TAG_SIZE))).reshape(-1)
    order = np.argsort(view, kind="stable")
    same = np.nonzero(view[order[1:]] == view[order[:-1]])[0]
    if len(same):
        a, b = int(order[same[0]]), int(order[same[0] + 1])
        what = "the same key" if keys[a] == keys[b] else "keys whose 128-bit tags collide"
        raise RecordError(f"{wheres[b]}: {what} as {wheres[a]} (key 0x{keys[b].hex()[:64]}); "
                          "every key appears once")
    if (view == np.void(EMPTY_TAG)).any():
        i = int(np.nonzero(view == np.void(EMPTY_TAG))[0][0])
        raise RecordError(f"{wheres[i]}: the key's tag is all zeros (the empty-slot marker)")


def _sizes(n: int, layout: Layout, value_size: int, row_size: int, load: float) -> int:
    probe = Geometry(layout, value_size, 1 << 20, row_size)
    per_bucket = probe.capacity / probe.num_buckets
    return max(1, int(np.ceil(n / (per_bucket * load))))


def build_table(
    records: Iterable[Record] | Iterable[tuple[bytes | str, bytes | str]],
    *,
    value_size: int,
    signing_key: Ed25519PrivateKey,
    layout: Layout = "page",
    row_size: int = 0,
    num_buckets: int | None = None,
    load: float | None = None,
    seeds: tuple[int, int, int] | None = None,
    dataset: bytes | None = None,
    version: int = 1,
    anchor: Anchor | None = None,
    name: str = "",
    draws: Draws | None = None,
    created: int | None = None,
) -> KeywordTable:
    """Place every record, hash the pages into the tree, sign the descriptor, and return the
    table.

    `num_buckets` fixes the size (TableFullError when the records do not fit); otherwise the
    size is chosen for `load` (default 0.95 of the slots for pages, 0.85 for rows) and grown
    when three seed draws cannot place every record. `seeds` fixes the seeds (tests).
    `version` numbers the table (a rebuild continues its predecessor's numbering, so that
    clients that read the old table accept the new); `anchor` names the block it reflects.
    `name` names it in a matrix of several (`join_tables`). `draws` makes its random choices
    (`Draws`) and `created` is its descriptor's time (now by default).
    """
    if version < 1:
        raise ValueError("a table's version is 1 or more")
    t0 = time.perf_counter()
    if layout == "row" and row_size == 0:
        raise ValueError("the row layout needs row_size (a divisor of 4096)")
    Geometry(layout, value_size, 1, row_size)  # checks the shape before reading any record
    keys, values, wheres = _collect(records, value_size)
    draws = draws or Draws()
    dataset = dataset or draws.token(DATASET_SIZE)
    tags = tags_of(dataset, keys)
    _refuse_duplicates(tags, keys, wheres)
    flat, offsets = pack_keys(keys)
    return place_table(
        keys, tags, values, lambda draw, buckets: candidates_many(flat, offsets, draw, buckets),
        dataset=dataset, value_size=value_size, signing_key=signing_key, layout=layout,
        row_size=row_size, num_buckets=num_buckets, load=load, seeds=seeds, draws=draws,
        numbering=(version, anchor, name), created=created, wheres=wheres, t0=t0)


def place_table(keys: Sequence[bytes] | np.ndarray, tags: np.ndarray, values: np.ndarray,
                candidates: Callable[[tuple[int, int, int], int], np.ndarray], *,
                dataset: bytes, value_size: int, signing_key: Ed25519PrivateKey,
                layout: Layout = "page", row_size: int = 0, num_buckets: int | None = None,
                load: float | None = None, seeds: tuple[int, int, int] | None = None,
                draws: Draws, numbering: tuple, created: int | None = None,
                wheres: Sequence[str] | None = None, t0: float | None = None,
                out: np.ndarray | None = None) -> KeywordTable:
    """Place records already checked (distinct keys and tags, values of `value_size`), in the
    order given, and finish the table: the placement half of `build_table`, which a builder
    that encoded and hashed the records elsewhere calls with the same draws to get the same
    table. `keys` are bytes, or keys of one width as the rows of a 2-D byte array;
    `candidates(seeds, num_buckets)` gives every record's three buckets. `out` (zeros, the
    table's pages: its size fixed by `num_buckets`) receives the pages, so that tables
    joined later are built in place (`join_tables`) rather than copied."""
    t0 = time.perf_counter() if t0 is None else t0
    n = len(keys)
    fixed = num_buckets is not None
    buckets = num_buckets or _sizes(n, layout, value_size, row_size, load or DEFAULT_LOAD[layout])
    attempts: list[dict] = []
    while True:
        geometry = Geometry(layout, value_size, buckets, row_size)
        if n > geometry.capacity:
            failed_at = None
        else:
            slots = geometry.slots_per_bucket
            failed_at = None
            for _ in range(1 if seeds else SEED_DRAWS):
                draw = seeds or draws.seeds()
                cands = candidates(draw, buckets)
                occ = np.full((buckets, slots), -1, np.int64)
                fill = np.zeros(buckets, np.int32)
                left = _place(cands, slots, occ, fill, MAX_KICKS, draws.bits(31))
                attempts.append({"num_buckets": buckets, "placed": bool(left < 0)})
                if left < 0:
                    return _finish(geometry, draw, dataset, keys, tags, values, occ, fill,
                                   signing_key, attempts, t0, numbering, created, out)
                failed_at = wheres[int(left)] if wheres is not None else f"record {left}"
        if fixed:
            raise TableFullError(
                f"{n} records do not fit in {buckets} buckets ({geometry.capacity} slots, "
                f"{n / max(geometry.capacity, 1):.1%} full"
                + (f"; the first unplaced was {failed_at}" if failed_at else "")
                + f"): rebuild with more buckets, e.g. num_buckets="
                f"{_sizes(n, layout, value_size, row_size, DEFAULT_LOAD[layout])}")
        buckets = int(buckets * GROWTH) + 1


def _finish(geometry, seeds, dataset, keys, tags, values, occ, fill, signing_key, attempts, t0,
            numbering, created=None, out=None):
    pages = np.zeros((geometry.num_pages, PAGE_SIZE), np.uint8) if out is None else out
    if pages.shape != (geometry.num_pages, PAGE_SIZE):
        raise ValueError(f"the table takes {geometry.num_pages} pages, not {len(pages)}")
    bucket_ids = np.arange(geometry.num_buckets, dtype=np.int64)
    bucket_page = bucket_ids // geometry.rows_per_page
    if geometry.layout == "page":
        slot_off = np.zeros(geometry.num_buckets, np.int64)
    else:
        slot_off = (bucket_ids % geometry.rows_per_page) * geometry.row_size
    _write_slots(pages, occ, fill, bucket_page, slot_off, tags, values)
    levels = build_tree(pages[:geometry.data_pages])
    for k, level in enumerate(levels, 1):
        first = geometry.level_first(k)
        pages[first:first + len(level)] = level
    version, anchor, name = numbering
    desc = Descriptor(dataset, version, geometry, tuple(int(s) for s in seeds),
                      public_bytes(signing_key.public_key()), root_of(levels[-1][0]), len(keys),
                      int(time.time()) if created is None else created, anchor, name)
    pages[geometry.descriptor_page] = np.frombuffer(desc.to_page(signing_key), np.uint8)
    stats = BuildStats(len(keys), geometry.capacity, len(keys) / geometry.capacity,
                       len(attempts), time.perf_counter() - t0, attempts)
    return KeywordTable(desc, pages, KeyColumns.of(tags, keys), stats)


def join_tables(tables: Sequence[KeywordTable]) -> KeywordTable:
    """One matrix holding `tables` back to back (`morphogen.keyword.descriptor.parts_of`),
    each built with a name of its own, one owner key and one version: what one publication
    changes together. The joined table's descriptor is the first's (the owner directory
    names its dataset)."""
    if not tables:
        raise ValueError("join at least one table")
    names = [t.descriptor.name for t in tables]
    if len(tables) > 1 and (not all(names) or len(set(names)) != len(names)):
        raise ValueError("joined tables each need a name of their own (build_table(name=..))")
    if len({(t.descriptor.public_key, t.descriptor.version) for t in tables}) != 1:
        raise ValueError("joined tables share one owner key and one version")
    if len({t.descriptor.dataset for t in tables}) != len(tables):
        raise ValueError("two joined tables share a dataset id")  # tags would collide
    keys = KeyColumns.concat([t.keys if isinstance(t.keys, KeyColumns) else
                              KeyColumns.of(np.frombuffer(b"".join(t.keys), np.uint8),
                                            list(t.keys.values())) for t in tables])
    pages = _back_to_back([t.pages for t in tables])
    return KeywordTable(tables[0].descriptor,
                        np.concatenate([t.pages for t in tables]) if pages is None else pages,
                        keys)


def _back_to_back(arrays: Sequence[np.ndarray]) -> np.ndarray | None:
    """The array that `arrays` are consecutive slices of, whole and in order (tables built in
    place with `place_table(out=...)`), else None."""
    base = arrays[0].base
    if base is None or base.ndim != 2 or any(a.base is not base for a in arrays):
        return None
    start = at = base.__array_interface__["data"][0]
    for a in arrays:
        if a.__array_interface__["data"][0] != at or not a.flags.c_contiguous:
            return None
        at += a.nbytes
    return base if at == start + base.nbytes and base.flags.c_contiguous else None
