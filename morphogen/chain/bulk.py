"""A chain's three tables built from a dump in two steps: ranges encoded apart, then placed.

`build_chain_tables` places each table's records in one process, in the order of the state
export (accounts by address, storage by address then slot, code in the order its first account
comes), with random choices that `table_draws(seed, name)` fixes. Placement is a random walk
over the whole table, so it is sequential and order-dependent; everything before it is not:

1. `encode_range` (any number at once, one per range of the dump's lines): parse the lines,
   sort the range's accounts by address, encode their records, tag them (BLAKE3) and hash them
   (SipHash, before the modulo: the table's size is not known yet). The range's records come
   out sorted, and each account's storage follows it.
2. `assemble` (one process a table): sort the ranges' accounts by address (a radix sort on
   every core), lay storage and code out in the export's order, take each record's buckets as its
   hashes modulo the table's size, and place them with `place_table`, the very function and
   draws the one-process build uses: the same records give the same bytes.

Step 2 splits in two processes where the ranges are kept as files (`chain import`): one places
from the values, tags and hashes (`assemble(keys_apart=...)`), the other reads the keys and
tags and builds the owner's key index from them (`key_columns`), at the same time.

Costs: step 1 is per record, O(records / workers). Step 2 touches each record a few times
(sort, gather, modulo, placement, slot writes) and hashes each page once for the tree; its
rate is what `bench/chain_build.py` reports as the funnel. Its memory is the records once and
the pages: a range's arrays are dropped as they are gathered into the tables' order, a code's
records are kept from one range only (`drop_seen_codes`, as the ranges are read in), and the
hashes become the buckets where they lie.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence

import numba
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from morphogen.chain.dumps import LineError, parse_account, read_range
from morphogen.chain.state import EMPTY_CODE_HASH, code_chunks, keccak256
from morphogen.chain.tables import TABLES, VALUE_SIZES, buckets_for, table_draws
from morphogen.constants import PAGE_SIZE
from morphogen.keyword import radix
from morphogen.keyword.build import KeywordTable, join_tables, place_table
from morphogen.keyword.descriptor import Anchor
from morphogen.keyword.hashing import seeded_hashes
from morphogen.keyword.key_columns import KeyColumns
from morphogen.keyword.layout import EMPTY_TAG, TAG_SIZE, Geometry
from morphogen.keyword.pages import tags_of
from morphogen.keyword.records import RecordError
from morphogen.keyword.signing import DATASET_SIZE
from morphogen.storage.mapped import new_mapped

KEY_SIZES = {"accounts": 20, "storage": 52, "code": 36}
CHUNK = 1020


class RangeError(ValueError):
    """A line of a range refused: `index` is its line within the range."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(index, message)  # both in args: it crosses processes pickled
        self.index, self.message = index, message

    def __str__(self) -> str:
        return self.message


def plan(seed: int) -> dict[str, tuple[bytes, tuple[int, int, int]]]:
    """Each table's dataset id and first seeds: the first draws `build_table` makes from
    `table_draws(seed, name)`."""
    out = {}
    for name in TABLES:
        draws = table_draws(seed, name)
        out[name] = (draws.token(DATASET_SIZE), draws.seeds())
    return out


def _rows(hexes: list[str], width: int, rows: int | None = None) -> np.ndarray:
    rows = len(hexes) if rows is None else rows
    return np.frombuffer(bytes.fromhex("".join(hexes)), np.uint8).reshape(rows, width)


def _tagged(name: str, keys: np.ndarray, plans: dict) -> tuple[np.ndarray, np.ndarray]:
    dataset, seeds = plans[name]
    flat = keys.tobytes()
    w = keys.shape[1]
    tags = tags_of(dataset, [flat[i:i + w] for i in range(0, len(flat), w)])
    return tags, seeds_hashes(keys, seeds)


def seeds_hashes(keys: np.ndarray, seeds: tuple[int, int, int]) -> np.ndarray:
    return seeded_hashes(keys, seeds) if len(keys) else np.zeros((0, 3), np.uint64)


