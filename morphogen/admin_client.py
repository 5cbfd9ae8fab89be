"""The admin client: page updates, snapshot rotation and status of one party's router."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import httpx
import msgpack

from morphogen.client import _error_from_response
from morphogen.client_wire import PirUnavailable, Transient, encode_updates
from morphogen.codec import (
    ADMIN_SNAPSHOT_PATH,
    ADMIN_STATUS_PATH,
    ADMIN_UPDATES_PATH,
    JSON_TYPE,
    MSGPACK_TYPE,
)


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
            if isinstance(err, Transient):
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
