"""The keyword lookup logic: a lookup's requests, padding, freshness and verification.

A lookup is one PIR query of three keys into the table's data through the page clients (HTTP
or Serve handles), with their retries, plus three into each tree level read privately; this
layer adds the descriptor, the candidate pages and their paths, the padding, the freshness
bounds and the verification (`morphogen.keyword.verify`). What a server sees never depends on
the keys looked up:

- **Tables.** Where the parties serve the keyword table's `data`, `treeN` and `descriptor`
  tables, each read costs the scan of its table only; where they do not (the reference's
  server, which serves one matrix), the same pages are read from the whole matrix.
- **Shapes.** A request carries a bucket of lookups (`request_sizes`): 1, 2, 4, 8, ... up to
  the servers' `max_batch_queries`, which is a bucket too. The places past the caller's keys
  are random keys, planned, asked and verified like the real ones; their values are dropped.
- **Table changes.** Every answer names the data it came from (epoch id and identity). The
  client keeps the view it read the descriptor at, and an answer from any other data (an
  update, a rotation, a table rebuilt under the same epoch id) is dropped unread: the
  descriptor is read again and the lookup asked again. The page client is told not to follow
  a move itself (`get_pinned`): re-sending one table's candidate pages to another would
  succeed or fail depending on where they fall, that is on the key.
- **Freshness.** The client never accepts a version older than one it has accepted, nor a
  block older than one it has seen; its caller may bound both (`min_version`,
  `trusted_version`, `min_block`, `trusted_block`) and the age of the version
  (`max_age`): `StaleTableError`. Every page is proven against the root the owner signed
  for the version, so pages of two versions never mix.

The logic is a generator of page-client calls (actions.py) that a blocking or an asyncio driver
performs (client.py), so both clients run it, and where a table's pages are read among what the
servers serve is placement.py's.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

from morphogen.keyword.actions import BOUND, Get, GetAll, Info, Machine
from morphogen.keyword.descriptor import Descriptor, KeywordIntegrityError, StaleTableError
from morphogen.keyword.freshness import Bounds, stale
from morphogen.keyword.layout import DATA_TABLE, DESCRIPTOR_TABLE, level_table, part_table
from morphogen.keyword.placement import View, route, same_view, table_span, views_of
from morphogen.keyword.signing import DATASET_SIZE, load_public_key
from morphogen.keyword.verify import (
    WHOLE_LEVEL_PAGES,
    Proof,
    check,
    descriptor_of,
    plan,
    private_levels,
    prove_whole,
    whole_pages_wanted,
)

# Tries of one request when the servers move to other data each time: a table that changes
# faster than a lookup's round trip is an outage, not something to wait out here.
MOVES = 4
# Padding keys: their candidates are as uniform as any real key's, whatever the length.
PAD_KEY_SIZE = 20


class TableChangingError(RuntimeError):
    """The servers answered from other data at every try of one request."""


def request_sizes(n: int, limit: int) -> list[int]:
    """Lookups per request for a batch of `n` keys when a request holds at most `limit`:
    full requests of `limit`, then the smallest bucket that holds the rest, a power of two
    or `limit` itself. 70 keys at 32: [32, 32, 8]. A server learns the buckets, not `n`."""
    if limit < 1:
        raise ValueError("a request holds at least one lookup")
    sizes = [limit] * (n // limit)
    if n % limit:
        sizes.append(min(limit, 1 << (n % limit - 1).bit_length()))
    return sizes


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} is a count (an int, 0 or more)")
    return value


def dataset_id(value: Any) -> bytes | None:
    """A table's dataset id from 16 bytes or 32 hex digits (0x or not); None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value[2:] if value[:2].lower() == "0x" else value
        try:
            value = bytes.fromhex(text)
        except ValueError:
            value = b""
    if not isinstance(value, bytes) or len(value) != DATASET_SIZE:
        raise ValueError(f"dataset is a table's {DATASET_SIZE}-byte dataset id "
                         f"({2 * DATASET_SIZE} hex digits), or None")
    return value


class SharedVersion:
    """The version clients of one table plan with (its proof and the view it came from),
    shared: clients made for concurrent readers of the same page client and table read a new
    version's descriptor once between them, not once each. Each client still checks it
    against its own bounds before use."""

    def __init__(self) -> None:
        self.state: tuple[Proof, View] | None = None
        # the dataset of the first descriptor accepted: a table signed with the same key but
        # built apart (another chain, another set of records) is never taken for this one
        self.dataset: bytes | None = None


