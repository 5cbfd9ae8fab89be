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
thread a server enforces the second (`Deadlines`), and watches the connections whose requests
are being answered: a client that closes its connection meanwhile (a wallet's timeout, a tab
closed) has its request given up (`watch`), as a node's HTTP server cancels a request's
context when its client goes away. A client that half-closes its connection after sending
is taken as gone too (a node does the same).
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Iterable

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
    blocked read returns at once, with nothing); and sockets whose client may go away while
    its request is answered (`watch`). One thread checks them every `tick_s`."""

    def __init__(self, tick_s: float = 0.25) -> None:
        self._due: dict[socket.socket, float] = {}
        self._watched: dict[socket.socket, Callable[[], None]] = {}
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

    def watch(self, sock: socket.socket, gone: Callable[[], None]) -> None:
        """`gone()` once `sock`'s client closes or resets the connection, until `unwatch`.
        Only while nothing reads the socket: what arrives is peeked at, never taken."""
        with self._lock:
            self._watched[sock] = gone

    def unwatch(self, sock: socket.socket) -> None:
        with self._lock:
            self._watched.pop(sock, None)

    def close(self) -> None:
        self._stop.set()

    def _reap(self) -> None:
        while not self._stop.wait(self._tick_s):
            now = time.monotonic()
            with self._lock:
                late = [s for s, due in self._due.items() if due <= now]
                for s in late:
                    del self._due[s]
                watched = list(self._watched.items())
            for s in late:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # closed meanwhile
            for s, gone in _departed(watched):
                with self._lock:
                    if self._watched.get(s) is not gone:
                        continue  # answered meanwhile
                    del self._watched[s]
                gone()


# the peer closed its end (Linux): seen without reading the socket, which its handler owns
_RDHUP = getattr(select, "POLLRDHUP", 0)


def _departed(watched: list[tuple[socket.socket, Callable[[], None]]]
              ) -> list[tuple[socket.socket, Callable[[], None]]]:
    """The watched sockets whose client has closed or reset its end. A client that sent
    more (a pipelined request) is still there."""
    poller = select.poll()
    by_fd: dict[int, tuple[socket.socket, Callable[[], None]]] = {}
    for s, gone in watched:
        fd = s.fileno()
        if fd < 0:
            continue  # closed by its handler meanwhile
        by_fd[fd] = (s, gone)
        poller.register(fd, select.POLLIN | _RDHUP)
    out = []
    for fd, events in poller.poll(0):
        s, gone = by_fd[fd]
        if events & (select.POLLERR | select.POLLHUP | select.POLLNVAL | _RDHUP):
            out.append((s, gone))
        elif not _RDHUP and _at_end(s):
            out.append((s, gone))
    return out


def _at_end(s: socket.socket) -> bool:
    """Where poll cannot say so: whether a readable socket's next read is its end."""
    try:
        return not s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:  # reset
        return True
