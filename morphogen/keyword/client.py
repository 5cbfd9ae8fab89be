"""Records by key over the page clients: `get(key)`, `get_many(keys)`, sync and async.

A lookup is one PIR query of three keys through the page clients (HTTP or Serve handles), with
their retries; this layer adds the descriptor, the candidate pages, the padding, the freshness
bound and the verification (`morphogen.keyword.verify`). What a server sees never depends on
the keys looked up:

- **Shapes.** A request carries a bucket of lookups (`request_sizes`): 1, 2, 4, 8, ... up to
  the servers' `max_batch_queries`, which is a bucket too. The places past the caller's keys
  are random keys, planned, asked and verified like the real ones; their values are dropped.
- **Table changes.** Every answer names the data it came from (epoch id and identity). The
  client keeps the view it read the descriptor at, and an answer from any other data (an
  update, a rotation, a table rebuilt under the same epoch id) is dropped unread: the
  descriptor is read again and the lookup asked again. The page client is told not to follow
  a move itself (`get_pinned`): re-sending one table's candidate pages to another would
  succeed or fail depending on where they fall, that is on the key.
- **Freshness.** The client never accepts a descriptor older than one it has accepted, nor
  than its caller's bound (`min_version`, `trusted_version`): `StaleTableError`.

The client works as a generator of actions (`_Info`, `_Get`, `_BOUND`) that a blocking or an
asyncio driver performs, so both clients run the one logic.
"""

from __future__ import annotations

import inspect
import secrets
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from morphogen.keyword.descriptor import Descriptor, KeywordIntegrityError, StaleTableError
from morphogen.keyword.signing import load_public_key
from morphogen.keyword.verify import check, descriptor_of, plan

# Tries of one request when the servers move to other data each time: a table that changes
# faster than a lookup's round trip is an outage, not something to wait out here.
MOVES = 4
# Padding keys: their candidates are as uniform as any real key's, whatever the length.
PAD_KEY_SIZE = 20

View = tuple[int, "str | None"]
_Machine = Generator[Any, Any, Any]


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


@dataclass(frozen=True)
class _Info:
    """Wanted: the page client's `ServerInfo` (read from both parties when `refresh`)."""

    refresh: bool


@dataclass(frozen=True)
class _Get:
    """Wanted: `get_pinned(pages, num_pages)`, or the `LookupError` it raised thrown back in."""

    pages: list[int]
    num_pages: int


_BOUND = object()  # wanted: the caller's trusted version (`trusted_version()`)


def _same(a: View, b: View) -> bool:
    # identities are compared where both sides publish one: the reference server has none
    return a[0] == b[0] and (a[1] is None or b[1] is None or a[1] == b[1])


def _views(info: Any) -> list[View]:
    epochs = getattr(info, "epoch_ids", None) or (info.epoch_id, info.epoch_id)
    idents = getattr(info, "identities", None) or (getattr(info, "identity", None),) * 2
    return list(zip(epochs, idents, strict=True))


