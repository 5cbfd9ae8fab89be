"""The ingress of one party: HTTP (PROTOCOL.md section 5, JSON or msgpack) and a handle API.

Every request is validated completely before any scan; concurrent requests are coalesced into
one fan-out to every shard; the partials are XORed under one epoch or the request fails with
503. A thin adapter over `morphogen.wire`, `morphogen.coalesce` and `morphogen.combine`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from cluster.config import PartyConfig
from morphogen import wire
from morphogen.coalesce import Coalescer
from morphogen.codec import (
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
from morphogen.dpf import DpfKey, KeyBatch

log = logging.getLogger("ray.serve")

_ROUTES = {
    QUERY_PATH: "POST",
    BATCH_PATH: "POST",
    HEALTH_PATH: "GET",
    EPOCH_PATH: "GET",
}
_INFO_TIMEOUT_S = 10.0


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

    async def _call_shard(self, handle: DeploymentHandle, batch: KeyBatch) -> tuple[int, Any]:
        return await handle.scan.remote(batch)

    async def _scan_keys(self, keys: list[DpfKey]) -> tuple[int, Any]:
        """One pass of every shard over all `keys` (a coalesced group), XORed under one epoch."""
        batch = KeyBatch.from_keys(keys)
        calls = [functools.partial(self._call_shard, h, batch) for h in self._shards]
        try:
            return await scan_all(
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

    async def _answer(self, queries: list[list[DpfKey]]) -> tuple[int, Any]:
        flat = [k for q in queries for k in q]
        epoch_id, acc = await self._coalescer.submit(flat)
        if acc.shape != (len(flat), PAGE_SIZE):  # never answer with a wrong-sized XOR
            raise WireError(500, ErrorCode.INTERNAL, "internal error")
        return epoch_id, acc

    # ------------------------------------------------------------------ handle API

    async def query(self, keys: list[bytes]) -> dict[str, Any]:
        """One query (three keys as bytes) -> `{"epoch_id", "pages": [bytes x3]}`."""
        layout = await self._get_layout()
        queries = wire.handle_queries(
            [keys], domain_bits=layout.domain_bits, max_queries=1, batch=False
        )
        epoch_id, acc = await self._answer(queries)
        return wire.answer_dict(epoch_id, acc, batch=False)

    async def query_batch(self, queries: list[list[bytes]]) -> dict[str, Any]:
        """1..max queries -> `{"epoch_id", "results": [{"pages": [bytes x3]}, ...]}`."""
        layout = await self._get_layout()
        parsed = wire.handle_queries(
            queries,
            domain_bits=layout.domain_bits,
            max_queries=self._cfg.max_batch_queries,
            batch=True,
        )
        epoch_id, acc = await self._answer(parsed)
        return wire.answer_dict(epoch_id, acc, batch=True)

    async def epoch(self) -> dict[str, Any]:
        """The `GET /epoch` document: real page count and the domain bits keys must use."""
        layout = await self._get_layout()
        infos = await self._infos()
        epochs = {i["epoch_id"] for i in infos}
        if len(epochs) != 1:
            raise unavailable("shards are between epochs, retry", self._cfg.retry_after_s)
        cfg = self._cfg
        state_root = "0x" + "00" * 32
        if layout.checksum and layout.checksum.startswith("blake2b-256:"):
            state_root = "0x" + layout.checksum.split(":", 1)[1]
        return {
            "epoch_id": epochs.pop(),
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
        }

    async def health(self) -> dict[str, Any]:
        """`{"status": "ok", "epoch_id", "block_number"}` only when every shard answers and all
        agree on one epoch; raises 503 otherwise."""
        infos = await self._infos()
        epochs = {i["epoch_id"] for i in infos}
        if len(epochs) != 1:
            raise unavailable("shards are between epochs", self._cfg.retry_after_s)
        return {"status": "ok", "epoch_id": epochs.pop(), "block_number": self._cfg.block_number}

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
        if path == HEALTH_PATH:
            return _json_response(await self.health())
        if path == EPOCH_PATH:
            return _json_response(await self.epoch())
        batch = path == BATCH_PATH
        # Content type first (415), then size (413), then parse (400/422), then keys (400).
        enc_in = wire.request_encoding(request.headers.get("content-type"))
        layout = await self._get_layout()
        body = await _read_body(request, self._cfg.body_limit(layout.domain_bits))
        parsed = wire.parse_queries(
            body,
            request.headers.get("content-type"),
            batch=batch,
            domain_bits=layout.domain_bits,
            max_queries=self._cfg.max_batch_queries,
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
    if extra:
        headers.update(extra)
    return Response(
        wire.error_body(err), status_code=err.status, media_type=JSON_TYPE, headers=headers
    )