class KeywordLookup:
    """One keyword table's lookups as generators of actions (`_get_many`, `_read_at`,
    `_descriptor`), with the version they plan with and the bounds it is held to; the
    drivers (client.py) subclass it and run them."""

    def __init__(self, pir: Any, public_key: Any, *, min_version: int = 0,
                 trusted_version: Callable[[], Any] | None = None, min_block: int = 0,
                 trusted_block: Callable[[], Any] | None = None,
                 max_age: float | None = None,
                 whole_level_pages: int = WHOLE_LEVEL_PAGES, table: str = "",
                 shared: SharedVersion | None = None, dataset: Any = None) -> None:
        self.pir = pir
        self.table = table
        # the table's dataset id where the caller knows it; else the first one read is kept
        self.dataset = dataset_id(dataset)
        self.trusted = (load_public_key(public_key)
                        if isinstance(public_key, (str, bytes)) or hasattr(public_key, "__fspath__")
                        else public_key)
        self.min_version = _count("min_version", min_version)
        self.min_block = _count("min_block", min_block)
        if max_age is not None and not max_age > 0:
            raise ValueError("max_age is a number of seconds above 0 (or None)")
        self.max_age = max_age
        self.trusted_version = trusted_version
        self.trusted_block = trusted_block
        if _count("whole_level_pages", whole_level_pages) < 1:
            raise ValueError("whole_level_pages is at least 1 (the top level is read whole)")
        self.whole_level_pages = whole_level_pages
        # the highest version and block accepted so far: the client never goes below them
        self.seen_version = 0
        self.seen_block = 0
        # (proof of the version, the view its descriptor came from), replaced whole
        self._shared = shared if shared is not None else SharedVersion()
        # the last descriptor page whose signature checked: one signature per version
        self._signed: tuple[bytes, Descriptor] | None = None
        # the parties' (epoch id, identity) the last lookup's answers came from: the data its
        # values were proven against (a client is used by one thread at a time)
        self.last_view: View | None = None

    @property
    def _state(self) -> tuple[Proof, View] | None:
        return self._shared.state

    @_state.setter
    def _state(self, state: tuple[Proof, View] | None) -> None:
        self._shared.state = state

    # ------------------------------------------------------------------ the logic

    def _bounds(self) -> Machine:
        version, block = self.min_version, self.min_block
        if self.trusted_version is not None or self.trusted_block is not None:
            told_version, told_block = yield BOUND
            version = max(version, int(told_version or 0))
            block = max(block, int(told_block or 0))
        return Bounds(version, block, self.max_age)

    def _get_many(self, keys: Sequence[bytes]) -> Machine:
        keys = [bytes(k) for k in keys]
        if not keys:
            return []
        bounds = yield from self._bounds()
        limit = self._limit((yield Info(False)))
        out: list[bytes | None] = []
        for size in request_sizes(len(keys), limit):
            values, _ = yield from self._lookup(keys[len(out):len(out) + size], size, bounds)
            out += values
        return out

    def _read_at(self, keys: Sequence[bytes]) -> Machine:
        """(values, descriptor): every value proven against the one version the descriptor
        names. A batch of several requests that straddles a publication is read again whole
        (MOVES times at most), so a caller can hold reads of several tables to one block."""
        keys = [bytes(k) for k in keys]
        bounds = yield from self._bounds()
        for _ in range(MOVES):
            if not keys:
                proof, _ = yield from self._current(bounds)
                return [], proof.descriptor
            limit = self._limit((yield Info(False)))
            out: list[bytes | None] = []
            seen: Descriptor | None = None
            for size in request_sizes(len(keys), limit):
                values, desc = yield from self._lookup(keys[len(out):len(out) + size], size,
                                                       bounds)
                if seen is not None and desc != seen:
                    break
                seen, out = desc, out + values
            else:
                return out, seen
        raise TableChangingError(f"a new version was published during each of {MOVES} tries "
                                 "of one batch (the table changes faster than a batch is read)")

    def _lookup(self, keys: list[bytes], size: int, bounds: Bounds) -> Machine:
        asked = keys + [secrets.token_bytes(PAD_KEY_SIZE) for _ in range(size - len(keys))]
        checked_again = False
        for _ in range(MOVES):
            proof, view = yield from self._current(bounds)
            wanted, buckets = plan(proof, asked)
            info = yield Info(False)
            g = proof.descriptor.geometry
            base = table_span(info, self.table)[0]
            gets = [self._route(info, DATA_TABLE, base, g.data_pages, wanted[0])] + [
                self._route(info, level_table(k), base + g.level_first(k), g.levels[k - 1],
                            wanted[k])
                for k in range(1, proof.private + 1)]
            try:
                answers = yield GetAll(gets)
            except LookupError:  # the page client saw the servers move (DataMoved)
                self._state = None
                continue
            if not all(same_view((a.epoch_id, a.identity), view) for a in answers):
                self._state = None
                continue
            try:
                # padding pages are checked too: a server that corrupted only them must get
                # the same failure as any other, or it would learn which places were padding
                values = check(proof, asked, buckets, [a.pages for a in answers])[:len(keys)]
                self.last_view = view
                return values, proof.descriptor
            except KeywordIntegrityError as exc:
                # Servers that publish no identity can serve a rebuilt table under the old
                # epoch id; only the descriptor tells. One re-read, the same for any key and
                # any bad page, and the error stands when the descriptor is unchanged.
                if checked_again:
                    raise
                checked_again = True
                try:
                    fresh, _ = yield from self._read_descriptor(bounds)
                except StaleTableError:
                    raise
                except KeywordIntegrityError:
                    # a server that lies about the lookup may lie about the descriptor too:
                    # the caller still gets the lookup's one error
                    raise exc from None
                if fresh.descriptor == proof.descriptor:
                    raise exc from None
        raise TableChangingError(f"the servers moved to other data at each of {MOVES} tries "
                                 "of one request (the table changes faster than a lookup)")

    def _current(self, bounds: Bounds) -> Machine:
        """The version to plan with: the one kept, while the page client's /epoch still
        names the data it came from and it meets `bounds`; otherwise read anew."""
        state = self._state
        info = yield Info(False)
        if state is not None:
            proof, view = state
            desc = proof.descriptor
            if (stale(desc, bounds, self.seen_version, self.seen_block) is None
                    and self._other_dataset(desc) is None
                    and table_span(info, self.table)[1] == desc.geometry.num_pages
                    and any(same_view(v, view) for v in views_of(info))):
                return state
        return (yield from self._read_descriptor(bounds))

    def _read_descriptor(self, bounds: Bounds) -> Machine:
        for _ in range(MOVES):
            info = yield Info(True)
            base, span = table_span(info, self.table)
            try:
                answer = yield self._route(info, DESCRIPTOR_TABLE, base + span - 1, 1, [0])
            except LookupError:
                continue
            desc = self._signed_descriptor(answer.pages[0], span)
            if desc.name != self.table:
                raise KeywordIntegrityError(
                    f"the servers answered the descriptor of keyword table {desc.name!r} for "
                    f"{self.table!r}")
            self._admit(desc, bounds)
            view = (answer.epoch_id, answer.identity)
            private = private_levels(desc, self.whole_level_pages)
            wanted = whole_pages_wanted(desc, private)
            g, limit = desc.geometry, self._limit(info)
            gets = [self._route(info, level_table(k), base + g.level_first(k), n,
                                list(range(at, min(n, at + limit))))
                    for k, n in wanted.items() for at in range(0, n, limit)]
            try:
                answers = yield GetAll(gets)
            except LookupError:
                continue
            if not all(same_view((a.epoch_id, a.identity), view) for a in answers):
                continue
            whole: dict[int, list[bytes]] = {k: [] for k in wanted}
            parts = iter(answers)
            for k, n in wanted.items():
                for _at in range(0, n, limit):
                    whole[k] += next(parts).pages
            self._state = (prove_whole(desc, private, whole), view)
            self.last_view = view
            return self._state
        raise TableChangingError(f"the servers moved to other data at each of {MOVES} reads "
                                 "of the table's descriptor")

    def _route(self, info: Any, name: str, first: int, size: int, pages: list[int]) -> Get:
        return route(info, part_table(self.table, name), first, size, pages)

    def _signed_descriptor(self, page: bytes, num_pages: int) -> Descriptor:
        page = bytes(page)
        if self._signed is not None and self._signed[0] == page:
            desc = self._signed[1]
            if desc.geometry.num_pages == num_pages:
                return desc
        desc = descriptor_of(page, self.trusted, num_pages)
        self._signed = (page, desc)
        return desc

    def _other_dataset(self, desc: Descriptor) -> str | None:
        """Why `desc` is not of the table this client reads, or None when it is."""
        want = self.dataset or self._shared.dataset
        if want is None or desc.dataset == want:
            return None
        how = "was given" if self.dataset is not None else "has read"
        return (f"the servers serve keyword table {desc.name!r} of dataset "
                f"{desc.dataset.hex()}; this client {how} dataset {want.hex()}: another "
                "table signed with the same key, refused")

    def _admit(self, desc: Descriptor, bounds: Bounds) -> None:
        other = self._other_dataset(desc)
        if other is not None:
            self._state = None
            raise KeywordIntegrityError(other)
        why = stale(desc, bounds, self.seen_version, self.seen_block)
        if why is not None:
            self._state = None
            raise StaleTableError(
                f"{why}: refusing it (a restored backup, parties restarted behind the owner, "
                "both parties serving an old table, or an owner that stopped publishing)")
        if desc.anchor is not None:
            # the block of the newest version accepted: a newer version may name a lower
            # block (the owner's version of a reorg to a shorter branch), and reading it again
            # must not be refused as going back from the orphaned block's height
            self.seen_block = (desc.anchor.number if desc.version > self.seen_version
                               else max(self.seen_block, desc.anchor.number))
        self.seen_version = max(self.seen_version, desc.version)
        if self._shared.dataset is None:
            self._shared.dataset = desc.dataset

    def _descriptor(self, refresh: bool) -> Machine:
        bounds = yield from self._bounds()
        if refresh or self._state is None:
            return (yield from self._read_descriptor(bounds))[0].descriptor
        return self._state[0].descriptor

    def _limit(self, info: Any) -> int:
        own = getattr(getattr(self.pir, "_core", None), "max_batch_queries", None)
        return min(own or info.max_batch_queries, info.max_batch_queries)

