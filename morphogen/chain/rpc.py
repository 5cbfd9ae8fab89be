"""A synchronous Ethereum JSON-RPC 2.0 client over HTTP.

Every failure is a `ChainError` of one line that says what to do about it: the node cannot be
reached, the URL is not a JSON-RPC endpoint, the node lacks a method, the node refused a call,
or it is on another chain. Request bodies are never logged or quoted in errors: they may carry
signed transactions, and hosted nodes put API keys in their URLs (see `display_url`).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx

METHOD_NOT_FOUND = -32601
BLOCK_TAGS = ("latest", "earliest", "pending", "safe", "finalized")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_SECRET_SEGMENT = re.compile(r"[A-Za-z0-9_-]{20,}")


class ChainError(RuntimeError):
    """Talking to an Ethereum node failed; the message is one line."""


class NodeUnreachable(ChainError):
    """No HTTP answer: connection refused, name not resolved, or no answer in time."""


class NotJsonRpc(ChainError):
    """Something answered, but not as an Ethereum JSON-RPC endpoint."""


class RpcError(ChainError):
    """The node answered a call with a JSON-RPC error."""

    def __init__(self, message: str, method: str, code: int, rpc_message: str) -> None:
        super().__init__(message)
        self.method, self.code, self.rpc_message = method, code, rpc_message


class MethodMissing(RpcError):
    """The node does not have the method (JSON-RPC error -32601)."""


class WrongChain(ChainError):
    """The node is on another chain than the one asked for."""


class BadHex(ChainError, ValueError):
    """A value that should be a 0x-hex quantity is not one."""


def to_int(value: object, what: str = "quantity") -> int:
    """The integer of a JSON-RPC hex quantity ("0x1a"); BadHex for anything else."""
    if not isinstance(value, str) or not _HEX.fullmatch(value):
        shown = repr(value)[:40]
        raise BadHex(f"{what} {shown} is not a 0x-hex quantity")
    return int(value, 16)


def quantity(n: int) -> str:
    """A non-negative integer as a JSON-RPC hex quantity (no leading zeros)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"a quantity is an int, got {type(n).__name__}")
    if n < 0:
        raise ValueError(f"a quantity is not negative, got {n}")
    return hex(n)


def block_param(tag_or_number: int | str) -> str:
    """A block number or tag ("latest", ...) as a JSON-RPC block parameter."""
    if isinstance(tag_or_number, int):
        return quantity(tag_or_number)
    if tag_or_number in BLOCK_TAGS:
        return tag_or_number
    to_int(tag_or_number, "block number")
    return tag_or_number.lower()


