"""Private page retrieval from two servers (PROTOCOL.md): HTTP clients and a handle client.

For every wanted page the client makes a DPF key pair, sends one key to server A and the other
to server B, and XORs the two answers. Pages are packed three per query (a query is exactly
three keys); the last query is padded with random dummy pages, so every query looks alike to a
server. Queries go in batches of at most `max_batch_queries` per request.

Both answers of a batch must carry the same epoch id; on a mismatch, a 503/502/504/429 or a
connection error the batch is retried with fresh keys and exponential backoff, a bounded number
of times (a persistent epoch mismatch ends in `EpochMismatchError`: the two servers do not
serve the same data). A `bad_domain` refusal after a snapshot rotation changed the servers'
domain makes the client re-read GET /epoch and retry. Other 4xx answers are the caller's
mistake and are raised at once. `get_with_epoch` also returns the epoch the answer is from.

Plain Python plus httpx and msgpack: no Ray, no pydantic (the handle client duck-types Serve
handles).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import msgpack
import numpy as np

from morphogen.codec import (
    ADMIN_SNAPSHOT_PATH,
    ADMIN_STATUS_PATH,
    ADMIN_UPDATES_PATH,
    BATCH_PATH,
    EPOCH_PATH,
    JSON_TYPE,
    KEYS_PER_QUERY,
    MAX_BATCH_QUERIES,
    MSGPACK_TYPE,
    PAGE_SIZE,
    QUERY_PATH,
    from_hex,
    is_msgpack,
    to_hex,
)
from morphogen.dpf import generate_keys

RETRY_STATUSES = frozenset({429, 502, 503, 504})


class PirError(Exception):
    """A request the servers refused (4xx/5xx) or a malformed answer."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class PirUnavailable(PirError):
    """No consistent answer after every retry (epoch mismatch, 503, connection errors)."""


class EpochMismatchError(PirUnavailable):
    """Servers A and B kept answering from different epochs: they do not hold the same data
    (one party missed an update or a rotation, or they are updated at different times)."""


class _Retry(Exception):
    def __init__(self, reason: str, delay: float | None = None, kind: str = "other") -> None:
        super().__init__(reason)
        self.delay = delay
        self.kind = kind  # "epoch": A and B answered from different epochs


def _give_up(attempts: int, last: _Retry | None) -> PirUnavailable:
    if last is not None and last.kind == "epoch":
        return EpochMismatchError(
            f"servers A and B answered from different epochs on all {attempts} attempts "
            f"({last}): they do not serve the same data; both parties must receive the same "
            "updates and rotations in the same order"
        )
    return PirUnavailable(f"gave up after {attempts} attempts: {last or 'no attempt'}")


def _epoch_retry(ea: int, eb: int) -> _Retry:
    return _Retry(f"epochs differ (A {ea}, B {eb})", kind="epoch")


@dataclass(frozen=True)
class ServerInfo:
    """What both servers advertise (GET /epoch) and the client must use."""

    num_pages: int
    domain_bits: int
    epoch_id: int
    max_batch_queries: int = MAX_BATCH_QUERIES


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    backoff_s: float = 0.1
    max_backoff_s: float = 2.0

    def delay(self, attempt: int, hint: float | None = None) -> float:
        base = min(self.max_backoff_s, self.backoff_s * (2**attempt))
        if hint is not None:
            base = min(self.max_backoff_s, max(base, hint))
        # Jitter so that many clients retrying together do not come back in lockstep.
        return base * (0.5 + secrets.randbelow(1000) / 2000)


# --------------------------------------------------------------------------- pure helpers


def plan_targets(pages: Sequence[int], num_pages: int) -> list[int]:
    """The wanted pages padded with random dummies to a whole number of queries."""
    out = []
    for p in pages:
        p = int(p)
        if not 0 <= p < num_pages:
            raise ValueError(f"page {p} is outside 0..{num_pages - 1}")
        out.append(p)
    while len(out) % KEYS_PER_QUERY:
        out.append(secrets.randbelow(num_pages))
    return out


