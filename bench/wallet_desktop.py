"""The wallet endpoint's HTTP layer under a desktop's worst: many idle connections and many
slow batches at once, and a fresh client's `eth_chainId` meanwhile.

The endpoint (`RpcServer` + `Endpoint`) is real, over real loopback HTTP; the state behind it is
a stand-in that answers `eth_chainId` at once and makes every `eth_getBalance` take `--slow`
seconds (a private read that waits on the parties), so what is measured is the server: its
threads, its per-batch threads, its connection handling. The private reads themselves are
bench/wallet_rpc.py's.

Measured in one run: a fresh connection's `eth_chainId` latency (p50/p99 over `--probes`), on
its own and as a two-request batch, alone (the baseline), then while `--idle` connections sit
open sending nothing and `--batches` clients each have a batch of 100 slow `eth_getBalance` in
flight. Target: p99 <= 50 ms under
1,000 idle connections and 100 slow batches.

    python bench/wallet_desktop.py [--idle 1000] [--batches 100] [--slow 2] [--probes 50]
Results: bench/results/wallet_desktop.json
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from morphogen.chain.state import Account  # noqa: E402
from morphogen.wallet import Endpoint, RpcServer, Served  # noqa: E402

RESULTS = ROOT / "bench" / "results"
HEAD = Served(31337, 100, "0x" + "ab" * 32, 7, int(time.time()))


class SlowState:
    """Answers the head at once; each account read takes `slow_s`."""

    def __init__(self, slow_s: float) -> None:
        self.slow_s = slow_s

    def current(self) -> Served:
        return HEAD

    def head(self) -> Served:
        return HEAD

    def asked(self, addresses=()) -> None:
        pass

    def cached_account(self, address):
        return None

    def accounts(self, addresses):
        time.sleep(self.slow_s)
        return [Account(1, 10**18, bytes(32)) for _ in addresses], HEAD


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _probe(url: str, n: int, batch: bool = False) -> dict:
    """A fresh connection's eth_chainId, alone or (`batch`) as a batch with eth_blockNumber,
    as a wallet opening sends it (a batch runs on threads, which another client's slow
    batches must not hold)."""
    one = {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}
    body = [one, {"jsonrpc": "2.0", "id": 2, "method": "eth_blockNumber", "params": []}] \
        if batch else one
    ms = []
    for _ in range(n):
        with httpx.Client(timeout=120) as fresh:  # a new connection each time
            t = time.perf_counter()
            got = fresh.post(url, json=body).json()
            ms.append((time.perf_counter() - t) * 1e3)
            got = got[0] if batch else got
            assert got["result"] == hex(HEAD.chain_id)
    return {"n": n, "p50_ms": round(_pct(ms, 0.5), 2), "p99_ms": round(_pct(ms, 0.99), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--slow", type=float, default=2.0)
    ap.add_argument("--probes", type=int, default=50)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.idle + 1024)), hard))
    server = RpcServer(Endpoint(SlowState(args.slow)), "127.0.0.1", 0)
    server.start()
    url = server.url
    out: dict = {"idle": args.idle, "batches": args.batches, "slow_s": args.slow}
    try:
        out["alone"] = _probe(url, args.probes)
        out["alone_batch"] = _probe(url, args.probes, batch=True)
        host, port = server.server_address[:2]
        idle = [socket.create_connection((host, port)) for _ in range(args.idle)]
        batch = json.dumps([{"jsonrpc": "2.0", "id": i, "method": "eth_getBalance",
                             "params": ["0x" + f"{i:040x}", "latest"]}
                            for i in range(100)]).encode()
        done: list[float] = []

        def slow_client() -> None:
            t = time.perf_counter()
            r = httpx.post(url, content=batch, timeout=300,
                           headers={"Content-Type": "application/json"})
            assert len(r.json()) == 100
            done.append(time.perf_counter() - t)

        clients = [threading.Thread(target=slow_client) for _ in range(args.batches)]
        for c in clients:
            c.start()
        time.sleep(min(1.0, args.slow / 2))  # the batches in flight
        out["loaded"] = _probe(url, args.probes)
        out["loaded_batch"] = _probe(url, args.probes, batch=True)
        out["batches_in_flight_at_end"] = args.batches - len(done)
        for c in clients:
            c.join(600)
        out["batch_s_p50"] = round(_pct(done, 0.5), 2)
        for s in idle:
            s.close()
    finally:
        server.shutdown()
        server.server_close()
    out["p99_ratio_loaded_to_alone"] = round(out["loaded"]["p99_ms"] / out["alone"]["p99_ms"], 2)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "wallet_desktop.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
