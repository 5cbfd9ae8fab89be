"""The application at `/` when the parties are served under other routes: every path no party
serves gets the documented JSON error body (404), naming the routes that exist, instead of
Serve's plain-text 404."""

from __future__ import annotations

from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from morphogen.party import wire
from morphogen.protocol.codec import JSON_TYPE, ErrorCode, WireError


@serve.deployment(name="index", ray_actor_options={"num_cpus": 0}, num_replicas=1)
class Index:
    def __init__(self, routes: dict[str, str]) -> None:
        self._where = ", ".join(f"{prefix} ({name})" for name, prefix in sorted(routes.items()))

    async def __call__(self, request: Request) -> Response:
        path = request.scope.get("path", "/")[:200]
        err = WireError(404, ErrorCode.NOT_FOUND,
                        f"no party at {path}: parties are served under {self._where}")
        return Response(wire.error_body(err), status_code=404, media_type=JSON_TYPE)