class _Core:
    def __init__(self, pir: Any, public_key: Any, *, min_version: int = 0,
                 trusted_version: Callable[[], Any] | None = None) -> None:
        self.pir = pir
        self.trusted = (load_public_key(public_key)
                        if isinstance(public_key, (str, bytes)) or hasattr(public_key, "__fspath__")
                        else public_key)
        if isinstance(min_version, bool) or not isinstance(min_version, int) or min_version < 0:
            raise ValueError("min_version is a version number (an int, 0 or more)")
        self.min_version = min_version
        self.trusted_version = trusted_version
        # the highest version accepted so far: the client never goes below it
        self.seen_version = 0
        # (descriptor, the view its page came from), replaced whole
        self._state: tuple[Descriptor, View] | None = None

    # ------------------------------------------------------------------ the logic

    def _bound(self) -> _Machine:
        bound = self.min_version
        if self.trusted_version is not None:
            told = yield _BOUND
            if told is not None:
                bound = max(bound, int(told))
        return bound

    def _get_many(self, keys: Sequence[bytes]) -> _Machine:
        keys = [bytes(k) for k in keys]
        if not keys:
            return []
        bound = yield from self._bound()
        limit = self._limit((yield _Info(False)))
        out: list[bytes | None] = []
        for size in request_sizes(len(keys), limit):
            out += yield from self._lookup(keys[len(out):len(out) + size], size, bound)
        return out

    def _lookup(self, keys: list[bytes], size: int, bound: int) -> _Machine:
        asked = keys + [secrets.token_bytes(PAD_KEY_SIZE) for _ in range(size - len(keys))]
        checked_again = False
        for _ in range(MOVES):
            desc, view = yield from self._current(bound)
            pages, buckets = plan(desc, asked)
            try:
                answer = yield _Get(pages, desc.geometry.num_pages)
            except LookupError:  # the page client saw the servers move (DataMoved)
                self._state = None
                continue
            if not _same((answer.epoch_id, answer.identity), view):
                self._state = None
                continue
            try:
                # padding pages are checked too: a server that corrupted only them must get
                # the same failure as any other, or it would learn which places were padding
                return check(desc, self.trusted, asked, buckets, answer.pages)[:len(keys)]
            except KeywordIntegrityError as exc:
                # Servers that publish no identity can serve a rebuilt table under the old
                # epoch id; only the descriptor tells. One re-read, the same for any key and
                # any bad page, and the error stands when the descriptor is unchanged.
                if checked_again:
                    raise
                checked_again = True
                try:
                    fresh, _ = yield from self._read_descriptor(bound)
                except StaleTableError:
                    raise
                except KeywordIntegrityError:
                    # a server that lies about the lookup may lie about the descriptor too:
                    # the caller still gets the lookup's one error
                    raise exc from None
                if fresh == desc:
                    raise exc from None
        raise TableChangingError(f"the servers moved to other data at each of {MOVES} tries "
                                 "of one request (the table changes faster than a lookup)")

    def _current(self, bound: int) -> _Machine:
        """The descriptor to plan with: the one kept, while the page client's /epoch still
        names the data it came from (and its version meets `bound`); otherwise read anew."""
        state = self._state
        info = yield _Info(False)
        if state is not None:
            desc, view = state
            if (desc.version >= bound and info.num_pages == desc.geometry.num_pages
                    and any(_same(v, view) for v in _views(info))):
                return state
        return (yield from self._read_descriptor(bound))

    def _read_descriptor(self, bound: int) -> _Machine:
        for _ in range(MOVES):
            info = yield _Info(True)
            try:
                answer = yield _Get([info.num_pages - 1], info.num_pages)
            except LookupError:
                continue
            desc = descriptor_of(answer.pages[0], self.trusted, info.num_pages)
            self._admit(desc, bound)
            self._state = (desc, (answer.epoch_id, answer.identity))
            return self._state
        raise TableChangingError(f"the servers moved to other data at each of {MOVES} reads "
                                 "of the table's descriptor")

    def _admit(self, desc: Descriptor, bound: int) -> None:
        floor = max(bound, self.seen_version)
        if desc.version < floor:
            self._state = None
            why = ("this client has already read version" if self.seen_version >= bound
                   else "its caller trusts version")
            raise StaleTableError(
                f"the servers serve version {desc.version} of the table and {why} {floor}: "
                "refusing to go back (a restored backup, parties restarted behind the owner, "
                "or both parties serving an old table)")
        self.seen_version = max(self.seen_version, desc.version)

    def _descriptor(self, refresh: bool) -> _Machine:
        bound = yield from self._bound()
        if refresh or self._state is None:
            return (yield from self._read_descriptor(bound))[0]
        return self._state[0]

    def _limit(self, info: Any) -> int:
        own = getattr(getattr(self.pir, "_core", None), "max_batch_queries", None)
        return min(own or info.max_batch_queries, info.max_batch_queries)


def _start(machine: _Machine, reply: Any, failure: BaseException | None) -> tuple[bool, Any]:
    try:
        return False, machine.send(reply) if failure is None else machine.throw(failure)
    except StopIteration as done:
        return True, done.value


class KeywordClient(_Core):
    """Lookups through a blocking page client (`PirClient`, `HandlePirClient`).

    `public_key` is the data owner's Ed25519 public key: 32 bytes, 64 hex digits, a file
    holding them, or a key object. Nothing else is trusted. `min_version` refuses tables older
    than it; `trusted_version`, called once per `get_many`, gives a version the caller trusts
    (the owner's latest, from elsewhere), or None. Both raise `StaleTableError`.
    """

    def _run(self, machine: _Machine) -> Any:
        reply, failure = None, None
        try:
            while True:
                done, action = _start(machine, reply, failure)
                if done:
                    return action
                reply, failure = None, None
                try:
                    if isinstance(action, _Info):
                        reply = self.pir.info(refresh=action.refresh)
                    elif isinstance(action, _Get):
                        reply = self.pir.get_pinned(action.pages, action.num_pages)
                    else:
                        reply = self.trusted_version()  # type: ignore[misc]
                except LookupError as exc:
                    failure = exc
        finally:
            machine.close()

    def descriptor(self, refresh: bool = False) -> Descriptor:
        return self._run(self._descriptor(refresh))

    def get(self, key: bytes) -> bytes | None:
        """The value stored under `key`, or None when the table has no such key."""
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values in key order, in requests of `request_sizes(len(keys), max_batch_queries)`
        lookups each."""
        return self._run(self._get_many(keys))


class AsyncKeywordClient(_Core):
    """Lookups through an asyncio page client: `AsyncPirClient`, or a `HandlePirClient` from
    inside a Serve deployment (its `a*` methods). `trusted_version` may be a coroutine
    function."""

    async def _run(self, machine: _Machine) -> Any:
        reply, failure = None, None
        try:
            while True:
                done, action = _start(machine, reply, failure)
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
        if isinstance(action, _Info):
            fn = getattr(self.pir, "ainfo", None) or self.pir.info
            return await fn(refresh=action.refresh)
        if isinstance(action, _Get):
            fn = getattr(self.pir, "aget_pinned", None) or self.pir.get_pinned
            return await fn(action.pages, action.num_pages)
        told = self.trusted_version()  # type: ignore[misc]
        return await told if inspect.isawaitable(told) else told

    async def descriptor(self, refresh: bool = False) -> Descriptor:
        return await self._run(self._descriptor(refresh))

    async def get(self, key: bytes) -> bytes | None:
        return (await self.get_many([key]))[0]

    async def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return await self._run(self._get_many(keys))
