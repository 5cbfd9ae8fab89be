"""A TCP gate on loopback in front of the S3 test server: open (forwards every connection),
down (nothing listens: connections are refused) or hung (connections are accepted and never
answered). What a store outage and a hung store look like to the code under test, on the
real wire."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

OPEN, DOWN, HUNG = "open", "down", "hung"


class Gate:
    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 80)
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.mode = DOWN
        self._listener: socket.socket | None = None
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()

    def set(self, mode: str) -> None:
        with self._lock:
            self.mode = mode
            for s in self._held:  # an outage drops what was open
                with contextlib.suppress(OSError):
                    s.close()
            self._held.clear()
            if mode == DOWN and self._listener is not None:
                # shutdown wakes the thread blocked in accept(): a bare close would leave the
                # port listening until that call returns
                with contextlib.suppress(OSError):
                    self._listener.shutdown(socket.SHUT_RDWR)
                self._listener.close()
                self._listener = None
            elif mode != DOWN and self._listener is None:
                lst = socket.socket()
                lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                lst.bind(("127.0.0.1", self.port))
                lst.listen(64)
                self._listener = lst
                threading.Thread(target=self._accept, args=(lst,), daemon=True).start()

    def _accept(self, lst: socket.socket) -> None:
        while True:
            try:
                conn, _ = lst.accept()
            except OSError:
                return  # closed: the gate went down
            with self._lock:
                self._held.append(conn)
                mode = self.mode
            if mode == OPEN:
                threading.Thread(target=self._forward, args=(conn,), daemon=True).start()

    def _forward(self, conn: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._target)
        except OSError:
            conn.close()
            return
        with self._lock:
            self._held.append(upstream)

        def pipe(a: socket.socket, b: socket.socket) -> None:
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=pipe, args=(upstream, conn), daemon=True).start()
        pipe(conn, upstream)

    def close(self) -> None:
        self.set(DOWN)


@contextlib.contextmanager
def gate_to(target: str, mode: str = OPEN) -> Iterator[Gate]:
    gate = Gate(target)
    gate.set(mode)
    try:
        yield gate
    finally:
        gate.close()
