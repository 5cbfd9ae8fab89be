"""The ingress of one party: HTTP (PROTOCOL.md section 5, JSON or msgpack) and a handle API.

Every request is validated completely before any scan; concurrent requests are coalesced into
one fan-out to every shard; the partials are XORed under one epoch or the request fails with
503. Admin routes (bearer token) publish page updates and snapshot rotations on every shard in
two phases. A thin adapter over `morphogen.wire`, `morphogen.coalesce`, `morphogen.combine`
and `morphogen.admin`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from cluster.config import PartyConfig
from morphogen import admin, wire
from morphogen.admin_auth import AdminAccess, AdminGuard
from morphogen.coalesce import Coalescer
from morphogen.codec import (
    ADMIN_SNAPSHOT_PATH,
    ADMIN_STATUS_PATH,
    ADMIN_UPDATES_PATH,
    BATCH_PATH,
    EPOCH_PATH,
    HEALTH_PATH,
    JSON_TYPE,
    KEYS_PER_QUERY,
    MSGPACK_TYPE,
    PAGE_SIZE,
    QUERY_PATH,
    ErrorCode,
    WireError,
    unavailable,
)
from morphogen.combine import EpochMismatch, ShardFailure, scan_all
from morphogen.dpf import DomainError, DpfKey, KeyBatch
from morphogen.matrix import MAX_PAGES

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
_INFO_TIMEOUT_S = 10.0
# GET /epoch and /health while shards switch epochs: a few short tries before a 503.
_CONSISTENT_ATTEMPTS = 4
# A refused key domain re-reads the shards' layout at most this often (bad keys cannot turn
# every request into a fan-out of metadata calls).
_REVALIDATE_S = 0.5

T = TypeVar("T")


class _Layout:
    """What the shards together serve; checked to tile [0, num_pages) exactly."""

    def __init__(self, infos: list[dict[str, Any]]) -> None:
        first = infos[0]
        for key in ("num_pages", "domain_bits", "num_shards"):
            if any(i[key] != first[key] for i in infos):
                raise ShardFailure(f"shards disagree on {key}")
        if first["num_shards"] != len(infos):
            raise ShardFailure(f"{len(infos)} shard deployments for {first['num_shards']} shards")
        edge = 0
        for idx, i in enumerate(infos):
            if i["shard"] != idx or i["first_page"] != edge:
                raise ShardFailure(f"shard {idx} does not start where shard {idx - 1} ends")
            edge = i["stop_page"]
        if edge != first["num_pages"]:
            raise ShardFailure("shards do not cover every page")
        self.num_pages: int = first["num_pages"]
        self.domain_bits: int = first["domain_bits"]
        self.num_shards: int = len(infos)
        self.checksum: str | None = first.get("checksum")
        self.epoch_id: int = max(int(i["epoch_id"]) for i in infos)


@serve.deployment
class Router:
    def __init__(self, cfg: PartyConfig, *shards: DeploymentHandle) -> None:
        if not shards:
            raise ValueError("a router needs at least one shard")
        self._cfg = cfg
        self._shards = list(shards)
        self._layout: _Layout | None = None
        self._layout_lock = asyncio.Lock()
        self._coalescer: Coalescer[DpfKey] = Coalescer(
            self._scan_keys,
            window_s=cfg.coalesce_window_s,
            max_items=cfg.coalesce_max_keys,
            max_in_flight=cfg.coalesce_max_in_flight,
        )
        self._refresh: asyncio.Task[None] | None = None
        self._revalidated = 0.0
        # Admin: the token is read once, here; it never reaches a log line or an error.
        self._guard = AdminGuard.from_sources(cfg.admin_token_file, cfg.admin_token_env)
        if self._guard.enabled and not cfg.admin_supported:
            log.warning("admin token configured but shard_replicas > 1: admin routes refused")
        self._admin_lock = asyncio.Lock()
        self._admin_epoch: int | None = None  # the epoch this router last published
        self._rotating = False

    # ------------------------------------------------------------------ shards

    async def _infos(self) -> list[dict[str, Any]]:
        calls = [h.info.remote() for h in self._shards]
        try:
            return list(await asyncio.wait_for(asyncio.gather(*calls), _INFO_TIMEOUT_S))
        except Exception as exc:  # noqa: BLE001 - any shard failure means unavailable
            raise unavailable(
                f"shard metadata unavailable ({type(exc).__name__})", self._cfg.retry_after_s
            ) from None

    async def _get_layout(self) -> _Layout:
        if self._layout is not None:
            return self._layout
        async with self._layout_lock:
            if self._layout is None:
                infos = await self._infos()
                try:
                    self._layout = _Layout(infos)
                except ShardFailure as exc:
                    raise unavailable(str(exc), self._cfg.retry_after_s) from None
        return self._layout

    def _set_layout(self, infos: list[dict[str, Any]]) -> _Layout | None:
        """Cache the layout the shards report now, when it is a whole one."""
        try:
            layout = _Layout(infos)
        except ShardFailure:
            return None  # between epochs of different shapes: keep the last whole one
        self._layout = layout
        return layout

    def _note_epoch(self, epoch_id: int) -> None:
        """A scan answered from an epoch the cached layout does not know: re-read the shards'
        layout in the background (a rotation may have changed the page count or domain that
        key validation uses)."""
        layout = self._layout
        if layout is None or epoch_id == layout.epoch_id or self._refresh is not None:
            return
        self._refresh = asyncio.get_running_loop().create_task(self._refresh_layout())

    async def _refresh_layout(self) -> None:
        try:
            self._set_layout(await self._infos())
        except Exception:  # noqa: BLE001 - the next new epoch tries again
            pass
        finally:
            self._refresh = None

    async def _validated(self, parse: Callable[[int], T], layout: _Layout | None = None) -> T:
        """`parse(domain_bits)` against the cached layout; a key domain it refuses is checked
        once more against the shards' current layout (a rotation seen by another router
        replica may have changed it), at most once per `_REVALIDATE_S`."""
        layout = layout or await self._get_layout()
        try:
            return parse(layout.domain_bits)
        except WireError as err:
            now = time.monotonic()
            if err.code != ErrorCode.BAD_DOMAIN or now - self._revalidated < _REVALIDATE_S:
                raise
            self._revalidated = now
            fresh = self._set_layout(await self._infos())
            if fresh is None:
                raise unavailable("the snapshot is changing, retry",
                                  self._cfg.retry_after_s) from None
            if fresh.domain_bits == layout.domain_bits:
                raise
            return parse(fresh.domain_bits)

    async def _call_shard(self, handle: DeploymentHandle, batch: KeyBatch) -> tuple[int, Any]:
        try:
            return await handle.scan.remote(batch)
        except Exception as exc:
            cause = admin.unwrap(exc)
            if isinstance(cause, WireError) and cause.status < 500:
                raise cause from None  # the request's own fault (stale domain): no retry
            raise

    async def _scan_keys(self, keys: list[DpfKey]) -> tuple[int, Any]:
        """One pass of every shard over all `keys` (a coalesced group), XORed under one epoch."""
        try:
            batch = KeyBatch.from_keys(keys)
        except DomainError:
            # requests validated on both sides of a domain-changing rotation met in one group
            raise unavailable("the snapshot is changing, retry", self._cfg.retry_after_s) from None
        calls = [functools.partial(self._call_shard, h, batch) for h in self._shards]
        try:
            epoch_id, acc = await scan_all(
                calls,
                len(keys),
                attempts=self._cfg.scan_attempts,
                backoff_s=self._cfg.retry_backoff_ms / 1000.0,
                timeout_s=self._cfg.shard_timeout_s,
            )
        except EpochMismatch:
            raise unavailable(
                "no consistent epoch across shards, retry", self._cfg.retry_after_s
            ) from None
        except ShardFailure as exc:
            raise unavailable(f"scan failed: {exc}", self._cfg.retry_after_s) from None
        except WireError as err:
            if err.code == ErrorCode.BAD_DOMAIN and self._layout is not None:
                self._note_epoch(self._layout.epoch_id + 1)  # force a re-read
            raise
        self._note_epoch(epoch_id)
        return epoch_id, acc

    async def _answer(self, queries: list[list[DpfKey]]) -> tuple[int, Any]:
        flat = [k for q in queries for k in q]
        epoch_id, acc = await self._coalescer.submit(flat)
        if acc.shape != (len(flat), PAGE_SIZE):  # never answer with a wrong-sized XOR
            raise WireError(500, ErrorCode.INTERNAL, "internal error")
        return epoch_id, acc

    # ------------------------------------------------------------------ handle API

    async def query(self, keys: list[bytes]) -> dict[str, Any]:
        """One query (three keys as bytes) -> `{"epoch_id", "pages": [bytes x3]}`."""
        queries = await self._validated(
            lambda d: wire.handle_queries([keys], domain_bits=d, max_queries=1, batch=False)
        )
        epoch_id, acc = await self._answer(queries)
        return wire.answer_dict(epoch_id, acc, batch=False)

    async def query_batch(self, queries: list[list[bytes]]) -> dict[str, Any]:
        """1..max queries -> `{"epoch_id", "results": [{"pages": [bytes x3]}, ...]}`."""
        parsed = await self._validated(
            lambda d: wire.handle_queries(
                queries, domain_bits=d, max_queries=self._cfg.max_batch_queries, batch=True
            )
        )
        epoch_id, acc = await self._answer(parsed)
        return wire.answer_dict(epoch_id, acc, batch=True)

    async def _consistent_infos(self) -> list[dict[str, Any]]:
        """Every shard's info, all on one epoch (a few short tries across a commit)."""
        backoff = self._cfg.retry_backoff_ms / 1000.0
        for attempt in range(_CONSISTENT_ATTEMPTS):
            if attempt:
                await asyncio.sleep(backoff * (2 ** (attempt - 1)))
            infos = await self._infos()
            if len({i["epoch_id"] for i in infos}) == 1:
                return infos
        raise unavailable("shards are between epochs, retry", self._cfg.retry_after_s)

    async def epoch(self) -> dict[str, Any]:
        """The `GET /epoch` document: real page count and the domain bits keys must use, plus
        the epoch's state (pending updates, snapshot, rotation in progress)."""
        infos = await self._consistent_infos()
        layout = self._set_layout(infos)
        if layout is None:
            raise unavailable("shards are between snapshots, retry", self._cfg.retry_after_s)
        state = admin.party_epoch(infos)
        cfg = self._cfg
        state_root = "0x" + "00" * 32
        if layout.checksum and layout.checksum.startswith("blake2b-256:"):
            state_root = "0x" + layout.checksum.split(":", 1)[1]
        return {
            "epoch_id": state.epoch_id,
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
            },
            "pending_updates": state.pending_updates,
            "rotation_in_progress": state.rotation_in_progress or self._rotating,
            "snapshot": {
                "epoch_id": state.snapshot_epoch_id,
                "checksum": state.snapshot_checksum,
            },
        }

    async def health(self) -> dict[str, Any]:
        """`{"status": "ok", "epoch_id", "block_number", "pending_updates",
        "rotation_in_progress"}` only when every shard answers and all agree on one epoch;
        raises 503 otherwise."""
        state = admin.party_epoch(await self._consistent_infos())
        return {
            "status": "ok",
            "epoch_id": state.epoch_id,
            "block_number": self._cfg.block_number,
            "pending_updates": state.pending_updates,
            "rotation_in_progress": state.rotation_in_progress or self._rotating,
        }

    # ------------------------------------------------------------------ admin

    def _authorize(self, request: Request) -> None:
        access = self._guard.check(request.headers.get("authorization"))
        if access is AdminAccess.DISABLED:
            raise WireError(403, ErrorCode.FORBIDDEN,
                            "admin routes are disabled on this server (no admin token configured)")
        if access is AdminAccess.DENIED:
            raise WireError(401, ErrorCode.UNAUTHORIZED, "missing or wrong admin bearer token")
        if not self._cfg.admin_supported:
            raise WireError(
                403, ErrorCode.FORBIDDEN,
                "admin routes need shard_replicas == 1 (an update must reach every copy of a "
                "shard)",
            )

    async def _admin_base(self) -> tuple[list[dict[str, Any]], admin.PartyEpoch]:
        infos = await self._infos()
        return infos, admin.party_epoch(infos)

    async def admin_updates(self, changes: Any) -> dict[str, Any]:
        """Publish `current + 1` = current + `changes` (a ChangeBatch) on every shard as one
        step. The shards check the pages against their matrix and the base epoch against their
        own: the epoch this router last published is tried first (no metadata round trip), and
        a refusal because another router moved the epoch meanwhile re-reads it once."""
        async with self._admin_lock:
            for attempt in range(2):
                base = self._admin_epoch
                if base is None:
                    _, state = await self._admin_base()
                    if not state.consistent:
                        raise unavailable(
                            "shards serve different epochs (a failed commit or a restarted "
                            "shard); page updates are refused until a snapshot rotation brings "
                            "them together",
                            self._cfg.retry_after_s,
                        )
                    base = state.epoch_id
                epoch_id = base + 1
                op = admin.new_op_id()
                try:
                    await admin.publish(
                        epoch_id,
                        [functools.partial(h.prepare_updates.remote, epoch_id, changes, base, op)
                         for h in self._shards],
                        [functools.partial(h.commit.remote, epoch_id, op) for h in self._shards],
                        [functools.partial(h.abort.remote, epoch_id, op) for h in self._shards],
                        timeout_s=self._cfg.admin_timeout_s,
                        retry_after=self._cfg.retry_after_s,
                    )
                except WireError as err:
                    cached = self._admin_epoch is not None
                    self._admin_epoch = None
                    if err.status == 409 and cached and attempt == 0:
                        continue  # the epoch moved under us: read it and try once more
                    raise
                self._admin_epoch = epoch_id
                if self._layout is not None:
                    self._layout.epoch_id = epoch_id
                return {"epoch_id": epoch_id, "applied": len(changes)}
            raise AssertionError("unreachable")

    async def admin_snapshot(self, requested: str) -> dict[str, Any]:
        """Rotate every shard to the snapshot at `requested` (inside admin_snapshot_dir), its
        checksum verified before any shard is touched."""
        path = admin.resolve_snapshot_path(requested, self._cfg.admin_snapshot_dir)
        async with self._admin_lock:
            self._rotating = True
            started = time.monotonic()
            try:
                manifest = await asyncio.to_thread(admin.verify_snapshot, path)
                verified = time.monotonic() - started
                if manifest.num_pages < len(self._shards):
                    raise WireError(
                        422, ErrorCode.BAD_SNAPSHOT,
                        f"snapshot refused: {manifest.num_pages} pages for "
                        f"{len(self._shards)} shards",
                    )
                _, state = await self._admin_base()
                # over whatever epochs the shards serve: a rotation also re-unites shards
                # that a failed commit or a restart left apart
                epoch_id = admin.rotation_epoch(state.epoch_id, manifest.epoch_id)
                op = admin.new_op_id()
                await admin.publish(
                    epoch_id,
                    [functools.partial(h.prepare_snapshot.remote, epoch_id, str(path),
                                       manifest.checksum, op) for h in self._shards],
                    [functools.partial(h.commit.remote, epoch_id, op) for h in self._shards],
                    [functools.partial(h.abort.remote, epoch_id, op) for h in self._shards],
                    timeout_s=self._cfg.admin_timeout_s,
                    retry_after=self._cfg.retry_after_s,
                )
                self._admin_epoch = epoch_id
                self._set_layout(await self._infos())
            except BaseException:
                self._admin_epoch = None
                raise
            finally:
                self._rotating = False
            log.info("rotated to epoch %d (%d pages) in %.2fs", epoch_id, manifest.num_pages,
                     time.monotonic() - started)
            return {
                "epoch_id": epoch_id,
                "num_pages": manifest.num_pages,
                "domain_bits": manifest.domain_bits,
                "checksum": manifest.checksum,
                "snapshot_epoch_id": manifest.epoch_id,
                "seconds": round(time.monotonic() - started, 3),
                "verify_seconds": round(verified, 3),
            }

    async def admin_status(self) -> dict[str, Any]:
        infos = await self._infos()
        state = admin.party_epoch(infos)
        keep = ("shard", "epoch_id", "first_page", "stop_page", "pending_updates",
                "folded_chunks", "segments", "rotation_in_progress", "staged_epoch_id",
                "snapshot_epoch_id", "snapshot_checksum", "engine", "scans", "folds")
        return {
            **state.as_dict(),
            "consistent": state.consistent,
            "num_pages": state.num_pages,
            "domain_bits": state.domain_bits,
            "rotation_in_progress": state.rotation_in_progress or self._rotating,
            "admin_busy": self._admin_lock.locked(),
            "shards": [{k: i.get(k) for k in keep} for i in infos],
        }

    async def _http_admin(self, path: str, request: Request) -> Response:
        self._authorize(request)  # before reading anything of the body
        if path == ADMIN_STATUS_PATH:
            return _json_response(await self.admin_status())
        content_type = request.headers.get("content-type")
        wire.request_encoding(content_type)  # 415 before reading
        body = await _read_body(request, self._cfg.admin_body_limit())
        if path == ADMIN_SNAPSHOT_PATH:
            requested = wire.parse_snapshot_request(body, content_type)
            return _json_response(await self.admin_snapshot(requested))
        # pages are checked against the page count of the epoch they apply to, under the
        # admin lock (admin_updates): a cached layout may predate a rotation
        changes = wire.parse_updates(
            body, content_type, num_pages=MAX_PAGES, max_updates=self._cfg.admin_max_updates
        )
        return _json_response(await self.admin_updates(changes))

    # ------------------------------------------------------------------ HTTP

    async def __call__(self, request: Request) -> Response:
        try:
            return await self._http(request)
        except WireError as err:
            return _error_response(err)
        except ClientDisconnect:
            return Response(status_code=499)
        except Exception as exc:  # noqa: BLE001 - never a traceback over the wire
            # Only the exception type: messages of lower layers could carry request data.
            log.error("internal error answering %s: %s", request.url.path, type(exc).__name__)
            return _error_response(WireError(500, ErrorCode.INTERNAL, "internal error"))

    async def _http(self, request: Request) -> Response:
        path = _relative_path(request)
        method = _ROUTES.get(path)
        if method is None:
            raise WireError(404, ErrorCode.NOT_FOUND, f"no route {path}")
        if request.method != method and not (method == "GET" and request.method == "HEAD"):
            return _error_response(
                WireError(405, ErrorCode.METHOD_NOT_ALLOWED, f"{path} takes {method}"),
                {"Allow": method},
            )
        if path in _ADMIN_PATHS:
            return await self._http_admin(path, request)
        if path == HEALTH_PATH:
            return _json_response(await self.health())
        if path == EPOCH_PATH:
            return _json_response(await self.epoch())
        batch = path == BATCH_PATH
        # Content type first (415), then size (413), then parse (400/422), then keys (400).
        enc_in = wire.request_encoding(request.headers.get("content-type"))
        layout = await self._get_layout()
        body = await _read_body(request, self._cfg.body_limit(layout.domain_bits))
        parsed = await self._validated(
            lambda d: wire.parse_queries(
                body,
                request.headers.get("content-type"),
                batch=batch,
                domain_bits=d,
                max_queries=self._cfg.max_batch_queries,
            ),
            layout,
        )
        epoch_id, acc = await self._answer(parsed.queries)
        enc_out = wire.response_encoding(request.headers.get("accept"), enc_in)
        content = wire.encode_answer(epoch_id, acc, batch=batch, encoding=enc_out)
        return Response(content, media_type=MSGPACK_TYPE if enc_out == wire.MSGPACK else JSON_TYPE)

    async def stats(self) -> dict[str, Any]:
        """Coalescing counters of this replica (benchmarks and tests)."""
        s = self._coalescer.stats
        return {
            "calls": s.calls,
            "submissions": s.submissions,
            "items": s.items,
            "largest": s.largest,
            "window_s": self._coalescer.window_s,
        }


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
