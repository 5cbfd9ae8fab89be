"""Private page retrieval from two servers (PROTOCOL.md): HTTP clients and a handle client.

For every wanted page the client makes a DPF key pair, sends one key to server A and the other
to server B, and XORs the two answers. Pages are packed three per query (a query is exactly
three keys); the last query is padded with random dummy pages, so every query looks alike to a
server. Queries go in batches of at most `max_batch_queries` per request. `key_format`:
"auto" (the default) sends packed keys (docs/packed-keys.md) where both parties' /epoch list
them and the reference's v1 keys otherwise; "v1" always sends v1 keys.

Answers are checked and combined by `morphogen.client.core` (its docstring says what the
client vouches for, retries and raises); the classes here only do the I/O, over HTTP (sync and
asyncio) or Ray Serve handles (duck-typed: no Ray import). `get_with_epoch` also returns the
epoch the answer is from. `AdminClient` drives one party's admin routes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from morphogen.client.core import (
    Action,
    ClientCore,
    ReadEpoch,
    RetryPolicy,
    Send,
    Sleep,
    adrive,
    drive,
)
from morphogen.client.wire import (
    RETRY_STATUSES,
    Answer,
    DataMoved,
    EpochMismatchError,
    PageOutOfRange,
    PirError,
    PirUnavailable,
    ServerInfo,
    Transient,
    answer_from_obj,
    decode_answer,
    encode_request,
    encode_updates,
    failure_for_status,
    make_keys,
    plan_targets,
    xor_pages,
)
from morphogen.protocol.codec import (
    EPOCH_PATH,
)

# Names of this module that other code imports.
__all__ = [
    "RETRY_STATUSES", "Answer", "AsyncPirClient", "DataMoved", "EpochMismatchError",
    "HandlePirClient", "PageOutOfRange", "PirClient", "PirError", "PirUnavailable",
    "RetryPolicy", "ServerInfo", "decode_answer", "encode_request", "encode_updates",
    "make_keys", "plan_targets", "xor_pages",
]


def _error_from_response(resp: httpx.Response) -> Exception:
    code = None
    message = resp.text[:200] if resp.content else ""
    try:
        err = resp.json()["error"]
        code, message = err.get("code"), err.get("message", message)
    except Exception:  # noqa: BLE001 - non-JSON error bodies (proxies) are fine
        pass
    hint = None
    try:
        hint = float(resp.headers.get("retry-after", ""))
    except ValueError:
        pass
    return failure_for_status(resp.status_code, code, message, hint)


def _epoch_doc(resp: httpx.Response) -> Any:
    if resp.status_code != 200:
        raise _error_from_response(resp)
    try:
        return resp.json()
    except ValueError:
        raise PirError("malformed /epoch document: not JSON") from None


def _answer(resp: httpx.Response, num_queries: int) -> Answer:
    if resp.status_code != 200:
        raise _error_from_response(resp)
    return decode_answer(resp.content, resp.headers.get("content-type"), num_queries)


def check_server_url(url: str) -> str:
    """`url` as a base URL, or ValueError naming it: a URL without its scheme or host is a
    setting to fix, not a failure to retry."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ValueError(f"server URL {url!r} is not a URL ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"server URL {url!r} needs http:// or https:// and a host, "
                         "e.g. http://127.0.0.1:8000/a")
    return url.rstrip("/")


def _unreachable(client: httpx.Client | httpx.AsyncClient, exc: httpx.TransportError) -> Transient:
    return Transient(f"cannot reach {client.base_url} ({type(exc).__name__})")


def _http_pair(cls: Any, urls: tuple[str, str], encoding: str, timeout_s: float,
               connect_timeout_s: float, transport: Any) -> list[Any]:
    """The HTTP clients' shared settings check (a known body encoding, URLs with a scheme and
    a host) and their two sessions."""
    if encoding not in ("json", "msgpack"):
        raise ValueError("encoding is 'json' or 'msgpack'")
    timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
    return [cls(base_url=check_server_url(u), timeout=timeout, transport=transport)
            for u in urls]


class _Base:
    def __init__(self, *, retry: RetryPolicy | None, max_batch_queries: int | None,
                 key_format: str = "auto") -> None:
        self._core = ClientCore(retry, max_batch_queries, key_format)

    @property
    def retry(self) -> RetryPolicy:
        return self._core.retry

    @property
    def _info(self) -> ServerInfo | None:
        return self._core.info

    @_info.setter
    def _info(self, info: ServerInfo | None) -> None:
        self._core.info = info