def encode_range(path: str, start: int, end: int, plans: dict) -> dict[str, np.ndarray]:
    """The records of the dump's lines in [start, end), sorted, tagged and hashed (see the
    module's step 1). RangeError names a line that is not an account."""
    accounts = []
    for index, line in read_range(path, start, end):
        try:
            accounts.append((parse_account(line), index))
        except LineError as exc:
            raise RangeError(index, str(exc)) from None
    accounts.sort()
    for i in range(1, len(accounts)):
        if accounts[i][0].address == accounts[i - 1][0].address:
            raise RangeError(accounts[i][1],
                             f"address 0x{accounts[i][0].address} twice in the dump")
    values, counts = bytearray(), np.zeros(len(accounts), np.int64)
    hashes: dict[str, bytes] = {}
    first: dict[bytes, str] = {}  # code hash -> the first (least) address with that code
    codes: dict[bytes, str] = {}
    for i, (account, _) in enumerate(accounts):
        code = account.code
        if code:
            code_hash = hashes.get(code)
            if code_hash is None:
                code_hash = hashes[code] = keccak256(bytes.fromhex(code))
            if code_hash not in first:
                first[code_hash], codes[code_hash] = account.address, code
        else:
            code_hash = EMPTY_CODE_HASH
        values += (account.nonce.to_bytes(8, "big") + account.balance.to_bytes(32, "big")
                   + code_hash)
        counts[i] = len(account.slots) // 64
    acc_keys = _rows([a.address for a, _ in accounts], 20)
    slots = _rows([a.slots for a, _ in accounts], 32, int(counts.sum()))
    out = {"acc_keys": acc_keys,
           "acc_vals": np.frombuffer(bytes(values), np.uint8).reshape(len(accounts), 72),
           "sto_counts": counts,
           "sto_keys": np.concatenate([np.repeat(acc_keys, counts, axis=0), slots], axis=1),
           "sto_vals": _rows([a.words for a, _ in accounts], 32, int(counts.sum()))}
    out.update(_code_records(first, codes))
    for prefix, name in (("acc", "accounts"), ("sto", "storage"), ("code", "code")):
        out[f"{prefix}_tags"], out[f"{prefix}_hash"] = _tagged(name, out[f"{prefix}_keys"], plans)
    out["lines"] = np.array([len(accounts)], np.int64)
    return out


def _code_records(first: dict[bytes, str], codes: dict[bytes, str]) -> dict[str, np.ndarray]:
    keys, values = bytearray(), bytearray()
    hashes, firsts, chunks = [], [], []
    for code_hash, address in first.items():
        code = bytes.fromhex(codes[code_hash])
        n = code_chunks(len(code))
        head = len(code).to_bytes(4, "big")
        for i in range(n):
            keys += code_hash + i.to_bytes(4, "big")
            values += head + code[i * CHUNK:(i + 1) * CHUNK].ljust(CHUNK, b"\0")
        hashes.append(code_hash)
        firsts.append(address)
        chunks.append(n)
    k = len(keys) // 36
    return {"code_keys": np.frombuffer(bytes(keys), np.uint8).reshape(k, 36),
            "code_vals": np.frombuffer(bytes(values), np.uint8).reshape(k, 1024),
            "code_ids": np.frombuffer(b"".join(hashes), np.uint8).reshape(len(hashes), 32),
            "code_first": _rows(firsts, 20),
            "code_chunks": np.array(chunks, np.int64)}


CODE_FIELDS = ("code_keys", "code_vals", "code_tags", "code_hash")


def drop_seen_codes(part: dict, seen: set[bytes]) -> None:
    """Drop from a range's output the records of the codes that a range read in before it
    already holds (`seen`: their hashes, which this adds to). A code is in every range with an
    account that has it, and a popular one in nearly every range: kept once, not once a range.
    The range keeps each code's hash and least address, so the tables' order is unchanged."""
    ids, chunks = part["code_ids"], part["code_chunks"]
    hashes = [ids[i].tobytes() for i in range(len(ids))]
    have = [h in seen for h in hashes]
    seen.update(hashes)
    if not any(have):
        return
    dup = np.asarray(have, bool)
    rows = np.repeat(~dup, chunks)
    for name in CODE_FIELDS:
        if name in part:  # a process reading some fields only (`INDEX_FIELDS`)
            part[name] = np.ascontiguousarray(part[name][rows])
    part["code_chunks"] = np.where(dup, 0, chunks).astype(np.int64)


