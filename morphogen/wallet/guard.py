"""What the endpoint checks of an HTTP request before any JSON-RPC: who may send it (the Host it
names), what it is (JSON), and how long it may take to arrive.

A wallet's endpoint listens on the user's own machine, where every web page the user opens can
reach it. Two things keep those pages out, as nodes do:

- **Content type.** A page may send a "simple" cross-origin POST (no CORS preflight) only with
  `text/plain`, `application/x-www-form-urlencoded` or `multipart/form-data`. A body that does
  not say it is JSON is refused (415) before it is read as JSON-RPC: such a page can no longer
  make the endpoint run anything (an `eth_sendTransaction` forwarded to an `--upstream` with
  unlocked accounts, above all). A page that sends JSON must pass a preflight, which only the
  origins of `--cors-origin` pass.
- **Host.** A DNS-rebinding page (its own name resolving to 127.0.0.1) is same-origin with
  the endpoint and needs no preflight, but its requests name its own host. Only the names of
  `--allowed-hosts` are served (default: the loopback names), anything else is 403.

Connections: one waiting for its next request is closed after `IDLE_S`; a request must arrive
whole (request line, headers, body) within `ARRIVE_S` of its first byte, or its connection is
closed (a client trickling a byte at a time holds a thread no longer than that). One reaper
thread a server enforces the second (`Deadlines`).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable

IDLE_S = 30.0
ARRIVE_S = 10.0
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
# the media types nodes take for a JSON-RPC body (geth's list), parameters such as charset aside
JSON_TYPES = ("application/json", "application/json-rpc", "application/jsonrequest")


def is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() in JSON_TYPES


def host_name(header: str | None) -> str | None:
    """The name of a Host header, without its port ([::1]:8545 -> ::1); None for none."""
    if not header:
        return None
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        return header[1:end] if end > 0 else None
    if header.count(":") == 1:
        header = header.split(":", 1)[0]
    return header.rstrip(".") or None


class HostList:
    """The Host names served: `*` for any."""

    def __init__(self, names: Iterable[str] = LOOPBACK_HOSTS) -> None:
        names = [n.strip().lower() for n in names if n.strip()]
        self.any = "*" in names
        self.names = frozenset(host_name(n) or n for n in names if n != "*")

    def allows(self, header: str | None) -> bool:
        if self.any:
            return True
        name = host_name(header)
        return name is not None and name in self.names


class Deadlines:
    """Sockets that must finish something by a time: past it, the socket is shut down (a
    blocked read returns at once, with nothing). One thread checks them every `tick_s`."""

    def __init__(self, tick_s: float = 0.25) -> None:
        self._due: dict[socket.socket, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._tick_s = tick_s
        self._thread = threading.Thread(target=self._reap, name="morphogen-rpc-deadlines",
                                        daemon=True)
        self._thread.start()

    def arm(self, sock: socket.socket, within_s: float) -> None:
        with self._lock:
            self._due[sock] = time.monotonic() + within_s

    def disarm(self, sock: socket.socket) -> None:
        with self._lock:
            self._due.pop(sock, None)

    def close(self) -> None:
        self._stop.set()

    def _reap(self) -> None:
        while not self._stop.wait(self._tick_s):
            now = time.monotonic()
            with self._lock:
                late = [s for s, due in self._due.items() if due <= now]
                for s in late:
                    del self._due[s]
            for s in late:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # closed meanwhile