def make_keys(
    targets: Sequence[int], domain_bits: int
) -> tuple[list[list[bytes]], list[list[bytes]]]:
    """Fresh key pairs for `targets`, grouped as queries: (queries for A, queries for B)."""
    qa: list[list[bytes]] = []
    qb: list[list[bytes]] = []
    for i in range(0, len(targets), KEYS_PER_QUERY):
        ka, kb = [], []
        for t in targets[i : i + KEYS_PER_QUERY]:
            k0, k1 = generate_keys(domain_bits, t)
            ka.append(k0.to_bytes())
            kb.append(k1.to_bytes())
        qa.append(ka)
        qb.append(kb)
    return qa, qb


def encode_request(queries: list[list[bytes]], encoding: str) -> tuple[str, bytes, dict[str, str]]:
    """(path, body, headers) of a single query (one) or a batch request (several)."""
    batch = len(queries) != 1
    path = BATCH_PATH if batch else QUERY_PATH
    if encoding == "msgpack":
        obj: Any = {"queries": [{"keys": q} for q in queries]} if batch else {"keys": queries[0]}
        body = msgpack.packb(obj, use_bin_type=True)
        mt = MSGPACK_TYPE
    else:
        if batch:
            obj = {"queries": [{"keys": [to_hex(k) for k in q]} for q in queries]}
        else:
            obj = {"keys": [to_hex(k) for k in queries[0]]}
        body = json.dumps(obj, separators=(",", ":")).encode()
        mt = JSON_TYPE
    return path, body, {"Content-Type": mt, "Accept": mt}


def decode_answer(
    body: bytes, content_type: str | None, num_queries: int
) -> tuple[int, list[bytes]]:
    """(epoch_id, accumulators in query order) of a single or batch response."""
    try:
        if is_msgpack(content_type):
            obj = msgpack.unpackb(body, raw=False)
        else:
            obj = json.loads(body)
        epoch = obj["epoch_id"]
        if num_queries == 1 and "pages" in obj:
            groups = [obj["pages"]]
        else:
            groups = [r["pages"] for r in obj["results"]]
        if len(groups) != num_queries or any(len(g) != KEYS_PER_QUERY for g in groups):
            raise ValueError("wrong number of answers")
        pages = [p if isinstance(p, bytes) else from_hex(p) for g in groups for p in g]
    except (ValueError, KeyError, TypeError) as exc:
        raise PirError(f"malformed answer: {exc}") from None
    if not isinstance(epoch, int) or any(len(p) != PAGE_SIZE for p in pages):
        raise PirError("malformed answer: bad epoch or page size")
    return epoch, pages


def xor_pages(a: Sequence[bytes], b: Sequence[bytes]) -> list[bytes]:
    return [
        np.bitwise_xor(np.frombuffer(x, np.uint8), np.frombuffer(y, np.uint8)).tobytes()
        for x, y in zip(a, b, strict=True)
    ]


def _error_from_response(resp: httpx.Response) -> Exception:
    code = None
    message = resp.text[:200] if resp.content else ""
    try:
        err = resp.json()["error"]
        code, message = err.get("code"), err.get("message", message)
    except Exception:  # noqa: BLE001 - non-JSON error bodies (proxies) are fine
        pass
    if resp.status_code in RETRY_STATUSES:
        hint = None
        try:
            hint = float(resp.headers.get("retry-after", ""))
        except ValueError:
            pass
        return _Retry(f"HTTP {resp.status_code} {code or ''}".strip(), hint)
    return PirError(f"HTTP {resp.status_code}: {message}", resp.status_code, code)