def display_url(url: str) -> str:
    """The URL as errors show it: without user, password, query, or a path segment long
    enough to be an API key (the form hosted nodes use: /v2/<key>)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    path = "/".join("***" if _SECRET_SEGMENT.fullmatch(s) else s for s in parts.path.split("/"))
    return f"{parts.scheme}://{host}{path}"


class EthRpc:
    """One node's JSON-RPC endpoint. Not thread-safe (one `httpx.Client`); use one per
    thread."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        if urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"an Ethereum node URL is http:// or https://, got {url[:40]!r}")
        self.url = url
        self.shown = display_url(url)
        self.timeout_s = timeout_s
        self._http = httpx.Client(timeout=timeout_s)
        self._ids = itertools.count(1)
        self._ids_lock = threading.Lock()  # batches may be sent from several threads at once

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EthRpc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls ----------------------------------------------------------------------------------

    def call(self, method: str, *params: Any) -> Any:
        """The result of one call; raises the ChainError that says why there is none."""
        with self._ids_lock:
            request_id = next(self._ids)
        answer = self._post({"jsonrpc": "2.0", "id": request_id, "method": method,
                             "params": list(params)}, method)
        if isinstance(answer, list):
            raise NotJsonRpc(f"{self.shown} answered {method} with a list, not one reply: "
                             "not an Ethereum JSON-RPC endpoint")
        if answer.get("id") != request_id:
            raise NotJsonRpc(f"{self.shown} answered {method} under id {answer.get('id')!r}, "
                             f"not {request_id}: not a JSON-RPC endpoint, or a proxy mixing "
                             "replies")
        result = self._outcome(answer, method)
        if isinstance(result, ChainError):
            raise result
        return result

    def batch(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        """The results of several calls sent in one HTTP request, in the order of `calls`.
        A call the node refused is its error (an `RpcError` instance, not raised) in its
        place; the whole batch raises only when the request itself fails."""
        if not calls:
            return []
        with self._ids_lock:
            first = next(self._ids)
            self._ids = itertools.count(first + len(calls))
        ids = list(range(first, first + len(calls)))
        body = [{"jsonrpc": "2.0", "id": i, "method": m, "params": list(p)}
                for i, (m, p) in zip(ids, calls, strict=True)]
        label = f"a batch of {len(calls)} calls ({calls[0][0]}, ...)"
        answer = self._post(body, label)
        if isinstance(answer, dict):
            # a node that refuses batches (or this one's size) answers one error object
            outcome = self._outcome(answer, label)
            if isinstance(outcome, ChainError):
                raise outcome
            raise NotJsonRpc(f"{self.shown} answered {label} with one reply, not a list")
        by_id = {reply.get("id"): reply for reply in answer}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise NotJsonRpc(f"{self.shown} left {len(missing)} of {label} unanswered")
        return [self._outcome(by_id[i], m) for i, (m, _) in zip(ids, calls, strict=True)]

    def batch_values(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        """`batch`, raising the first call's error instead of returning it."""
        results = self.batch(calls)
        for r in results:
            if isinstance(r, ChainError):
                raise r
        return results

    # -- the usual questions --------------------------------------------------------------------

    def chain_id(self) -> int:
        return to_int(self.call("eth_chainId"), "eth_chainId")

    def block_number(self) -> int:
        return to_int(self.call("eth_blockNumber"), "eth_blockNumber")

    def block(self, tag_or_number: int | str = "latest") -> dict:
        """The block's header fields and its transactions' hashes."""
        param = block_param(tag_or_number)
        found = self.call("eth_getBlockByNumber", param, False)
        if not isinstance(found, dict):
            raise ChainError(f"{self.shown} has no block {tag_or_number} (yet)")
        return found

    def check_chain_id(self, expected: int) -> int:
        """The node's chain id when it is `expected`; WrongChain otherwise."""
        got = self.chain_id()
        if got != expected:
            raise WrongChain(f"the node at {self.shown} is on chain {got}, not chain "
                             f"{expected}: point the URL at a node of chain {expected}")
        return got

    # -- the wire -------------------------------------------------------------------------------

    def _post(self, body: Any, label: str) -> Any:
        try:
            response = self._http.post(self.url, json=body)
        except httpx.TimeoutException:
            raise NodeUnreachable(
                f"the Ethereum node at {self.shown} did not answer {label} within "
                f"{self.timeout_s:g} s: check that it is up and synced, or raise the timeout"
            ) from None
        except httpx.TransportError as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise NodeUnreachable(
                f"cannot reach the Ethereum node at {self.shown} ({reason}): check that the "
                "node is running and that the URL's host, port and scheme are right"
            ) from None
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        try:
            answer = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise NotJsonRpc(
                f"{self.shown} is not an Ethereum JSON-RPC endpoint: it answered {label} with "
                f"HTTP {response.status_code} and {kind}, not JSON (is the URL the node's RPC "
                "port and path?)") from None
        replies = answer if isinstance(answer, list) else [answer]
        if not all(isinstance(r, dict) and r.get("jsonrpc") == "2.0"
                   and ("result" in r or "error" in r) for r in replies):
            raise NotJsonRpc(f"{self.shown} is not an Ethereum JSON-RPC endpoint: it answered "
                             f"{label} with HTTP {response.status_code} and JSON without "
                             "\"jsonrpc\": \"2.0\" and a result or error")
        return answer

    def _outcome(self, reply: dict, method: str) -> Any:
        if "error" not in reply or reply["error"] is None:
            return reply.get("result")
        error = reply["error"]
        if not isinstance(error, dict):
            error = {"code": 0, "message": str(error)}
        code = error.get("code")
        code = code if isinstance(code, int) else 0
        message = " ".join(str(error.get("message", "")).split())[:200]
        if code == METHOD_NOT_FOUND:
            return MethodMissing(f"the node at {self.shown} has no method {method} "
                                 f"({message or 'method not found'}): use a node that serves "
                                 "it, or enable its API namespace", method, code, message)
        return RpcError(f"{method} failed on {self.shown}: error {code}: {message}", method,
                        code, message)
