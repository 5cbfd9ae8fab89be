"""The ingress of one party as a Serve deployment: HTTP (PROTOCOL.md section 5, JSON or msgpack)
and a handle API, over `morphogen.party.router.Party`.

This file only adapts: it turns HTTP requests into `Party` calls (content type, body limits,
admin bearer token, error bodies) and shard deployment handles into `ShardLink`s. Validation,
coalescing, combining under one epoch identity, `/epoch` and admin publication are the party's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from deployments import start_board
from deployments.metrics import ServeMetrics
from morphogen.config import ADMIN_NEEDS_LOG, PartyConfig
from morphogen.constants import MAX_PAGES
from morphogen.party import admin_wire, wire
from morphogen.party.admin_status import party_status
from morphogen.party.autoscaling import HELD_QUERIES
from morphogen.party.combine import ShardFailure
from morphogen.party.redact import redacted_traceback
from morphogen.party.router import Party
from morphogen.party.shards import Layout
from morphogen.protocol.codec import (
    ADMIN_SNAPSHOT_PATH,
    ADMIN_STATUS_PATH,
    ADMIN_UPDATES_PATH,
    BATCH_HEADER,
    BATCH_PATH,
    DIGEST_HEADER,
    EPOCH_PATH,
    HEALTH_PATH,
    JSON_TYPE,
    MSGPACK_TYPE,
    PARENT_HEADER,
    PART_HEADER,
    PUBLICATION_HEADER,
    QUERY_PATH,
    ErrorCode,
    WireError,
)
from morphogen.protocol.cors import CORS_ROUTES, Cors
from morphogen.protocol.identity import EpochIdentity
from morphogen.publication.admin_auth import AdminAccess, WatchedAdminGuard
from morphogen.publication.log import EpochLog
from morphogen.snapshot.tables import Table
from morphogen.storage.settings import configure

log = logging.getLogger("ray.serve")

_ROUTES = {
    QUERY_PATH: "POST",
    BATCH_PATH: "POST",
    HEALTH_PATH: "GET",
    EPOCH_PATH: "GET",
    ADMIN_UPDATES_PATH: "POST",
    ADMIN_SNAPSHOT_PATH: "POST",
    ADMIN_STATUS_PATH: "GET",
}
_ADMIN_PATHS = frozenset({ADMIN_UPDATES_PATH, ADMIN_SNAPSHOT_PATH, ADMIN_STATUS_PATH})
STARTS_REFRESH_S = 10.0  # the replica-start gauges: a slow-moving count, no need for more


class _HandleLink:
    """A shard deployment handle as the party's `ShardLink`: scans and metadata go to one
    replica (Serve picks it); publication steps go to every running replica (`broadcast`)."""

    def __init__(self, handle: DeploymentHandle) -> None:
        self._h = handle

    async def scan(self, batch: Any, want: EpochIdentity | None,
                   table: Any = None) -> tuple[EpochIdentity, Any]:
        return await self._h.scan.remote(batch, want, table)

    async def info(self) -> dict[str, Any]:
        return await self._h.info.remote()

    async def _everywhere(self, method: str, *args: Any) -> list[Any]:
        """`method` on every replica running now. A replica that died meanwhile is skipped
        (it replays the epoch log when it comes back); any other failure is raised."""
        results = await self._h.broadcast(method, *args).results_async(return_exceptions=True)
        done = []
        for r in results:
            if isinstance(r, RayActorError):
                log.warning("a shard replica died during %s; it replays the epoch log", method)
                continue
            if isinstance(r, BaseException):
                raise r
            done.append(r)
        if not done:
            raise ShardFailure(f"no shard replica answered {method}")
        return done

    async def replicas(self) -> list[dict[str, Any]]:
        return await self._everywhere("info")

    async def prepare_updates(self, epoch_id: int, changes: Any, base_epoch: int, op: str,
                              target: str) -> int:
        return (await self._everywhere("prepare_updates", epoch_id, changes, base_epoch, op,
                                       target))[0]

    async def prepare_snapshot(self, epoch_id: int, path: str, checksum: str | None, op: str,
                               target: str) -> dict[str, int]:
        return (await self._everywhere("prepare_snapshot", epoch_id, path, checksum, op,
                                       target))[0]

    async def commit(self, epoch_id: int, op: str, target: str) -> int:
        return (await self._everywhere("commit", epoch_id, op, target))[0]

    async def abort(self, epoch_id: int, op: str) -> None:
        await self._everywhere("abort", epoch_id, op)

    async def catch_up(self) -> dict[str, Any]:
        return (await self._everywhere("catch_up"))[0]


@serve.deployment
class Router:
    def __init__(self, cfg: PartyConfig, *shards: DeploymentHandle) -> None:
        self._cfg = cfg
        # the builder made the log and named it (epoch_log_id); a bare deployment makes it here
        configure(cfg.store_settings())
        epoch_log = (EpochLog(cfg.epoch_log_dir, create=cfg.epoch_log_id is None,
                              log_id=cfg.epoch_log_id, marker_later=True)
                     if cfg.epoch_log_dir else None)
        self._metrics = ServeMetrics()
        self._starts_task: asyncio.Task[None] | None = None
        self._starts_at = float("-inf")
        self._party = Party(cfg, [_HandleLink(h) for h in shards], epoch_log, self._metrics)
        self._cors = Cors(cfg.cors_origins)
        # Admin: the token is read once, here; it never reaches a log line or an error.
        self._guard = WatchedAdminGuard(cfg.admin_token_file, cfg.admin_token_env)
        if self._guard.problem:
            log.warning("admin routes answer 403 on this replica: %s", self._guard.problem)
        if self._guard.enabled and not cfg.admin_supported:
            log.warning("admin token configured, admin routes refused: %s", ADMIN_NEEDS_LOG)

    # ------------------------------------------------------------------ handle API

    async def query(self, keys: list[bytes], table: str | None = None) -> dict[str, Any]:
        """One query (three keys as bytes) -> `{"epoch_id", "identity", "pages": [bytes x3]}`;
        `table`: one of the snapshot's named tables (None: the whole matrix)."""
        return await self._observed("handle", 1, self._party.query(keys, table))

    async def query_batch(self, queries: list[list[bytes]],
                          table: str | None = None) -> dict[str, Any]:
        """1..max queries -> `{"epoch_id", "identity", "results": [{"pages": [...]}, ...]}`,
        all of `table` (None: the whole matrix)."""
        return await self._observed("handle_batch", len(queries),
                                    self._party.query_batch(queries, table))

    async def _observed(self, route: str, queries: int, call: Any) -> Any:
        start = time.perf_counter()
        try:
            out = await call
        except WireError as err:
            self._metrics.request(route, err.status, time.perf_counter() - start, 0)
            raise
        except Exception:
            self._metrics.request(route, 500, time.perf_counter() - start, 0)
            raise
        self._metrics.request(route, 200, time.perf_counter() - start, queries)
        return out

    async def epoch(self) -> dict[str, Any]:
        return await self._party.epoch()

    async def health(self) -> dict[str, Any]:
        return await self._party.health()

    async def admin_updates(self, changes: Any, publication: str | None = None
                            ) -> dict[str, Any]:
        return await self._party.admin.updates(changes, publication)

    async def admin_snapshot(self, requested: str, publication: str | None = None
                             ) -> dict[str, Any]:
        return await self._party.admin.snapshot(requested, publication)

    async def check_health(self) -> None:
        """Serve's periodic health check, used to start a refresh of the start gauges (how
        many shard replicas are fetching or failed to start) at most every
        STARTS_REFRESH_S, in the background: the check itself never waits on the cluster's
        key-value store, so a slow store cannot make a router unhealthy."""
        now = time.monotonic()
        task = self._starts_task
        if (task is None or task.done()) and now - self._starts_at >= STARTS_REFRESH_S:
            self._starts_at = now
            self._starts_task = asyncio.get_running_loop().create_task(self._refresh_starts())

    async def _refresh_starts(self) -> None:
        try:
            app = serve.get_replica_context().app_name
            board = await asyncio.to_thread(start_board.unsettled, app)
        except Exception:  # noqa: BLE001 - a gauge left as it was; the router is fine
            return
        counts = {(str(i), state): 0 for i in range(self._cfg.num_shards)
                  for state in ("fetching", "failed")}
        for doc in board:
            key = (str(doc.get("deployment")).removeprefix("shard_"), str(doc.get("state")))
            counts[key] = counts.get(key, 0) + 1
        self._metrics.replica_starts(counts)

    async def admin_status(self) -> dict[str, Any]:
        doc = await party_status(self._party.admin)
        # replicas that are fetching or failed to start (the router's own app's), each in a
        # line: what an operator on a cluster started elsewhere cannot see otherwise
        try:
            app = serve.get_replica_context().app_name
        except Exception:  # noqa: BLE001 - outside Serve: no board
            return doc
        board = await asyncio.to_thread(start_board.unsettled, app)
        doc["replica_starts"] = [{**d, "line": start_board.describe(d)} for d in board]
        return doc

    async def stats(self) -> dict[str, Any]:
        """Coalescing counters of this replica, its pid and the queries it holds now
        (benchmarks and tests)."""
        return {**self._party.stats(), "pid": os.getpid(),
                "held_queries": self._party.held_queries}

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metric (morphogen.party.autoscaling.router_policy)."""
        return {HELD_QUERIES: float(self._party.held_queries)}

    # ------------------------------------------------------------------ HTTP

    def _authorize(self, request: Request) -> None:
        access = self._guard.check(request.headers.get("authorization"))
        if access is AdminAccess.DISABLED:
            raise WireError(403, ErrorCode.FORBIDDEN,
                            "admin routes are disabled on this server ("
                            + (self._guard.problem or "no admin token configured") + ")")
        if access is AdminAccess.DENIED:
            raise WireError(401, ErrorCode.UNAUTHORIZED, "missing or wrong admin bearer token")
        if not self._cfg.admin_supported:
            raise WireError(403, ErrorCode.FORBIDDEN, ADMIN_NEEDS_LOG)

    async def _http_admin(self, path: str, request: Request) -> Response:
        self._authorize(request)  # before reading anything of the body
        if path == ADMIN_STATUS_PATH:
            return _json_response(await self.admin_status())
        content_type = request.headers.get("content-type")
        wire.request_encoding(content_type)  # 415 before reading
        pub = admin_wire.publication_id(request.headers.get(PUBLICATION_HEADER))
        parent = admin_wire.parent_identity(request.headers.get(PARENT_HEADER))
        part = admin_wire.part_of(request.headers.get(PART_HEADER),
                                  request.headers.get(BATCH_HEADER))
        version = admin_wire.digest_version(request.headers.get(DIGEST_HEADER))
        body = await _read_body(request, self._cfg.admin_body_limit())
        if path == ADMIN_SNAPSHOT_PATH:
            requested = admin_wire.parse_snapshot_request(body, content_type)
            return _json_response(await self._party.admin.snapshot(requested, pub, parent))
        # pages are checked against the page count of the epoch they apply to, under the
        # admin lock (admin_updates): a cached layout may predate a rotation
        changes = admin_wire.parse_updates(
            body, content_type, num_pages=MAX_PAGES, max_updates=self._cfg.admin_max_updates,
            max_sparse=self._cfg.admin_max_sparse_updates).with_digest(version)
        if part is not None:
            return _json_response(
                await self._party.admin.updates_part(changes, pub, parent, *part))
        return _json_response(await self._party.admin.updates(changes, pub, parent))

    async def __call__(self, request: Request) -> Response:
        start = time.perf_counter()
        path = _relative_path(request)
        route = path if path in _ROUTES else "other"  # never an arbitrary path as a label
        response = await self._respond(request, path)
        for name, value in self._cors.headers(path, request.headers.get("origin")).items():
            response.headers[name] = value
        answered = getattr(request.state, "queries", 0) if response.status_code == 200 else 0
        self._metrics.request(route, response.status_code, time.perf_counter() - start,
                              answered)
        return response

    async def _respond(self, request: Request, path: str) -> Response:
        try:
            return await self._http(request, path)
        except WireError as err:
            return _error_response(err)
        except ClientDisconnect:
            return Response(status_code=499)
        except Exception as exc:  # noqa: BLE001 - never a traceback over the wire
            # The whole stack, but no message of a lower layer: those may quote request data.
            log.error("internal error answering %s:\n%s", path,
                      redacted_traceback(exc))
            return _error_response(WireError(500, ErrorCode.INTERNAL, "internal error"))

    async def _http(self, request: Request, path: str) -> Response:
        method = _ROUTES.get(path)
        if method is None:
            raise WireError(404, ErrorCode.NOT_FOUND, f"no route {path}")
        if request.method == "OPTIONS" and path in CORS_ROUTES \
                and "access-control-request-method" in request.headers:
            allowed = self._cors.preflight(path, request.headers)
            if allowed is None:
                raise WireError(403, ErrorCode.FORBIDDEN, "this party answers no web page of "
                                "that origin (its cors_origins)")
            return Response(status_code=204, headers=allowed)
        if request.method != method and not (method == "GET" and request.method == "HEAD"):
            return _error_response(
                WireError(405, ErrorCode.METHOD_NOT_ALLOWED, f"{path} takes {method}"),
                {"Allow": method},
            )
        if path in _ADMIN_PATHS:
            return await self._http_admin(path, request)
        if path == HEALTH_PATH:
            return _json_response(await self._party.health())
        if path == EPOCH_PATH:
            return _json_response(await self._party.epoch())
        batch = path == BATCH_PATH
        # Content type first (415), then size (413), then parse (400/422), then keys (400).
        enc_in = wire.request_encoding(request.headers.get("content-type"))
        layout = await self._party.layout()
        body = await _read_body(request, self._cfg.body_limit(layout.domain_bits))
        def parse(lay: Layout) -> tuple[wire.ParsedQueries, Table | None]:
            parsed = wire.parse_queries(
                body,
                request.headers.get("content-type"),
                batch=batch,
                domain_bits=lay.domain_bits,
                max_queries=self._cfg.max_batch_queries,
                tables=lay.table_domains,
                key_formats=lay.key_formats,
            )
            return parsed, None if parsed.table is None else lay.tables[parsed.table]

        parsed, table = await self._party.validated(parse, layout)
        identity, acc = await self._party.answer(parsed.keys, table)
        request.state.queries = parsed.num_queries
        enc_out = wire.response_encoding(request.headers.get("accept"), enc_in)
        content = wire.encode_answer(identity.epoch_id, acc, batch=batch, encoding=enc_out,
                                     identity=identity.digest)
        return Response(content, media_type=MSGPACK_TYPE if enc_out == wire.MSGPACK else JSON_TYPE)


def _relative_path(request: Request) -> str:
    path = request.scope.get("path", "/")
    root = request.scope.get("root_path", "") or ""
    if root and path.startswith(root):
        path = path[len(root) :]
    path = "/" + path.lstrip("/")
    return path.rstrip("/") or "/"


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refusing (413) anything over `limit` without reading past it."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise WireError(400, ErrorCode.BAD_REQUEST, "bad Content-Length") from None
        if size > limit:
            raise WireError(
                413, ErrorCode.PAYLOAD_TOO_LARGE, f"body of {size} bytes exceeds {limit}"
            )
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise WireError(413, ErrorCode.PAYLOAD_TOO_LARGE, f"body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _json_response(obj: Any, status: int = 200) -> Response:
    return Response(wire.encode_json(obj), status_code=status, media_type=JSON_TYPE)


def _error_response(err: WireError, extra: dict[str, str] | None = None) -> Response:
    headers = err.headers()
    if err.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if extra:
        headers.update(extra)
    return Response(
        wire.error_body(err), status_code=err.status, media_type=JSON_TYPE, headers=headers
    )
