"""What a follower reports: its progress (head, served block, lag, rates, the last block's
seconds by phase) for its log lines and as Prometheus text at `--metrics-port`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Progress:
    """What the follower reports, and exports as metrics."""

    head: int = 0
    served: int = 0
    blocks: int = 0
    records: int = 0
    reorgs: int = 0
    last_seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # the last block's, in seconds
    started: float = field(default_factory=time.monotonic)

    @property
    def lag(self) -> int:
        return max(0, self.head - self.served)

    def rate(self) -> float:
        return self.blocks / max(time.monotonic() - self.started, 1e-9)

    def metrics(self) -> str:
        lines = []
        for name, kind, value, help_ in (
                ("head_block", "gauge", self.head, "the node's head block"),
                ("served_block", "gauge", self.served, "the block both parties serve"),
                ("lag_blocks", "gauge", self.lag, "head minus served"),
                ("blocks_total", "counter", self.blocks, "blocks published"),
                ("records_total", "counter", self.records, "records changed by them"),
                ("reorgs_total", "counter", self.reorgs, "reorgs followed"),
                ("block_seconds", "gauge", round(self.last_seconds, 6),
                 "seconds the last block took, read to published")):
            lines += [f"# HELP morphogen_chain_{name} {help_}",
                      f"# TYPE morphogen_chain_{name} {kind}",
                      f"morphogen_chain_{name} {value}"]
        lines += ["# HELP morphogen_chain_phase_seconds the last block's seconds by phase "
                  "(trace: header and trace; read: values from the node; apply: the owner's "
                  "version; wait: behind party A's leg of the block before; publish: both "
                  "parties, B's after A's)",
                  "# TYPE morphogen_chain_phase_seconds gauge"]
        lines += [f'morphogen_chain_phase_seconds{{phase="{k}"}} {round(v, 6)}'
                  for k, v in self.phases.items()]
        return "\n".join(lines) + "\n"


class BlockPhases:
    """Laps of one block's work: trace (from `started`), read, apply, wait, publish."""

    def __init__(self, started: float) -> None:
        self.laps: dict[str, float] = {"trace": time.monotonic() - started}
        self._at = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = now - self._at
        self._at = now

    def __str__(self) -> str:
        return " ".join(f"{k} {v:.2f}" for k, v in self.laps.items())


def serve_metrics(progress: Progress, port: int, host: str = "127.0.0.1") -> Any:
    """Prometheus text of `progress` at http://host:port/metrics, from a daemon thread; the
    returned server's `shutdown()` stops it."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = progress.metrics().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="chain-metrics").start()
    return server