class _Blocking(_Base):
    """The blocking calls of a client whose `_perform` blocks."""

    def _perform(self, action: Action) -> Any:
        raise NotImplementedError

    def info(self, refresh: bool = False) -> ServerInfo:
        """Both servers' GET /epoch, cached; `refresh` reads it again."""
        return drive(self._core.read_info(refresh), self._perform)

    def get(self, pages: Sequence[int], table: str | None = None) -> list[bytes]:
        """The wanted pages, in order, 4096 bytes each; with `table`, pages of that named
        table (GET /epoch's `tables`), numbered from 0 within it."""
        return drive(self._core.get(pages, table), self._perform)

    def get_with_epoch(self, pages: Sequence[int],
                       table: str | None = None) -> tuple[int, list[bytes]]:
        """`(epoch_id, pages)`: the wanted pages (one request's worth at most) as both servers
        hold them in the epoch named."""
        return drive(self._core.get_with_epoch(pages, table), self._perform)

    def get_pinned(self, pages: Sequence[int], num_pages: int | None = None,
                   table: str | None = None) -> Answer:
        """`Answer(epoch_id, identity, pages)` of one request, only from data /epoch named
        when the keys were planned; `DataMoved` otherwise (`ClientCore.get_pinned`)."""
        return drive(self._core.get_pinned(pages, num_pages, table), self._perform)

    def get_page(self, page: int, table: str | None = None) -> bytes:
        return self.get([page], table)[0]


# --------------------------------------------------------------------------- HTTP clients


class PirClient(_Blocking):
    """Synchronous two-server client over HTTP; both servers are asked concurrently.

    >>> with PirClient("http://a:8000", "http://b:8000") as c:   # doctest: +SKIP
    ...     page = c.get_page(42)
    """

    def __init__(
        self,
        server_a: str,
        server_b: str,
        *,
        encoding: str = "json",
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        retry: RetryPolicy | None = None,
        max_batch_queries: int | None = None,
        key_format: str = "auto",
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(retry=retry, max_batch_queries=max_batch_queries,
                         key_format=key_format)
        self.encoding = encoding
        self._http = _http_pair(httpx.Client, (server_a, server_b), encoding, timeout_s,
                                connect_timeout_s, transport)
        self._pool = ThreadPoolExecutor(64, thread_name_prefix="pir")

    def close(self) -> None:
        for c in self._http:
            c.close()
        self._pool.shutdown(wait=False)

    def __enter__(self) -> PirClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _both(self, fn: Callable[[httpx.Client, Any], Any], args: tuple[Any, Any]) -> tuple:
        # B's request on a pool thread, A's on the calling thread: both in flight at once, and
        # one client shared by many threads is not throttled by the pool's size.
        fut_b = self._pool.submit(fn, self._http[1], args[1])
        try:
            a = fn(self._http[0], args[0])
        finally:
            b = fut_b.result()
        return a, b

    @staticmethod
    def _get_epoch(client: httpx.Client, _: Any) -> Any:
        try:
            return _epoch_doc(client.get(EPOCH_PATH))
        except httpx.TransportError as exc:
            raise _unreachable(client, exc) from None

    def _post(self, client: httpx.Client, queries: list[list[bytes]],
              table: str | None) -> Answer:
        path, body, headers = encode_request(queries, self.encoding, table)
        try:
            return _answer(client.post(path, content=body, headers=headers), len(queries))
        except httpx.TransportError as exc:
            raise _unreachable(client, exc) from None

    def _perform(self, action: Action) -> Any:
        if isinstance(action, Sleep):
            time.sleep(action.seconds)
            return None
        if isinstance(action, ReadEpoch):
            return self._both(self._get_epoch, (None, None))
        return self._both(lambda c, q: self._post(c, q, action.table),
                          (action.queries_a, action.queries_b))


class AsyncPirClient(_Base):
    """The asyncio twin of PirClient."""

    def __init__(
        self,
        server_a: str,
        server_b: str,
        *,
        encoding: str = "json",
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        retry: RetryPolicy | None = None,
        max_batch_queries: int | None = None,
        key_format: str = "auto",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(retry=retry, max_batch_queries=max_batch_queries,
                         key_format=key_format)
        self.encoding = encoding
        self._http = _http_pair(httpx.AsyncClient, (server_a, server_b), encoding, timeout_s,
                                connect_timeout_s, transport)

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self._http))

    async def __aenter__(self) -> AsyncPirClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @staticmethod
    async def _get_epoch(client: httpx.AsyncClient) -> Any:
        try:
            return _epoch_doc(await client.get(EPOCH_PATH))
        except httpx.TransportError as exc:
            raise _unreachable(client, exc) from None

    async def _post(self, client: httpx.AsyncClient, queries: list[list[bytes]],
                    table: str | None = None) -> Answer:
        path, body, headers = encode_request(queries, self.encoding, table)
        try:
            resp = await client.post(path, content=body, headers=headers)
        except httpx.TransportError as exc:
            raise _unreachable(client, exc) from None
        return _answer(resp, len(queries))

    async def _perform(self, action: Action) -> Any:
        if isinstance(action, Sleep):
            await asyncio.sleep(action.seconds)
            return None
        if isinstance(action, ReadEpoch):
            return tuple(await asyncio.gather(*(self._get_epoch(c) for c in self._http)))
        return tuple(await asyncio.gather(
            self._post(self._http[0], action.queries_a, action.table),
            self._post(self._http[1], action.queries_b, action.table)))

    async def info(self, refresh: bool = False) -> ServerInfo:
        return await adrive(self._core.read_info(refresh), self._perform)

    async def get(self, pages: Sequence[int], table: str | None = None) -> list[bytes]:
        """As `PirClient.get`."""
        return await adrive(self._core.get(pages, table), self._perform)

    async def get_with_epoch(self, pages: Sequence[int],
                             table: str | None = None) -> tuple[int, list[bytes]]:
        """`(epoch_id, pages)`, as `PirClient.get_with_epoch`."""
        return await adrive(self._core.get_with_epoch(pages, table), self._perform)

    async def get_pinned(self, pages: Sequence[int], num_pages: int | None = None,
                         table: str | None = None) -> Answer:
        """As `PirClient.get_pinned`."""
        return await adrive(self._core.get_pinned(pages, num_pages, table), self._perform)

    async def get_page(self, page: int, table: str | None = None) -> bytes:
        return (await self.get([page], table))[0]