# -- step 2 ------------------------------------------------------------------------------------

@numba.njit(cache=True)
def _segments(starts, lengths, order):
    total = 0
    for i in order:
        total += lengths[i]
    out = np.empty(total, np.int64)
    k = 0
    for i in order:
        for j in range(lengths[i]):
            out[k] = starts[i] + j
            k += 1
    return out


@numba.njit(cache=True)
def _first_repeat(rows):
    # one pass, no row-sized temporaries: rows differ in their first bytes almost always
    for i in range(1, rows.shape[0]):
        for j in range(rows.shape[1]):
            if rows[i, j] != rows[i - 1, j]:
                break
        else:
            return i
    return -1


def _refuse_repeats(keys: np.ndarray, tags: np.ndarray | None, what: str) -> None:
    """A key twice (`keys` in order), or two keys of one tag or one of the empty slot's; the
    tags are left to the key index's build where `tags` is None (its sort finds them)."""
    if len(keys) > 1:
        same = _first_repeat(np.ascontiguousarray(keys))
        if same >= 0:
            raise RecordError(f"{what} 0x{keys[same].tobytes().hex()} twice in the dump")
    if tags is None:
        return
    if len(tags) > 1:
        # sort on 64 bits of each tag, then compare the whole tags of the few equal neighbours
        head = np.ascontiguousarray(tags[:, :8]).view(np.uint64).reshape(-1)
        _, ranked = radix.argsort(head)
        alike = np.unique(ranked[1:][ranked[1:] == ranked[:-1]])
        for value in alike:  # rare: find the few records of each such value
            same = np.nonzero(head == value)[0]
            pairs = [(a, b) for i, a in enumerate(same) for b in same[i + 1:]
                     if (tags[a] == tags[b]).all()]
            if pairs:
                a, b = pairs[0]
                raise RecordError(f"{what}: keys 0x{keys[a].tobytes().hex()} and "
                                  f"0x{keys[b].tobytes().hex()} have the same 128-bit tag")
        # the empty-slot marker is zeros: such a tag's first 64 bits sort first
        if ranked[0] == 0 and (tags[head == 0] == np.frombuffer(EMPTY_TAG, np.uint8)).all(
                axis=1).any():
            raise RecordError(f"{what}: a key's tag is all zeros (the empty-slot marker)")
    elif len(tags) and (tags == np.frombuffer(EMPTY_TAG, np.uint8)).all(axis=1).any():
        raise RecordError(f"{what}: a key's tag is all zeros (the empty-slot marker)")


def _cat(parts: Sequence[dict], name: str, width: int, dtype=np.uint8) -> np.ndarray:
    arrays = [p[name] for p in parts]
    return np.concatenate(arrays) if arrays else np.zeros((0, width), dtype)


@numba.njit(cache=True, parallel=True)
def _put_rows(src, dest, out):
    for k in numba.prange(len(dest)):
        if dest[k] >= 0:
            out[dest[k], :] = src[k]


def destinations(total: int, order: np.ndarray) -> np.ndarray:
    """Row of the concatenation -> row of the result (-1: left out), for `gathered`: one map
    serves every field of a table, whose ranges hold the same rows in each."""
    dest = np.full(total, -1, np.int64)
    dest[order] = np.arange(len(order), dtype=np.int64)
    return dest