def _info_from_epoch(doc_a: dict[str, Any], doc_b: dict[str, Any]) -> ServerInfo:
    try:
        pa, pb = doc_a["page_pir"], doc_b["page_pir"]
        if (pa["num_pages"], pa["domain_bits"]) != (pb["num_pages"], pb["domain_bits"]):
            # retried: during a snapshot rotation one party may switch before the other
            raise _Retry(
                "the two servers serve different matrices (A: {} pages, domain {}; B: {} "
                "pages, domain {})".format(pa["num_pages"], pa["domain_bits"],
                                          pb["num_pages"], pb["domain_bits"]),
                kind="matrix",
            )
        max_batch = min(
            int(pa.get("max_batch_queries", MAX_BATCH_QUERIES)),
            int(pb.get("max_batch_queries", MAX_BATCH_QUERIES)),
        )
        return ServerInfo(int(pa["num_pages"]), int(pa["domain_bits"]), int(doc_a["epoch_id"]),
                          max_batch)
    except (KeyError, TypeError, ValueError) as exc:
        raise PirError(f"malformed /epoch document: {exc}") from None


def _http_timeout(encoding: str, timeout_s: float, connect_timeout_s: float) -> httpx.Timeout:
    """The HTTP clients' shared settings check: a known body encoding and their timeouts."""
    if encoding not in ("json", "msgpack"):
        raise ValueError("encoding is 'json' or 'msgpack'")
    return httpx.Timeout(timeout_s, connect=connect_timeout_s)


class _Base:
    def __init__(
        self, *, retry: RetryPolicy | None, max_batch_queries: int | None
    ) -> None:
        self.retry = retry or RetryPolicy()
        self._max_batch = max_batch_queries
        self._info: ServerInfo | None = None

    def _chunks(self, targets: list[int]) -> list[list[int]]:
        assert self._info is not None
        step = self._pages_per_request()
        return [targets[i : i + step] for i in range(0, len(targets), step)]

    def _pages_per_request(self) -> int:
        assert self._info is not None
        per = min(self._max_batch or MAX_BATCH_QUERIES, self._info.max_batch_queries)
        return per * KEYS_PER_QUERY

    def _one_request(self, pages: Sequence[int]) -> list[int]:
        """Targets of `get_with_epoch`: all in one request, so the answer has one epoch."""
        assert self._info is not None
        if not pages:
            raise ValueError("no pages asked")
        targets = plan_targets(pages, self._info.num_pages)
        if len(targets) > self._pages_per_request():
            raise ValueError(
                f"get_with_epoch takes at most {self._pages_per_request()} pages (one request)"
            )
        return targets

    @staticmethod
    def _domain_retry(exc: PirError, used: ServerInfo, fresh: ServerInfo, refusals: int) -> bool:
        """Whether a `bad_domain` refusal is worth a retry with keys for `fresh`: the servers'
        domain moved since the keys were made (a snapshot rotation), or it is the first refusal
        of this fetch (a router may only now have seen a rotation that /epoch already shows).
        A repeated refusal without any change is a client bug and is raised."""
        moved = (fresh.domain_bits, fresh.num_pages) != (used.domain_bits, used.num_pages)
        return exc.code == "bad_domain" and (moved or refusals == 1)


# --------------------------------------------------------------------------- HTTP clients


