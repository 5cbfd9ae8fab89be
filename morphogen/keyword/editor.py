"""Changes to a keyword table (`Change`, and `read_changes` of a changes file) and the edits
that make them on its pages in memory: the cuckoo placement an
owner's version is made of (`OwnerTable.apply`). Each change finds its key's slot among its
three candidate buckets; an insert with no free slot evicts along a chain of at most
MAX_KICKS moves. Every page written is recorded as dirty, so the version's batch (with the tree
paths above them and the descriptor) holds the whole chain: no reader sees it half done.
"""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.keyword.build import MAX_KICKS, TableFullError
from morphogen.keyword.descriptor import Descriptor
from morphogen.keyword.hashing import candidates, candidates_many, pack_keys
from morphogen.keyword.layout import EMPTY_TAG, TAG_SIZE
from morphogen.keyword.pages import free_slot, slot_of, tag_of
from morphogen.keyword.records import RecordError, decode_field, json_lines


@dataclass(frozen=True)
class Change:
    """`put` inserts or changes a key's value; `delete` removes the key (`delete_absent`
    does, and is nothing when the table lacks the key: what a follower that knows only
    "this key is empty now" sends). `table` names the keyword table of a matrix of several
    (`parts_of`); "" is the matrix's only one."""

    op: str
    key: bytes
    value: bytes = b""
    where: str = ""
    table: str = ""


def read_changes(path: str | os.PathLike[str]) -> list[Change]:
    """JSON lines: ``{"op": "put", "key": .., "value": ..}`` or ``{"op": "delete", "key": ..}``
    (keys and values as in records files: 0x-hex or text)."""
    out = []
    for where, obj in json_lines(Path(path)):
        op = obj.get("op") if isinstance(obj, dict) else None
        if op not in ("put", "delete") or "key" not in obj or (op == "put"
                                                               and "value" not in obj):
            raise RecordError(f'{where}: expected {{"op": "put", "key": .., "value": ..}} '
                              f'or {{"op": "delete", "key": ..}}')
        out.append(Change(op, decode_field(obj["key"], where, "key"),
                          decode_field(obj.get("value", ""), where, "value"), where))
    return out


class Befores:
    """The pages an apply rewrites, as they were before it: copied into one buffer that the
    next apply reuses, so a block's batch (each page XORed with what it was) costs one copy a
    page and no allocation once the buffer has grown to a block's size."""

    def __init__(self, width: int = PAGE_SIZE) -> None:
        self.rows = np.empty((0, width), np.uint8)
        self.count = 0

    def clear(self) -> None:
        self.count = 0

    def keep(self, pages: np.ndarray) -> int:
        """Copy `pages` (rows) in; returns the row the first went to."""
        first = self._room(len(pages))
        self.rows[first:self.count] = pages
        return first

    def keep_row(self, page: np.ndarray) -> int:
        """Copy one page in (an editor's first write to it); returns its row."""
        first = self._room(1)
        self.rows[first] = page
        return first

    def reserve(self, rows: int) -> None:
        """Room for `rows` pages, every byte of it written once now: an apply that keeps
        that many then copies into memory already mapped. A follower's prefetch calls it
        with the pages the coming block writes, so that the first block, or one larger
        than any before, does not take a fresh buffer's page faults on its path (some
        16 MiB for a block of 3,000 records). Not while an apply uses the buffer."""
        if rows <= len(self.rows):
            return
        grown = np.empty((rows, self.rows.shape[1]), np.uint8)
        grown[:self.count] = self.rows[:self.count]
        grown[self.count:] = 0
        self.rows = grown

    def _room(self, more: int) -> int:
        need = self.count + more
        if need > len(self.rows):
            grown = np.empty((max(need, 2 * len(self.rows), 1024), self.rows.shape[1]),
                             np.uint8)
            grown[:self.count] = self.rows[:self.count]
            self.rows = grown
        first, self.count = self.count, need
        return first