# --------------------------------------------------------------------------- handle client


def _handle_error(exc: BaseException) -> Exception:
    """Map an exception from a router handle: WireError 4xx -> PirError, anything else
    (503, a dead replica, a timeout) -> retry."""
    cause = getattr(exc, "cause", None)
    status = getattr(exc, "status", None)
    if status is None:
        status = getattr(cause, "status", None)
    if isinstance(status, int) and 400 <= status < 500 and status != 429:
        code = getattr(exc, "code", None) or getattr(cause, "code", None)
        message = getattr(exc, "message", None) or getattr(cause, "message", str(exc))
        return PirError(f"refused ({status}): {message}", status, code)
    hint = getattr(exc, "retry_after", None)
    if hint is None:
        hint = getattr(cause, "retry_after", None)
    return Transient(type(exc).__name__ if status is None else f"status {status}",
                     float(hint) if isinstance(hint, int | float) else None)


class HandlePirClient(_Blocking):
    """Two-party client for driver scripts holding the two applications' router handles
    (`serve.get_app_handle("a")`, ...). `get`, `get_with_epoch`, `get_pinned` and `info` are
    synchronous; `aget`, `aget_with_epoch`, `aget_pinned` and `ainfo` are for asyncio code (a
    handle's result cannot be waited for synchronously inside an event loop)."""

    def __init__(
        self,
        handle_a: Any,
        handle_b: Any,
        *,
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
        max_batch_queries: int | None = None,
        key_format: str = "auto",
    ) -> None:
        super().__init__(retry=retry, max_batch_queries=max_batch_queries,
                         key_format=key_format)
        self._handles = (handle_a, handle_b)
        self.timeout_s = timeout_s

    def _calls(self, action: ReadEpoch | Send) -> tuple[Any, Any]:
        """Both requests, issued before either answer is awaited."""
        ha, hb = self._handles
        if isinstance(action, ReadEpoch):
            return ha.epoch.remote(), hb.epoch.remote()
        if action.table is None:  # the reference's call, for a router without tables
            return (ha.query_batch.remote(action.queries_a),
                    hb.query_batch.remote(action.queries_b))
        return (ha.query_batch.remote(action.queries_a, action.table),
                hb.query_batch.remote(action.queries_b, action.table))

    @staticmethod
    def _decode(action: ReadEpoch | Send, replies: tuple[Any, Any]) -> Any:
        if isinstance(action, ReadEpoch):
            return replies
        return (answer_from_obj(replies[0], len(action.queries_a)),
                answer_from_obj(replies[1], len(action.queries_b)))

    def _result(self, response: Any) -> Any:
        try:
            return response.result(timeout_s=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - classified below
            raise _handle_error(exc) from None

    async def _aresult(self, response: Any) -> Any:
        try:
            return await asyncio.wait_for(_awaited(response), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - classified below
            raise _handle_error(exc) from None

    def _perform(self, action: Action) -> Any:
        if isinstance(action, Sleep):
            time.sleep(action.seconds)
            return None
        ra, rb = self._calls(action)
        return self._decode(action, (self._result(ra), self._result(rb)))

    async def _aperform(self, action: Action) -> Any:
        if isinstance(action, Sleep):
            await asyncio.sleep(action.seconds)
            return None
        ra, rb = self._calls(action)
        replies = await asyncio.gather(self._aresult(ra), self._aresult(rb))
        return self._decode(action, (replies[0], replies[1]))

    async def ainfo(self, refresh: bool = False) -> ServerInfo:
        return await adrive(self._core.read_info(refresh), self._aperform)

    async def aget(self, pages: Sequence[int], table: str | None = None) -> list[bytes]:
        return await adrive(self._core.get(pages, table), self._aperform)

    async def aget_with_epoch(self, pages: Sequence[int],
                              table: str | None = None) -> tuple[int, list[bytes]]:
        return await adrive(self._core.get_with_epoch(pages, table), self._aperform)

    async def aget_pinned(self, pages: Sequence[int], num_pages: int | None = None,
                          table: str | None = None) -> Answer:
        return await adrive(self._core.get_pinned(pages, num_pages, table), self._aperform)


async def _awaited(response: Any) -> Any:
    return await response
