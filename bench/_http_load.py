"""The end-to-end benchmark's load: `c` keep-alive HTTP/1.1 connections in closed loops over
prepared request bodies, timed after a warm-up, with the CPU each process spent meanwhile."""

from __future__ import annotations

import asyncio
import time

from bench import _cpu_by_process as cpu_by_process


class _Conn:
    """A minimal HTTP/1.1 keep-alive client: the load generator shares the cores with the
    server, so it must cost far less per request than a general-purpose client."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        headers = head.lower()
        if b"transfer-encoding: chunked" in headers:
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            i = headers.index(b"content-length:")
            length = int(headers[i + 15 : headers.index(b"\r\n", i)])
            await self.reader.readexactly(length)
        if b"connection: close" in headers:
            await self.close()
        return status

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _raw_requests(url: str, path: str, bodies: list[bytes]) -> tuple[str, int, list[bytes]]:
    from urllib.parse import urlsplit

    u = urlsplit(url)
    full = u.path.rstrip("/") + path
    raws = [
        (f"POST {full} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
         f"Content-Type: application/json\r\nContent-Length: {len(b)}\r\n\r\n").encode() + b
        for b in bodies
    ]
    return u.hostname or "127.0.0.1", int(u.port or 80), raws


async def http_load(url: str, bodies: list[bytes], batch: int, c: int,
                     duration: float) -> tuple[list[float], float, int, dict[str, float]]:
    path = "/query/page/gpu" if batch == 1 else "/query/page/gpu/batch"
    host, port, raws = _raw_requests(url, path, bodies)
    conns = [_Conn(host, port) for _ in range(c)]
    errors = 0

    async def run(w: int, lat: list[float], until: float) -> None:
        nonlocal errors
        i = w
        while time.monotonic() < until:
            t = time.monotonic()
            try:
                status = await conns[w].request(raws[i % len(raws)])
            except (OSError, asyncio.IncompleteReadError):
                await conns[w].close()
                status = 0
            if status != 200:
                errors += 1
            else:
                lat.append(time.monotonic() - t)
            i += c

    warm: list[float] = []
    await asyncio.gather(*(run(w, warm, time.monotonic() + min(1.0, duration / 4))
                           for w in range(c)))
    lat: list[float] = []
    before = cpu_by_process.snapshot()
    t0 = time.monotonic()
    await asyncio.gather(*(run(w, lat, t0 + duration) for w in range(c)))
    seconds = time.monotonic() - t0
    cpu = cpu_by_process.spent(before)
    for conn in conns:
        await conn.close()
    return lat, seconds, errors, cpu