class Editor:
    """Inserts, changes and deletes on the owner's in-memory pages, recording dirty pages."""

    def __init__(self, desc: Descriptor, pages: np.ndarray, keys: MutableMapping[bytes, bytes],
                 rng: Callable[[int], int], befores: Befores | None = None) -> None:
        self.desc, self.pages, self.keys, self.rng = desc, pages, keys, rng
        self.g = desc.geometry
        self.dirty: set[int] = set()
        # a dirty page as it was (its row of `befores`): the batch is XORs
        self.befores = befores if befores is not None else Befores()
        self.before: dict[int, int] = {}
        self.records = desc.records
        self._cands: dict[bytes, tuple[int, int, int]] = {}
        self.key_puts: dict[bytes, bytes] = {}  # the key changes a diff version keeps
        self.key_dels: set[bytes] = set()

    def _slot(self, bucket: int, slot: int) -> tuple[int, int]:
        return self.g.bucket_page(bucket), self.g.slot_offset(bucket, slot)

    def _write(self, bucket: int, slot: int, tag: bytes, value: bytes) -> None:
        page, off = self._slot(bucket, slot)
        if page not in self.before:
            self.before[page] = self.befores.keep_row(self.pages[page])
        self.pages[page, off:off + TAG_SIZE] = np.frombuffer(tag, np.uint8)
        self.pages[page, off + TAG_SIZE:off + self.g.slot_size] = np.frombuffer(value, np.uint8)
        self.dirty.add(page)

    def _read(self, bucket: int, slot: int) -> tuple[bytes, bytes]:
        page, off = self._slot(bucket, slot)
        raw = self.pages[page, off:off + self.g.slot_size].tobytes()
        return raw[:TAG_SIZE], raw[TAG_SIZE:]

    def prepare(self, keys: list[bytes]) -> None:
        """Hash the candidates of many keys at once (the compiled twin of `candidates`; one
        by one in Python they cost more than the rest of a change)."""
        if len(keys) < 8:
            return
        trios = candidates_many(*pack_keys(keys), self.desc.seeds, self.g.num_buckets)
        self._cands.update(zip(keys, map(tuple, trios.tolist()), strict=True))

    def _candidates(self, key: bytes) -> tuple[int, int, int]:
        found = self._cands.get(key)
        if found is None:
            found = candidates(key, self.desc.seeds, self.g.num_buckets)
        return found

    def _find(self, key: bytes, tag: bytes) -> tuple[int, int] | None:
        if tag not in self.keys:  # every record's tag is there: an absent key has no slot
            return None
        for b in self._candidates(key):
            s = slot_of(self.g, self.pages[self.g.bucket_page(b)], b, tag)
            if s is not None:
                return b, s
        return None

    def apply(self, change: Change) -> None:
        where = change.where or f"key 0x{change.key.hex()[:64]}"
        tag = tag_of(self.desc.dataset, change.key)
        held = self.keys.get(tag)
        if held is not None and bytes(held) != change.key:
            # Slots are found by tag: taken, the other key's record would be answered for
            # this one, or overwritten, or deleted. Keys with a chosen tag cost some 2^64
            # hashes (a birthday search over the public dataset id), but anyone can choose
            # their own contract's storage slots; the builder refuses such a table as well.
            if change.op == "delete_absent":
                return
            raise RecordError(
                f"{where}: its 128-bit tag collides with that of key 0x{bytes(held).hex()[:64]}, "
                "which the table holds: two keys with one tag cannot both be served, refused")
        if tag == EMPTY_TAG and change.op == "put":
            raise RecordError(f"{where}: the key's tag is all zeros (the empty-slot marker)")
        at = self._find(change.key, tag)
        if change.op in ("delete", "delete_absent"):
            if at is None:
                if change.op == "delete_absent":
                    return
                raise RecordError(f"{where}: delete of a key the table does not hold")
            self._write(*at, EMPTY_TAG, bytes(self.g.value_size))
            self.records -= 1
            del self.keys[tag]
            self.key_puts.pop(tag, None)
            self.key_dels.add(tag)
            return
        if len(change.value) != self.g.value_size:
            raise RecordError(f"{where}: value is {len(change.value)} bytes; this table's "
                              f"values are {self.g.value_size} bytes")
        if at is not None:
            self._write(*at, tag, change.value)
            return
        self.records += 1
        self.keys[tag] = change.key  # before the chain: it may evict this very record again
        self.key_puts[tag] = change.key
        self.key_dels.discard(tag)
        self._insert(tag, change.key, change.value, where)

    def _insert(self, tag: bytes, key: bytes, value: bytes, where: str) -> None:
        # an eviction chain moves records between their candidates; every page it touches is
        # in this version's one batch, so no reader sees the chain half done
        cur = (tag, key, value)
        last = -1
        for _ in range(MAX_KICKS):
            cands = self._candidates(cur[1])
            for b in cands:
                s = free_slot(self.g, self.pages[self.g.bucket_page(b)], b)
                if s is not None:
                    self._write(b, s, cur[0], cur[2])
                    return
            live = [b for b in cands if self.g.bucket_capacity(b) and b != last] or \
                [b for b in cands if self.g.bucket_capacity(b)]
            if not live:
                break
            b = live[self.rng(len(live))]
            s = self.rng(self.g.bucket_capacity(b))
            victim_tag, victim_value = self._read(b, s)
            self._write(b, s, cur[0], cur[2])
            cur = (victim_tag, self.keys[victim_tag], victim_value)
            last = b
        g = self.g
        raise TableFullError(
            f"{where}: the table is full ({len(self.keys)} records in {g.capacity} slots, "
            f"{len(self.keys) / g.capacity:.1%}); no eviction chain of {MAX_KICKS} moves found "
            "a slot. Nothing was changed. Rebuild bigger: `morphogen build --records` with "
            f"--buckets {int(g.num_buckets * 1.25) + 1} (or without --buckets to size it for "
            "the records), then rotate both parties to the new snapshot")

