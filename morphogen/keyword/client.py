"""Records by key over the page clients: `get(key)`, `get_many(keys)`, sync and async.

`KeywordClient` (a blocking page client: `PirClient`, `HandlePirClient`) and
`AsyncKeywordClient` (an asyncio one) drive the one lookup logic (lookup.py: what a lookup
asks, its padding, freshness and verification, and what a server sees of it), performing the
page-client calls it asks for (actions.py) each in their own way.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from morphogen.keyword.actions import Get, GetAll, Info, Machine, step
from morphogen.keyword.descriptor import Descriptor
from morphogen.keyword.lookup import KeywordLookup

_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(8, thread_name_prefix="kw-tables")
    return _POOL


class KeywordClient(KeywordLookup):
    """Lookups through a blocking page client (`PirClient`, `HandlePirClient`).

    `public_key` is the data owner's Ed25519 public key: 32 bytes, 64 hex digits, a file
    holding them, or a key object. Nothing else is trusted. Freshness bounds, each raising
    `StaleTableError`: `min_version` and `min_block` refuse versions (blocks) older than
    them; `trusted_version` and `trusted_block`, called once per `get_many`, give a version
    (block) the caller trusts from elsewhere, or None; `max_age` refuses versions the owner
    made more than that many seconds ago. `whole_level_pages`: tree levels of at most that
    many pages are read whole once per version, larger ones a page per candidate. `table`
    names one keyword table of a matrix that holds several (`join_tables`): its lookups read
    its own data, levels and descriptor, whose signed name must be `table`. `dataset`: the
    table's 16-byte dataset id (bytes or hex) where the caller knows it; without it, the first
    version read fixes it. A version of another dataset (a table built apart and signed with
    the same key: another chain, another set of records) raises `KeywordIntegrityError`.
    """

    def _run(self, machine: Machine) -> Any:
        reply, failure = None, None
        try:
            while True:
                done, action = step(machine, reply, failure)
                if done:
                    return action
                reply, failure = None, None
                try:
                    reply = self._perform(action)
                except LookupError as exc:
                    failure = exc
        finally:
            machine.close()

    def _perform(self, action: Any) -> Any:
        if isinstance(action, Info):
            return self.pir.info(refresh=action.refresh)
        if isinstance(action, Get):
            return self._get(action)
        if isinstance(action, GetAll):
            if len(action.gets) == 1:
                return [self._get(action.gets[0])]
            # the tables of one lookup are asked at once: one round trip, not one a level
            # (the page clients take calls from several threads; httpx's sessions are shared)
            rest = [_pool().submit(self._get, g) for g in action.gets[1:]]
            first = self._get(action.gets[0])
            return [first] + [f.result() for f in rest]
        return (self.trusted_version() if self.trusted_version else None,
                self.trusted_block() if self.trusted_block else None)

    def _get(self, get: Get) -> Any:
        if get.table is None:
            return self.pir.get_pinned(get.pages, get.num_pages)
        return self.pir.get_pinned(get.pages, get.num_pages, table=get.table)

    def descriptor(self, refresh: bool = False) -> Descriptor:
        return self._run(self._descriptor(refresh))

    def get(self, key: bytes) -> bytes | None:
        """The value stored under `key`, or None when the table has no such key."""
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values in key order, in requests of `request_sizes(len(keys), max_batch_queries)`
        lookups each."""
        return self._run(self._get_many(keys))

    def read_at(self, keys: Sequence[bytes]) -> tuple[list[bytes | None], Descriptor]:
        """Values in key order and the signed descriptor of the one version they were all
        proven against (its anchor is the block they reflect)."""
        return self._run(self._read_at(keys))


class AsyncKeywordClient(KeywordLookup):
    """Lookups through an asyncio page client: `AsyncPirClient`, or a `HandlePirClient` from
    inside a Serve deployment (its `a*` methods). `trusted_version` and `trusted_block` may be
    coroutine functions."""

    async def _run(self, machine: Machine) -> Any:
        reply, failure = None, None
        try:
            while True:
                done, action = step(machine, reply, failure)
                if done:
                    return action
                reply, failure = None, None
                try:
                    reply = await self._perform(action)
                except LookupError as exc:
                    failure = exc
        finally:
            machine.close()

    async def _perform(self, action: Any) -> Any:
        if isinstance(action, Info):
            fn = getattr(self.pir, "ainfo", None) or self.pir.info
            return await fn(refresh=action.refresh)
        if isinstance(action, Get):
            return await self._get(action)
        if isinstance(action, GetAll):
            # the tables of one lookup are asked at once: one round trip, not one a level
            return list(await asyncio.gather(*(self._get(g) for g in action.gets)))
        return (await _maybe(self.trusted_version), await _maybe(self.trusted_block))

    async def _get(self, get: Get) -> Any:
        fn = getattr(self.pir, "aget_pinned", None) or self.pir.get_pinned
        if get.table is None:
            return await fn(get.pages, get.num_pages)
        return await fn(get.pages, get.num_pages, table=get.table)

    async def descriptor(self, refresh: bool = False) -> Descriptor:
        return await self._run(self._descriptor(refresh))

    async def get(self, key: bytes) -> bytes | None:
        return (await self.get_many([key]))[0]

    async def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return await self._run(self._get_many(keys))

    async def read_at(self, keys: Sequence[bytes]) -> tuple[list[bytes | None], Descriptor]:
        return await self._run(self._read_at(keys))


async def _maybe(fn: Callable[[], Any] | None) -> Any:
    if fn is None:
        return None
    told = fn()
    return await told if inspect.isawaitable(told) else told