def gathered(parts: Sequence[dict], name: str, order: np.ndarray, width: int,
             dtype=np.uint8, dest: np.ndarray | None = None, *,
             release: bool = False, out: np.ndarray | None = None) -> np.ndarray:
    """`_cat(parts, name)[order]` without the concatenation: each range's rows read in turn
    and written to their places, on every core (the concatenation and the gather were the
    funnel's two largest copies). `dest`: `destinations` of `order`, where made already.
    `release`: each range's array is dropped from its dict once its rows are copied, so that
    the records are held once, not twice, while a table is gathered. `out`: the rows written
    there (C-contiguous, `len(order)` rows of `width`), not to a new array."""
    if dest is None:
        dest = destinations(sum(len(p[name]) for p in parts), order)
    if out is None:
        out = np.empty((len(order), width), dtype)
    elif out.shape != (len(order), width) or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"out is not {len(order)} C-contiguous rows of {width} {dtype}")
    at = 0
    for p in parts:
        src = np.ascontiguousarray(p[name], dtype).reshape(-1, width)
        _put_rows(src, dest[at:at + len(src)], out)
        at += len(src)
        if release:
            del src
            del p[name]
    return out


def orders(parts: Sequence[dict]) -> dict[str, np.ndarray]:
    """Each table's order: row of the ranges' concatenated records -> its place in the
    export's order (accounts by address, each account's storage after it, each code once at
    its least address). Reads only the ranges' addresses, storage counts and code ids."""
    acc_keys = _cat(parts, "acc_keys", 20)
    # sorted as one, not merged as the ranges' sorted runs: one radix sort on every core
    # against log2(ranges) passes of merges over every address
    acc = radix.rows_argsort(acc_keys)
    del acc_keys
    counts = np.concatenate([p["sto_counts"] for p in parts]) if parts else np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    sto = _segments(starts, counts, acc)
    # code: each hash once, at its least address; ranges that share a code hold equal records
    firsts = _cat(parts, "code_first", 20)
    ids = _cat(parts, "code_ids", 32)
    chunks = np.concatenate([p["code_chunks"] for p in parts]) if parts else np.zeros(0, np.int64)
    cstarts = np.concatenate([[0], np.cumsum(chunks)[:-1]]).astype(np.int64)
    by_first = radix.rows_argsort(np.concatenate([firsts, ids], axis=1))
    hashes = np.ascontiguousarray(ids).view(np.dtype((np.void, 32))).reshape(-1)
    _, first_at = np.unique(hashes[by_first], return_index=True)
    keep = by_first[np.sort(first_at)]  # each code's row at its least address, in order
    # a code's records are the same bytes in every range that has it: taken from the first
    # range that still holds them (`drop_seen_codes` leaves them in one only, the first read,
    # and a code, never empty, has a chunk at least: every code is held somewhere)
    held = np.flatnonzero(chunks)
    held_hashes, held_at = np.unique(hashes[held], return_index=True)
    holder = held[held_at[np.searchsorted(held_hashes, hashes[keep])]]
    code = _segments(cstarts, chunks, holder.astype(np.int64))
    return {"accounts": acc, "storage": sto, "code": code}


PREFIXES = {"accounts": "acc", "storage": "sto", "code": "code"}


def canonical(parts: Sequence[dict], fields: dict[str, Sequence[str]] | None = None,
              order: dict[str, np.ndarray] | None = None) -> dict[str, tuple[np.ndarray, ...]]:
    """Each table's (keys, values, tags, hashes) in the export's order, from the ranges'
    outputs in any order (`fields[name]`: those fields only, in that order). The ranges'
    record arrays are consumed: each is dropped from its dict as soon as it is gathered, so
    the funnel holds the records once (at mainnet size the difference is a second copy of
    some 200 GiB)."""
    order = orders(parts) if order is None else order
    out = {}
    for name in TABLES:
        prefix = PREFIXES[name]
        widths = {"keys": KEY_SIZES[name], "vals": VALUE_SIZES[name], "tags": TAG_SIZE,
                  "hash": 3}
        dest = destinations(sum(len(p[f"{prefix}_tags"]) for p in parts), order[name])
        out[name] = tuple(
            gathered(parts, f"{prefix}_{field}", order[name], widths[field],
                     np.uint64 if field == "hash" else np.uint8, dest, release=True)
            for field in (fields or {}).get(name, ("keys", "vals", "tags", "hash")))
    return out