class PirClient(_Base):
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
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(retry=retry, max_batch_queries=max_batch_queries)
        timeout = _http_timeout(encoding, timeout_s, connect_timeout_s)
        self.encoding = encoding
        self._http = [
            httpx.Client(base_url=u.rstrip("/"), timeout=timeout, transport=transport)
            for u in (server_a, server_b)
        ]
        self._pool = ThreadPoolExecutor(64, thread_name_prefix="pir")

    def close(self) -> None:
        for c in self._http:
            c.close()
        self._pool.shutdown(wait=False)

    def __enter__(self) -> PirClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _both(self, fn: Callable[[httpx.Client, Any], Any], args: tuple[Any, Any]) -> list[Any]:
        # B's request on a pool thread, A's on the calling thread: both in flight at once, and
        # one client shared by many threads is not throttled by the pool's size.
        fut_b = self._pool.submit(fn, self._http[1], args[1])
        try:
            a = fn(self._http[0], args[0])
        finally:
            b = fut_b.result()
        return [a, b]

    def _with_retries(self, step: Callable[[], Any]) -> Any:
        last: _Retry | None = None
        for attempt in range(self.retry.attempts):
            try:
                return step()
            except _Retry as r:
                last = r
                if attempt + 1 < self.retry.attempts:
                    time.sleep(self.retry.delay(attempt, r.delay))
        raise _give_up(self.retry.attempts, last)

    @staticmethod
    def _get_epoch(client: httpx.Client, _: Any) -> dict[str, Any]:
        try:
            resp = client.get(EPOCH_PATH)
        except httpx.TransportError as exc:
            raise _Retry(f"{type(exc).__name__}") from None
        if resp.status_code != 200:
            raise _error_from_response(resp)
        return resp.json()

    def info(self, refresh: bool = False) -> ServerInfo:
        if self._info is None or refresh:
            self._info = self._with_retries(
                lambda: _info_from_epoch(*self._both(self._get_epoch, (None, None)))
            )
        return self._info

    def _post(self, client: httpx.Client, queries: list[list[bytes]]) -> tuple[int, list[bytes]]:
        path, body, headers = encode_request(queries, self.encoding)
        try:
            resp = client.post(path, content=body, headers=headers)
        except httpx.TransportError as exc:
            raise _Retry(f"{type(exc).__name__}") from None
        if resp.status_code != 200:
            raise _error_from_response(resp)
        return decode_answer(resp.content, resp.headers.get("content-type"), len(queries))

    def _fetch(self, targets: list[int]) -> tuple[int, list[bytes]]:
        refusals = 0

        def step() -> tuple[int, list[bytes]]:
            nonlocal refusals
            info = self.info()
            qa, qb = make_keys(targets, info.domain_bits)
            try:
                (ea, pa), (eb, pb) = self._both(self._post, (qa, qb))
            except PirError as exc:
                if exc.code == "bad_domain":
                    refusals += 1
                    if self._domain_retry(exc, info, self.info(refresh=True), refusals):
                        raise _Retry("the servers' key domain changed (rotation)") from None
                raise
            if ea != eb:
                raise _epoch_retry(ea, eb)
            return ea, xor_pages(pa, pb)

        return self._with_retries(step)

    def get(self, pages: Sequence[int]) -> list[bytes]:
        """The wanted pages, in order, 4096 bytes each."""
        if not pages:
            return []
        info = self.info()
        targets = plan_targets(pages, info.num_pages)
        out: list[bytes] = []
        for chunk in self._chunks(targets):
            out.extend(self._fetch(chunk)[1])
        return out[: len(pages)]

    def get_with_epoch(self, pages: Sequence[int]) -> tuple[int, list[bytes]]:
        """`(epoch_id, pages)`: the wanted pages (one request's worth at most) as both servers
        hold them in the epoch named."""
        self.info()
        epoch_id, got = self._fetch(self._one_request(pages))
        return epoch_id, got[: len(pages)]

    def get_page(self, page: int) -> bytes:
        return self.get([page])[0]


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
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(retry=retry, max_batch_queries=max_batch_queries)
        timeout = _http_timeout(encoding, timeout_s, connect_timeout_s)
        self.encoding = encoding
        self._http = [
            httpx.AsyncClient(base_url=u.rstrip("/"), timeout=timeout, transport=transport)
            for u in (server_a, server_b)
        ]

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self._http))

    async def __aenter__(self) -> AsyncPirClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _with_retries(self, step: Callable[[], Any]) -> Any:
        last: _Retry | None = None
        for attempt in range(self.retry.attempts):
            try:
                return await step()
            except _Retry as r:
                last = r
                if attempt + 1 < self.retry.attempts:
                    await asyncio.sleep(self.retry.delay(attempt, r.delay))
        raise _give_up(self.retry.attempts, last)

    @staticmethod
    async def _get_epoch(client: httpx.AsyncClient) -> dict[str, Any]:
        try:
            resp = await client.get(EPOCH_PATH)
        except httpx.TransportError as exc:
            raise _Retry(f"{type(exc).__name__}") from None
        if resp.status_code != 200:
            raise _error_from_response(resp)
        return resp.json()

    async def info(self, refresh: bool = False) -> ServerInfo:
        if self._info is None or refresh:

            async def step() -> ServerInfo:
                a, b = await asyncio.gather(*(self._get_epoch(c) for c in self._http))
                return _info_from_epoch(a, b)

            self._info = await self._with_retries(step)
        return self._info

    async def _post(
        self, client: httpx.AsyncClient, queries: list[list[bytes]]
    ) -> tuple[int, list[bytes]]:
        path, body, headers = encode_request(queries, self.encoding)
        try:
            resp = await client.post(path, content=body, headers=headers)
        except httpx.TransportError as exc:
            raise _Retry(f"{type(exc).__name__}") from None
        if resp.status_code != 200:
            raise _error_from_response(resp)
        return decode_answer(resp.content, resp.headers.get("content-type"), len(queries))

    async def _fetch(self, targets: list[int]) -> tuple[int, list[bytes]]:
        refusals = 0

        async def step() -> tuple[int, list[bytes]]:
            nonlocal refusals
            info = await self.info()
            qa, qb = make_keys(targets, info.domain_bits)
            try:
                (ea, pa), (eb, pb) = await asyncio.gather(
                    self._post(self._http[0], qa), self._post(self._http[1], qb)
                )
            except PirError as exc:
                if exc.code == "bad_domain":
                    refusals += 1
                    if self._domain_retry(exc, info, await self.info(refresh=True), refusals):
                        raise _Retry("the servers' key domain changed (rotation)") from None
                raise
            if ea != eb:
                raise _epoch_retry(ea, eb)
            return ea, xor_pages(pa, pb)

        return await self._with_retries(step)

    async def get(self, pages: Sequence[int]) -> list[bytes]:
        if not pages:
            return []
        info = await self.info()
        targets = plan_targets(pages, info.num_pages)
        out: list[bytes] = []
        for chunk in self._chunks(targets):
            out.extend((await self._fetch(chunk))[1])
        return out[: len(pages)]

    async def get_with_epoch(self, pages: Sequence[int]) -> tuple[int, list[bytes]]:
        """`(epoch_id, pages)`, as `PirClient.get_with_epoch`."""
        await self.info()
        epoch_id, got = await self._fetch(self._one_request(pages))
        return epoch_id, got[: len(pages)]

    async def get_page(self, page: int) -> bytes:
        return (await self.get([page]))[0]


