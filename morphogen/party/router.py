"""One party (server A or B) without Ray: layout, key validation, fan-out, publication, `/epoch`.

`deployments/router.py` is the Serve adapter: it reads HTTP requests and hands `Party` one
`ShardLink` per shard deployment. Everything a party decides lives here, so that it is unit
tested with in-process shards:

* the layout the shards serve together (page count, domain bits), refreshed when an answer
  names an epoch the cached layout does not know;
* every query validated completely against that layout before any scan, then coalesced with
  concurrent ones into one fan-out whose partials are XORed only under one `EpochIdentity`; a
  query of a named table (morphogen.party.tables) reaches only the shards overlapping it, and
  coalesces only with queries of the same table;
* with an epoch log, the identity scans ask for (`want`): the log's head at start, what this
  party published, or the newest identity a scan met. A shard replica behind it catches up
  from the log before it answers, so replicas of a shard that started or were reached at
  different times converge instead of being XORed apart;
* admin publication (`morphogen.party.publisher.Publisher`, the party's `admin`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from morphogen.config import PartyConfig
from morphogen.constants import KEYS_PER_QUERY, PAGE_SIZE
from morphogen.party import admin, wire
from morphogen.party.coalesce import Coalescer
from morphogen.party.combine import EpochMismatch, ShardFailure, scan_all
from morphogen.party.observe import NullObserver, Observer
from morphogen.party.publisher import Publisher
from morphogen.party.redact import reason
from morphogen.party.shards import Layout, ShardLink
from morphogen.party.tables import TableKeys, TableSlice, shard_slices
from morphogen.protocol.codec import ErrorCode, WireError, unavailable
from morphogen.protocol.dpf import DomainError, KeyFormatError
from morphogen.protocol.identity import EpochIdentity
from morphogen.protocol.packed import AnyBatch, concat_batches
from morphogen.publication.log import EpochLog
from morphogen.snapshot.tables import Table, advertised

log = logging.getLogger(__name__)

T = TypeVar("T")

_INFO_TIMEOUT_S = 10.0
# GET /epoch and /health while shards switch epochs: a few short tries before a 503.
_CONSISTENT_ATTEMPTS = 4
# A refused key domain re-reads the shards' layout at most this often (bad keys cannot turn
# every request into a fan-out of metadata calls).
_REVALIDATE_S = 0.5


class Party:
    """The party's logic over `shards` (index order = shard order)."""

    def __init__(self, cfg: PartyConfig, shards: list[ShardLink],
                 epoch_log: EpochLog | None = None, observer: Observer | None = None) -> None:
        if not shards:
            raise ValueError("a party needs at least one shard")
        self.cfg = cfg
        self.shards = list(shards)
        self.epoch_log = epoch_log
        self.observer: Observer = observer or NullObserver()
        self._layout: Layout | None = None
        self._layout_lock = asyncio.Lock()
        self._refresh: asyncio.Task[None] | None = None
        self._revalidated = 0.0
        self.want: EpochIdentity | None = None
        self._want_read = False
        self._want_task: asyncio.Task[None] | None = None
        self.held_queries = 0  # queries in this party's hands now (the autoscaling signal)
        self.coalescer: Coalescer[TableKeys] = Coalescer(
            self._scan_keys,
            window_s=cfg.coalesce_window_s,
            max_items=cfg.coalesce_max_keys,
            max_in_flight=cfg.coalesce_max_in_flight,
            group=TableKeys.group,
        )
        self.admin = Publisher(self, lease_s=cfg.admin_lease_s)

    # ------------------------------------------------------------------ shards and layout

    def unavailable(self, message: str) -> WireError:
        return unavailable(message, self.cfg.retry_after_s)

    async def from_every_shard(self, calls: list[Awaitable[T]], what: str,
                               timeout_s: float) -> list[T]:
        """Every shard's answer to `calls` (one per shard), or 503 naming `what` when any
        shard fails or the whole takes longer than `timeout_s`."""
        try:
            return list(await asyncio.wait_for(asyncio.gather(*calls), timeout_s))
        except Exception as exc:  # noqa: BLE001 - any shard failure means unavailable
            cause = admin.unwrap(exc)
            log.warning("%s unavailable (%s)", what, reason(cause))
            raise self.unavailable(f"{what} unavailable ({type(cause).__name__})") from None

    async def infos(self) -> list[dict[str, Any]]:
        """One replica's info per shard."""
        return await self.from_every_shard([s.info() for s in self.shards], "shard metadata",
                                           _INFO_TIMEOUT_S)

    async def layout(self) -> Layout:
        if self._layout is not None:
            return self._layout
        async with self._layout_lock:
            if not self._want_read:
                await self.read_want()
            if self._layout is None:
                try:
                    self._layout = Layout(await self.infos())
                except ShardFailure as exc:
                    raise self.unavailable(str(exc)) from None
        return self._layout

    def set_layout(self, infos: list[dict[str, Any]]) -> Layout | None:
        """Cache the layout the shards report now, when it is a whole one."""
        try:
            layout = Layout(infos)
        except ShardFailure:
            return None  # between epochs of different shapes: keep the last whole one
        self._layout = layout
        return layout

    # ------------------------------------------------------------------ the wanted identity

    async def read_want(self) -> None:
        """Want the epoch log's committed head (what was last published, by any router
        replica)."""
        self._want_read = True
        if self.epoch_log is None:
            return
        try:
            head = await asyncio.to_thread(self.epoch_log.head)
        except Exception as exc:  # noqa: BLE001 - scans then take what the shards agree on
            log.warning("epoch log unreadable (%s)", reason(exc))
            return
        target = head.epoch_identity() if head is not None else None
        if target is not None:
            self.want = target

    def advance_want(self, identities: frozenset[Any] | set[Any]) -> None:
        """Want the newest of `identities` when it is newer than what is wanted now: it was
        published (it is in the log), so the replicas behind it can catch up to it."""
        if self.epoch_log is None:
            return  # replicas could not catch up: take whatever the shards agree on
        known = [i for i in identities if isinstance(i, EpochIdentity)]
        if not known:
            return
        newest = max(known, key=lambda i: i.epoch_id)
        if self.want is None or newest.epoch_id > self.want.epoch_id:
            self.want = newest

    def _note_identity(self, identity: EpochIdentity | None) -> None:
        """A scan answered from data the cached layout does not know (None: a shard refused
        the keys' domain): re-read the layout in the background (a rotation may have changed
        the page count or domain)."""
        layout = self._layout
        if layout is None or self._refresh is not None:
            return
        if identity is not None and identity.digest in layout.identities:
            return
        self._refresh = asyncio.get_running_loop().create_task(self._refresh_layout())

    async def _refresh_layout(self) -> None:
        try:
            self.set_layout(await self.infos())
        except Exception as exc:  # noqa: BLE001 - the next new epoch tries again
            log.warning("layout refresh failed (%s)", reason(exc))
        finally:
            self._refresh = None

    async def validated(self, parse: Callable[[Layout], T], layout: Layout | None = None) -> T:
        """`parse(layout)` against the cached layout; a key domain or a table it refuses is
        checked once more against the shards' current layout (a rotation seen by another
        router replica may have changed it), at most once per `_REVALIDATE_S`."""
        layout = layout or await self.layout()
        try:
            return parse(layout)
        except WireError as err:
            now = time.monotonic()
            if (err.code not in (ErrorCode.BAD_DOMAIN, ErrorCode.UNKNOWN_TABLE)
                    or now - self._revalidated < _REVALIDATE_S):
                raise
            self._revalidated = now
            fresh = self.set_layout(await self.infos())
            if fresh is None:
                raise self.unavailable("the snapshot is changing, retry") from None
            if fresh.shape == layout.shape:
                raise
            return parse(fresh)

    # ------------------------------------------------------------------ queries

    async def _call_shard(self, shard: ShardLink, batch: AnyBatch,
                          part: TableSlice | None = None) -> tuple[EpochIdentity, Any]:
        try:
            if part is None:
                return await shard.scan(batch, self.want)
            return await shard.scan(batch, self.want, part)
        except Exception as exc:
            cause = admin.unwrap(exc)
            if isinstance(cause, WireError) and cause.status < 500:
                raise cause from None  # the request's own fault (stale domain): no retry
            raise

    async def _scan_keys(self, requests: list[TableKeys]) -> tuple[EpochIdentity, Any]:
        """One pass of every shard (of a named table: of every shard overlapping it) over the
        keys of `requests` (a coalesced group, all of one table), XORed under one identity."""
        table = requests[0].table
        try:
            batch = concat_batches([r.keys for r in requests])
        except (DomainError, KeyFormatError):
            # requests validated on both sides of a domain-changing rotation met in one group
            raise self.unavailable("the snapshot is changing, retry") from None
        self.observer.coalesced(len(batch))
        if table is None:
            calls = [lambda s=s: self._call_shard(s, batch) for s in self.shards]
        else:
            # each shard checks this plan against the epoch it scans (TableSlice.check): a
            # shard left out by a stale layout can never be missing from an answer silently
            layout = await self.layout()
            calls = [lambda s=self.shards[i], p=part: self._call_shard(s, batch, p)
                     for i, part in shard_slices(table, layout.ranges)]
        try:
            identity, acc = await scan_all(
                calls,
                len(batch),
                attempts=self.cfg.scan_attempts,
                backoff_s=self.cfg.retry_backoff_ms / 1000.0,
                timeout_s=self.cfg.shard_timeout_s,
                on_mismatch=self.advance_want,
            )
        except EpochMismatch:
            raise self.unavailable("no consistent epoch across shards, retry") from None
        except ShardFailure as exc:
            if table is not None:
                self._note_identity(None)  # a table that moved: the layout is re-read
            if self.want is not None and (self._want_task is None or self._want_task.done()):
                # perhaps a want no replica can reach: the log's head is what was published
                self._want_task = asyncio.get_running_loop().create_task(self.read_want())
            raise self.unavailable(f"scan failed: {exc}") from None
        except WireError as err:
            if err.code == ErrorCode.BAD_DOMAIN:
                self._note_identity(None)
            raise
        if not isinstance(identity, EpochIdentity):
            raise ShardFailure("a shard answered without an epoch identity")
        self.advance_want({identity})
        self._note_identity(identity)
        return identity, acc

    async def answer(self, keys: AnyBatch,
                     table: Table | None = None) -> tuple[EpochIdentity, Any]:
        """The accumulators of one request's validated keys (`wire.validate_queries`), over
        the whole matrix or over `table`."""
        queries = len(keys) // KEYS_PER_QUERY
        self.held_queries += queries
        try:
            identity, acc = await self.coalescer.submit(TableKeys(keys, table))
        finally:
            self.held_queries -= queries
        if acc.shape != (len(keys), PAGE_SIZE):  # never answer with a wrong-sized XOR
            raise WireError(500, ErrorCode.INTERNAL, "internal error")
        return identity, acc

    async def query(self, keys: list[bytes], table: str | None = None) -> dict[str, Any]:
        """One query (three keys as bytes) -> `{"epoch_id", "identity", "pages"}`; `table`
        names one of the snapshot's tables (None: the whole matrix)."""
        return await self._handle_query([keys], table, batch=False, max_queries=1)

    async def query_batch(self, queries: list[list[bytes]],
                          table: str | None = None) -> dict[str, Any]:
        """1..max queries -> `{"epoch_id", "identity", "results": [{"pages"}, ...]}`, all of
        `table` (None: the whole matrix)."""
        return await self._handle_query(queries, table, batch=True,
                                        max_queries=self.cfg.max_batch_queries)

    async def _handle_query(self, queries: list[list[bytes]], table: str | None, *,
                            batch: bool, max_queries: int) -> dict[str, Any]:
        def parse(layout: Layout) -> tuple[AnyBatch, Table | None]:
            d = wire.table_domain(table, layout.domain_bits, layout.table_domains)
            keys = wire.handle_queries(queries, domain_bits=d, max_queries=max_queries,
                                       batch=batch, table=table,
                                       key_formats=layout.key_formats)
            return keys, None if table is None else layout.tables[table]

        keys, resolved = await self.validated(parse)
        identity, acc = await self.answer(keys, resolved)
        return wire.answer_dict(identity.epoch_id, acc, batch=batch, identity=identity.digest)

    # ------------------------------------------------------------------ /epoch and /health

    async def consistent_infos(self) -> list[dict[str, Any]]:
        """Every shard's info, all on one identity (a few short tries across a commit)."""
        if not self._want_read:
            await self.read_want()
        backoff = self.cfg.retry_backoff_ms / 1000.0
        for attempt in range(_CONSISTENT_ATTEMPTS):
            if attempt:
                await asyncio.sleep(backoff * (2 ** (attempt - 1)))
            infos = await self.infos()
            if admin.same_data(infos):
                return infos
        raise self.unavailable("shards are between epochs, retry")

    async def epoch(self) -> dict[str, Any]:
        """The `GET /epoch` document: real page count and the domain bits keys must use, the
        identity answers will carry, and the epoch's state."""
        infos = await self.consistent_infos()
        layout = self.set_layout(infos)
        if layout is None:
            raise self.unavailable("shards are between snapshots, retry")
        state = admin.party_epoch(infos)
        cfg = self.cfg
        state_root = "0x" + "00" * 32
        if layout.checksum and layout.checksum.startswith("blake3-chunks:"):
            state_root = "0x" + layout.checksum.split(":", 1)[1]
        first = infos[0]
        return {
            "epoch_id": state.epoch_id,
            "identity": first["identity"],
            "update_chain": first["update_chain"],
            "num_rows": layout.num_pages * cfg.rows_per_page,
            "seeds": list(cfg.seeds),
            "block_number": cfg.block_number,
            "state_root": state_root,
            "page_pir": {
                "domain_bits": layout.domain_bits,
                "rows_per_page": cfg.rows_per_page,
                "num_pages": layout.num_pages,
                # The reference's AES PRG keys; the ChaCha8 PRG is keyless.
                "prg_keys": ["0x" + "00" * 16, "0x" + "00" * 16],
                "page_size": PAGE_SIZE,
                "keys_per_query": KEYS_PER_QUERY,
                "max_batch_queries": cfg.max_batch_queries,
                "num_shards": layout.num_shards,
                # the key formats every shard scans (docs/packed-keys.md)
                "key_formats": list(layout.key_formats),
            },
            # this project's named tables: page ranges queried with a "table" field
            "tables": advertised(layout.tables.values()),
            "pending_updates": state.pending_updates,
            "rotation_in_progress": state.rotation_in_progress or self.admin.rotating,
            "snapshot": {
                "epoch_id": state.snapshot_epoch_id,
                "checksum": state.snapshot_checksum,
            },
        }

    async def health(self) -> dict[str, Any]:
        """`{"status": "ok", ...}` only when every shard answers and all serve one identity;
        raises 503 otherwise."""
        infos = await self.consistent_infos()
        state = admin.party_epoch(infos)
        return {
            "status": "ok",
            "epoch_id": state.epoch_id,
            "identity": infos[0]["identity"],
            "block_number": self.cfg.block_number,
            "pending_updates": state.pending_updates,
            "rotation_in_progress": state.rotation_in_progress or self.admin.rotating,
        }

    def stats(self) -> dict[str, Any]:
        """Coalescing counters (benchmarks and tests)."""
        s = self.coalescer.stats
        return {
            "calls": s.calls,
            "submissions": s.submissions,
            "items": s.items,
            "largest": s.largest,
            "window_s": self.coalescer.window_s,
        }