def key_columns(parts: Sequence[dict], keys_at: str | os.PathLike[str] | None = None
                ) -> KeyColumns:
    """The joined tables' tags and keys in the export's order (what the owner's key index is
    built from), every key checked distinct (and every tag, by the index's build, in the sort
    it makes anyway: `KeyIndex.build`): the part of step 2 that does not wait on
    placement, so another process does it beside the one that places (`assemble(keys_apart=
    ...)`). `parts` need only the ranges' keys, tags, storage counts and code ids. `keys_at`:
    the keys are gathered into that file (made), the index's heap as it is written, and read
    from its mapping."""
    order = orders(parts)
    # each table's rows gathered into their place in one array of tags and one of keys, not
    # joined after and written out: copies of some 1.5 GiB at 16 M records
    rows = {name: len(order[name]) for name in TABLES}
    tags = np.empty((sum(rows.values()), TAG_SIZE), np.uint8)
    heap = _key_bytes(sum(rows[name] * KEY_SIZES[name] for name in TABLES), keys_at)
    keys, at, base = [], 0, 0
    for name in TABLES:
        prefix, n, width = PREFIXES[name], rows[name], KEY_SIZES[name]
        dest = destinations(sum(len(p[f"{prefix}_tags"]) for p in parts), order[name])
        keys.append(gathered(parts, f"{prefix}_keys", order[name], width, dest=dest,
                             release=True, out=heap[base:base + n * width].reshape(n, width)))
        gathered(parts, f"{prefix}_tags", order[name], TAG_SIZE, dest=dest, release=True,
                 out=tags[at:at + n])
        # a tag twice is found by the index's build, in the sort it makes anyway
        _refuse_repeats(keys[-1], None, WHAT[name])
        at, base = at + n, base + n * width
    return KeyColumns.rows(tags, keys, file=keys_at)


def _key_bytes(size: int, path: str | os.PathLike[str] | None) -> np.ndarray:
    return np.empty(size, np.uint8) if path is None else new_mapped(path, np.uint8, (size,))


WHAT = {"accounts": "address", "storage": "storage key", "code": "code chunk"}
INDEX_FIELDS = ("acc_keys", "acc_tags", "sto_keys", "sto_tags", "sto_counts", "code_keys",
                "code_tags", "code_ids", "code_first", "code_chunks")
# what the placing process reads of a range when the keys are indexed apart: the addresses
# order the tables, and code (a small table) keeps its keys for a placement's rare redraw
PLACE_FIELDS = ("acc_keys", "acc_vals", "acc_tags", "acc_hash", "sto_vals", "sto_tags",
                "sto_hash", "sto_counts", "code_keys", "code_vals", "code_tags", "code_hash",
                "code_ids", "code_first", "code_chunks")


@numba.njit(cache=True, parallel=True)
def _buckets_in_place(hashes, buckets):
    flat = hashes.reshape(-1)
    for i in numba.prange(flat.size):
        flat[i] = flat[i] % buckets


def assemble_table(name: str, keys: np.ndarray, values: np.ndarray, tags: np.ndarray,
                   hashes: np.ndarray, *, seed: int, signing_key: Ed25519PrivateKey,
                   anchor: Anchor, room: float, min_records: int, created: int | None,
                   out: np.ndarray | None = None,
                   rekey: Callable[[], np.ndarray] | None = None) -> KeywordTable:
    """One table placed exactly as `build_chain_tables` places it (step 2), into `out` where
    given (`table_pages` zeros). `hashes` becomes the records' buckets in place. `rekey`:
    the keys are elsewhere (`keys` only counts them; the table's `keys` are then not its
    own): the keys in order, read for a placement that draws other seeds, and the keys' and
    tags' checks are `key_columns`'."""
    if rekey is None:
        _refuse_repeats(keys, tags, WHAT[name])
    draws = table_draws(seed, name)
    dataset = draws.token(DATASET_SIZE)
    planned = plan(seed)[name][1]

    first = [hashes]

    def candidates(seeds: tuple[int, int, int], buckets: int) -> np.ndarray:
        # the ranges hashed with the first seeds; a placement that fails draws others (rare).
        # Those hashes are asked for once: they become the buckets where they lie (before, a
        # remainder and its conversion made two copies of 24 bytes a record)
        if tuple(seeds) == planned and first:
            h = np.ascontiguousarray(first.pop(), np.uint64)
        else:
            h = seeds_hashes(keys if rekey is None else rekey(), seeds)
        _buckets_in_place(h, np.uint64(buckets))
        return h.view(np.int64)

    geometry = table_geometry(name, len(keys), room=room, min_records=min_records)
    return place_table(
        keys, tags, values, candidates, dataset=dataset, value_size=geometry.value_size,
        signing_key=signing_key, draws=draws, numbering=(1, anchor, name), created=created,
        num_buckets=geometry.num_buckets, out=out)


