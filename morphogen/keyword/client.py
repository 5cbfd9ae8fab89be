"""Records by key over the page clients: `get(key)`, `get_many(keys)`, sync and async.

A lookup is one PIR query of three keys through the existing clients (HTTP or Serve handles),
with their retries and epoch checks; this layer adds the descriptor, the candidate pages and
the verification (`morphogen.keyword.verify`). The descriptor is read once, and again only
when an answer fails to verify at another epoch than the one it was read at (the table may
have been rebuilt): the same for every key, so it tells the servers nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from morphogen.keyword.descriptor import Descriptor, KeywordIntegrityError
from morphogen.keyword.signing import load_public_key
from morphogen.keyword.verify import check, descriptor_of, plan


def _chunks(keys: Sequence[bytes], max_queries: int) -> list[Sequence[bytes]]:
    # a query of the wire protocol is three keys: one lookup is exactly one query
    return [keys[i:i + max_queries] for i in range(0, len(keys), max_queries)]


class _Core:
    def __init__(self, pir: Any, public_key: Any) -> None:
        self.pir = pir
        self.trusted = (load_public_key(public_key)
                        if isinstance(public_key, (str, bytes)) or hasattr(public_key, "__fspath__")
                        else public_key)
        self._descriptor: Descriptor | None = None
        self._descriptor_epoch: int | None = None

    def _keep(self, epoch: int, page: bytes, num_pages: int) -> Descriptor:
        self._descriptor = descriptor_of(page, self.trusted, num_pages)
        self._descriptor_epoch = epoch
        return self._descriptor

    def _limit(self, info: Any) -> int:
        own = getattr(getattr(self.pir, "_core", None), "max_batch_queries", None)
        return min(own or info.max_batch_queries, info.max_batch_queries)

    def _stale(self, epoch: int) -> bool:
        return self._descriptor_epoch is not None and epoch != self._descriptor_epoch


class KeywordClient(_Core):
    """Lookups through a blocking page client (`PirClient`, `HandlePirClient`).

    `public_key` is the data owner's Ed25519 public key: 32 bytes, 64 hex digits, a file
    holding them, or a key object. Nothing else is trusted.
    """

    def descriptor(self, refresh: bool = False) -> Descriptor:
        if self._descriptor is None or refresh:
            info = self.pir.info(refresh=True)
            epoch, (page,) = self.pir.get_with_epoch([info.num_pages - 1])
            return self._keep(epoch, page, info.num_pages)
        return self._descriptor

    def get(self, key: bytes) -> bytes | None:
        """The value stored under `key`, or None when the table has no such key."""
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values in key order; one request per `max_batch_queries` keys."""
        keys = [bytes(k) for k in keys]
        out: list[bytes | None] = []
        limit = self._limit(self.pir.info())
        for chunk in _chunks(keys, limit):
            out += self._lookup(chunk)
        return out

    def _lookup(self, keys: Sequence[bytes]) -> list[bytes | None]:
        for attempt in (0, 1):
            desc = self.descriptor(refresh=attempt == 1)
            pages, buckets = plan(desc, keys)
            epoch, answer = self.pir.get_with_epoch(pages)
            try:
                return check(desc, self.trusted, keys, buckets, answer)
            except KeywordIntegrityError:
                if attempt or not self._stale(epoch):
                    raise
        raise AssertionError("unreachable")


class AsyncKeywordClient(_Core):
    """Lookups through an asyncio page client: `AsyncPirClient`, or a `HandlePirClient` from
    inside a Serve deployment (its `a*` methods)."""

    async def _info(self, refresh: bool = False) -> Any:
        if hasattr(self.pir, "ainfo"):
            return await self.pir.ainfo(refresh=refresh)
        return await self.pir.info(refresh=refresh)

    async def _get_with_epoch(self, pages: list[int]) -> tuple[int, list[bytes]]:
        if hasattr(self.pir, "aget_with_epoch"):
            return await self.pir.aget_with_epoch(pages)
        return await self.pir.get_with_epoch(pages)

    async def descriptor(self, refresh: bool = False) -> Descriptor:
        if self._descriptor is None or refresh:
            info = await self._info(refresh=True)
            epoch, (page,) = await self._get_with_epoch([info.num_pages - 1])
            return self._keep(epoch, page, info.num_pages)
        return self._descriptor

    async def get(self, key: bytes) -> bytes | None:
        return (await self.get_many([key]))[0]

    async def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        keys = [bytes(k) for k in keys]
        out: list[bytes | None] = []
        limit = self._limit(await self._info())
        for chunk in _chunks(keys, limit):
            out += await self._lookup(chunk)
        return out

    async def _lookup(self, keys: Sequence[bytes]) -> list[bytes | None]:
        for attempt in (0, 1):
            desc = await self.descriptor(refresh=attempt == 1)
            pages, buckets = plan(desc, keys)
            epoch, answer = await self._get_with_epoch(pages)
            try:
                return check(desc, self.trusted, keys, buckets, answer)
            except KeywordIntegrityError:
                if attempt or not self._stale(epoch):
                    raise
        raise AssertionError("unreachable")