# --------------------------------------------------------------------------- admin client


def encode_updates(changes: Sequence[tuple[int, str, bytes]], encoding: str = "msgpack") -> bytes:
    """The body of `POST /admin/updates` for `(page, "diff" | "data", bytes)` triples."""
    items: list[dict[str, Any]] = []
    for page, kind, raw in changes:
        if kind not in ("diff", "data"):
            raise ValueError("an update is a 'diff' (XOR) or a 'data' (replacement)")
        items.append({"page": int(page), kind: bytes(raw) if encoding == "msgpack"
                      else to_hex(raw)})
    if encoding == "msgpack":
        return msgpack.packb({"updates": items}, use_bin_type=True)
    return json.dumps({"updates": items}, separators=(",", ":")).encode()


class AdminClient:
    """The admin routes of ONE server (a party's router): page updates, snapshot rotation,
    status. Send every operation to both parties, in the same order. The token is sent as a
    bearer token and kept out of reprs and error messages."""

    def __init__(
        self,
        server: str,
        token: str,
        *,
        encoding: str = "msgpack",
        timeout_s: float = 600.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if encoding not in ("json", "msgpack"):
            raise ValueError("encoding is 'json' or 'msgpack'")
        self.encoding = encoding
        self._http = httpx.Client(
            base_url=server.rstrip("/"), timeout=httpx.Timeout(timeout_s, connect=10.0),
            transport=transport, headers={"Authorization": f"Bearer {token}"},
        )

    def __repr__(self) -> str:
        return f"AdminClient({str(self._http.base_url)!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, path: str, obj: Any | None = None, body: bytes | None = None) -> dict:
        if obj is None and body is None:
            resp = self._http.get(path)
        else:
            if body is None:
                body = (msgpack.packb(obj, use_bin_type=True) if self.encoding == "msgpack"
                        else json.dumps(obj).encode())
            mt = MSGPACK_TYPE if self.encoding == "msgpack" else JSON_TYPE
            resp = self._http.post(path, content=body, headers={"Content-Type": mt})
        if resp.status_code != 200:
            err = _error_from_response(resp)
            if isinstance(err, _Retry):
                raise PirUnavailable(f"HTTP {resp.status_code}: {_message(resp)}",
                                     resp.status_code, "unavailable")
            raise err
        return resp.json()

    def updates(self, changes: Sequence[tuple[int, str, bytes]]) -> dict:
        """Publish the next epoch with these changes; `{"epoch_id", "applied"}`."""
        return self._send(ADMIN_UPDATES_PATH, body=encode_updates(changes, self.encoding))

    def snapshot(self, path: str) -> dict:
        """Rotate to the snapshot at `path` (under the server's admin_snapshot_dir)."""
        return self._send(ADMIN_SNAPSHOT_PATH, {"path": str(path)})

    def status(self) -> dict:
        return self._send(ADMIN_STATUS_PATH)


def _message(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except Exception:  # noqa: BLE001
        return resp.text[:200]


# --------------------------------------------------------------------------- handle client


def _handle_error(exc: BaseException) -> Exception:
    """Map an exception from a router handle: WireError 4xx -> PirError, anything else
    (503, a dead replica, a timeout) -> retry."""
    status = getattr(exc, "status", None)
    if status is None:
        status = getattr(getattr(exc, "cause", None), "status", None)
    if isinstance(status, int) and 400 <= status < 500 and status != 429:
        code = getattr(exc, "code", None) or getattr(getattr(exc, "cause", None), "code", None)
        message = getattr(exc, "message", None) or getattr(
            getattr(exc, "cause", None), "message", str(exc)
        )
        return PirError(f"refused ({status}): {message}", status, code)
    return _Retry(type(exc).__name__ if status is None else f"status {status}")


def _answer_pages(ans: dict[str, Any], num_queries: int) -> tuple[int, list[bytes]]:
    groups = [r["pages"] for r in ans["results"]]
    if len(groups) != num_queries:
        raise PirError("malformed answer: wrong number of results")
    return int(ans["epoch_id"]), [p for g in groups for p in g]


class HandlePirClient(_Base):
    """Two-party client for driver scripts holding the two applications' router handles
    (`serve.get_app_handle("a")`, ...). `get` is synchronous, `aget` is for asyncio code."""

    def __init__(
        self,
        handle_a: Any,
        handle_b: Any,
        *,
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
        max_batch_queries: int | None = None,
    ) -> None:
        super().__init__(retry=retry, max_batch_queries=max_batch_queries)
        self._handles = (handle_a, handle_b)
        self.timeout_s = timeout_s

    def _result(self, response: Any) -> Any:
        try:
            return response.result(timeout_s=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - classified below
            raise _handle_error(exc) from None

    def _retrying(self, step: Callable[[], Any]) -> Any:
        last: _Retry | None = None
        for attempt in range(self.retry.attempts):
            try:
                return step()
            except _Retry as r:
                last = r
                if attempt + 1 < self.retry.attempts:
                    time.sleep(self.retry.delay(attempt, r.delay))
        raise _give_up(self.retry.attempts, last)

    def info(self, refresh: bool = False) -> ServerInfo:
        if self._info is None or refresh:

            def step() -> ServerInfo:
                ra, rb = (h.epoch.remote() for h in self._handles)
                return _info_from_epoch(self._result(ra), self._result(rb))

            self._info = self._retrying(step)
        return self._info

    def _fetch(self, targets: list[int]) -> tuple[int, list[bytes]]:
        refusals = 0

        def step() -> tuple[int, list[bytes]]:
            nonlocal refusals
            info = self.info()
            qa, qb = make_keys(targets, info.domain_bits)
            try:
                ra = self._handles[0].query_batch.remote(qa)
                rb = self._handles[1].query_batch.remote(qb)
                ea, pa = _answer_pages(self._result(ra), len(qa))
                eb, pb = _answer_pages(self._result(rb), len(qb))
            except PirError as exc:
                if exc.code == "bad_domain":
                    refusals += 1
                    if self._domain_retry(exc, info, self.info(refresh=True), refusals):
                        raise _Retry("the servers' key domain changed (rotation)") from None
                raise
            if ea != eb:
                raise _epoch_retry(ea, eb)
            return ea, xor_pages(pa, pb)

        return self._retrying(step)

    def get(self, pages: Sequence[int]) -> list[bytes]:
        if not pages:
            return []
        info = self.info()
        out: list[bytes] = []
        for chunk in self._chunks(plan_targets(pages, info.num_pages)):
            out.extend(self._fetch(chunk)[1])
        return out[: len(pages)]

    def get_with_epoch(self, pages: Sequence[int]) -> tuple[int, list[bytes]]:
        """`(epoch_id, pages)`, as `PirClient.get_with_epoch`."""
        self.info()
        epoch_id, got = self._fetch(self._one_request(pages))
        return epoch_id, got[: len(pages)]

    async def _aresult(self, response: Any) -> Any:
        try:
            return await asyncio.wait_for(_awaited(response), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - classified below
            raise _handle_error(exc) from None

    async def aget(self, pages: Sequence[int]) -> list[bytes]:
        if not pages:
            return []
        if self._info is None:

            async def fetch_info() -> ServerInfo:
                ra, rb = (h.epoch.remote() for h in self._handles)
                a, b = await asyncio.gather(self._aresult(ra), self._aresult(rb))
                return _info_from_epoch(a, b)

            self._info = await self._aretrying(fetch_info)
        info = self._info
        out: list[bytes] = []
        for chunk in self._chunks(plan_targets(pages, info.num_pages)):

            async def step(chunk: list[int] = chunk) -> list[bytes]:
                qa, qb = make_keys(chunk, info.domain_bits)
                ra = self._handles[0].query_batch.remote(qa)
                rb = self._handles[1].query_batch.remote(qb)
                a, b = await asyncio.gather(self._aresult(ra), self._aresult(rb))
                ea, pa = _answer_pages(a, len(qa))
                eb, pb = _answer_pages(b, len(qb))
                if ea != eb:
                    raise _epoch_retry(ea, eb)
                return xor_pages(pa, pb)

            out.extend(await self._aretrying(step))
        return out[: len(pages)]

    async def _aretrying(self, step: Callable[[], Any]) -> Any:
        last: _Retry | None = None
        for attempt in range(self.retry.attempts):
            try:
                return await step()
            except _Retry as r:
                last = r
                if attempt + 1 < self.retry.attempts:
                    await asyncio.sleep(self.retry.delay(attempt, r.delay))
        raise _give_up(self.retry.attempts, last)


async def _awaited(response: Any) -> Any:
    return await response