def table_geometry(name: str, records: int, *, room: float, min_records: int) -> Geometry:
    """The geometry `assemble` gives table `name` of `records` records."""
    size = VALUE_SIZES[name]
    return Geometry("page", size, buckets_for(records, size, room=room, min_records=min_records))


def assemble(parts: Sequence[dict], *, seed: int, signing_key: Ed25519PrivateKey,
             anchor: Anchor, room: float = 4.0, min_records: int = 4096,
             created: int | None = None,
             keys_apart: Callable[[str, np.ndarray], np.ndarray] | None = None,
             pages_at: str | os.PathLike[str] | None = None) -> KeywordTable:
    """The joined tables of the ranges' outputs (`encode_range`), as `build_chain_tables`
    with the same `seed` and `created` makes them from the same state.

    `keys_apart(name, order)`: the owner's key index is built by another process
    (`key_columns`), so the accounts' and storage's keys are not gathered here (`parts` need
    only `PLACE_FIELDS`) and the table's `keys` are not the owner's; the callable gives a
    table's keys in `order` from wherever the ranges are kept, for the rare placement that
    must draw other seeds. `pages_at`: the matrix is placed in that file (made), through a
    mapping of it, which the owner directory can then take as its snapshot's pages
    (`create_owner_dir(adopt_pages=True)`) rather than copy them out of memory."""
    if room < 1 or min_records < 0:
        raise ValueError("room is at least 1 and min_records at least 0")
    fields = None
    order = None
    if keys_apart is not None:
        order = orders(parts)
        fields = {"accounts": ("vals", "tags", "hash"), "storage": ("vals", "tags", "hash"),
                  "code": ("keys", "vals", "tags", "hash")}
    tables = canonical(parts, fields, order)
    rekeys: dict[str, Callable[[], np.ndarray] | None] = dict.fromkeys(TABLES)
    if keys_apart is not None:
        for name in ("accounts", "storage"):
            tables[name] = (np.zeros((len(order[name]), 0), np.uint8), *tables[name])
            rekeys[name] = functools.partial(keys_apart, name, order[name])
    # the joined matrix allocated once, each table placed into its part: joining tables built
    # apart would copy every page once more
    spans = [table_geometry(name, len(tables[name][0]), room=room,
                            min_records=min_records).num_pages for name in TABLES]
    shape = (sum(spans), PAGE_SIZE)
    # in a file, the pages are the page cache's: written back to the disk as they are
    # placed, not held resident as the process's own (some 128 GiB at mainnet size)
    pages = np.zeros(shape, np.uint8) if pages_at is None else new_mapped(pages_at, np.uint8,
                                                                          shape)
    ends = np.cumsum([0, *spans]).tolist()
    placed = []
    for i, name in enumerate(TABLES):
        # taken out of `tables` as it is placed: its values and hashes go once it is written
        placed.append(assemble_table(name, *tables.pop(name), seed=seed,
                                     signing_key=signing_key, anchor=anchor, room=room,
                                     min_records=min_records, created=created,
                                     out=pages[ends[i]:ends[i + 1]], rekey=rekeys[name]))
    return join_tables(placed)
