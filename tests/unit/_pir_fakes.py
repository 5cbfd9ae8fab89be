"""Fake parties for the clients' tests: GET /epoch and queries over HTTP or a handle, answered
with the real DPF over scripted data."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from typing import Any

import httpx
import msgpack
import numpy as np

from morphogen.client import AsyncPirClient, HandlePirClient, PirClient, RetryPolicy
from morphogen.party import wire
from morphogen.protocol.codec import WireError, from_hex, to_hex
from morphogen.protocol.dpf import DpfKey, eval_range
from morphogen.snapshot.layout import domain_bits_for
from morphogen.snapshot.synthetic import synthetic_pages

FAST = RetryPolicy(attempts=4, backoff_s=0.001, max_backoff_s=0.01)
KINDS = ["json", "msgpack", "async", "handle", "ahandle"]


class World:
    """One version of the data: its pages, epoch id, identity digest (None: a reference
    server, which publishes none) and key domain."""

    def __init__(self, seed: int, num_pages: int, epoch: int, *, identity: bool = True,
                 domain_bits: int | None = None, pages: np.ndarray | None = None) -> None:
        self.pages = synthetic_pages(seed, 0, num_pages) if pages is None else pages
        self.num_pages, self.epoch = num_pages, epoch
        self.domain_bits = domain_bits or domain_bits_for(num_pages)
        name = f"seed {seed} epoch {epoch}".encode()
        self.digest = "0x" + hashlib.blake2b(name, digest_size=16).hexdigest() if identity else None

    def page(self, p: int) -> bytes:
        return self.pages[p].tobytes()

    def scan(self, keys: list[DpfKey]) -> np.ndarray:
        lanes = self.pages.reshape(self.num_pages, 256, 16)
        out = np.empty((len(keys), 4096), np.uint8)
        for i, k in enumerate(keys):
            masks = eval_range(k, 0, self.num_pages)
            out[i] = np.bitwise_xor.reduce(lanes & masks[:, None, :], axis=0).reshape(-1)
        return out


class Party:
    """One fake party: GET /epoch and queries over HTTP or a handle, from `world`.

    `lagging` holds worlds to answer the next queries from instead (a replica behind /epoch);
    `check_domain=False` answers keys of any domain, as a server that does not check would."""

    def __init__(self, world: World, *, check_domain: bool = True) -> None:
        self.world = world
        self.check_domain = check_domain
        self.lagging: list[World] = []
        self.epoch_reads = 0
        self.sent: list[list[list[bytes]]] = []

    def epoch_doc(self) -> dict[str, Any]:
        self.epoch_reads += 1
        w = self.world
        doc: dict[str, Any] = {
            "epoch_id": w.epoch, "num_rows": w.num_pages, "seeds": [0, 0, 0],
            "block_number": 0, "state_root": "0x" + "00" * 32,
            "page_pir": {"domain_bits": w.domain_bits, "rows_per_page": 1,
                         "num_pages": w.num_pages, "max_batch_queries": 4},
        }
        if w.digest:
            doc["identity"] = w.digest
        return doc

    def answer(self, raw: list[list[bytes]], *, hex_pages: bool) -> dict[str, Any]:
        self.sent.append(raw)
        w = self.lagging.pop(0) if self.lagging else self.world
        if self.check_domain:
            keys = wire.validate_queries(raw, wire.MSGPACK, domain_bits=w.domain_bits,
                                         max_queries=4).keys()
        else:
            keys = [DpfKey.from_bytes(k) for q in raw for k in q]
        acc = w.scan(keys)
        rows = [to_hex(r) if hex_pages else r.tobytes() for r in acc]
        out: dict[str, Any] = {"epoch_id": w.epoch}
        if w.digest:
            out["identity"] = w.digest
        out["results"] = [{"pages": rows[i : i + 3]} for i in range(0, len(rows), 3)]
        return out

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/epoch"):
            return httpx.Response(200, json=self.epoch_doc())
        packed = "msgpack" in request.headers["content-type"]
        obj = msgpack.unpackb(request.content) if packed else json.loads(request.content)
        batch = request.url.path.endswith("/batch")
        queries = obj["queries"] if batch else [obj]
        raw = [[k if packed else from_hex(k) for k in q["keys"]] for q in queries]
        try:
            out = self.answer(raw, hex_pages=not packed)
        except WireError as err:
            return httpx.Response(err.status, content=wire.error_body(err))
        if not batch:
            out["pages"] = out.pop("results")[0]["pages"]
        if packed:
            return httpx.Response(200, content=msgpack.packb(out, use_bin_type=True),
                                  headers={"content-type": "application/msgpack"})
        return httpx.Response(200, json=out)


class _Response:
    """A duck-typed DeploymentResponse: `result()` for sync code, awaitable for async."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.value, self.exc = None, None
        try:
            self.value = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the caller as a handle would
            self.exc = exc

    def result(self, timeout_s: float | None = None) -> Any:
        if self.exc:
            raise self.exc
        return self.value

    def __await__(self):
        async def get() -> Any:
            return self.result()
        return get().__await__()


class _Method:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> _Response:
        return _Response(lambda: self.fn(*args))


class FakeHandle:
    def __init__(self, party: Party) -> None:
        self.epoch = _Method(party.epoch_doc)
        self.query_batch = _Method(lambda queries: party.answer(queries, hex_pages=False))


class Client:
    """One blocking interface over the five ways to run a client."""

    def __init__(self, kind: str, a: Party, b: Party, retry: RetryPolicy = FAST) -> None:
        self.loop = asyncio.new_event_loop() if kind in ("async", "ahandle") else None
        if kind in ("json", "msgpack", "async"):
            parties = {"a": a, "b": b}

            def route(request: httpx.Request) -> httpx.Response:
                return parties[request.url.host](request)

            async def aroute(request: httpx.Request) -> httpx.Response:
                return route(request)

            if kind == "async":
                self.c: Any = AsyncPirClient("http://a", "http://b", encoding="msgpack",
                                             transport=httpx.MockTransport(aroute), retry=retry)
            else:
                self.c = PirClient("http://a", "http://b", encoding=kind,
                                   transport=httpx.MockTransport(route), retry=retry)
        else:
            self.c = HandlePirClient(FakeHandle(a), FakeHandle(b), retry=retry)
        self.prefix = "a" if kind == "ahandle" else ""

    def _call(self, name: str, *args: Any) -> Any:
        out = getattr(self.c, self.prefix + name)(*args)
        return self.loop.run_until_complete(out) if self.loop else out

    def get(self, pages: list[int]) -> list[bytes]:
        return self._call("get", pages)

    def get_with_epoch(self, pages: list[int]) -> tuple[int, list[bytes]]:
        return self._call("get_with_epoch", pages)

    def get_pinned(self, pages: list[int], num_pages: int | None = None) -> Any:
        return self._call("get_pinned", pages, num_pages)

    def info(self, refresh: bool = False) -> Any:
        return self._call("info", refresh)

    def close(self) -> None:
        if isinstance(self.c, PirClient):
            self.c.close()
        if self.loop:
            if isinstance(self.c, AsyncPirClient):
                self.loop.run_until_complete(self.c.aclose())
            self.loop.close()
