"""The endpoint's EVM processes in node: the TypeScript client's EVM (@ethereumjs/evm, in
clients/js/src/eth/call_worker.ts) in place of pyrevm.

pyrevm 0.3.7 bundles revm 8, whose "PRAGUE" predates the Prague mainnet runs and which knows
no Osaka: no EIP-7702 delegations, no EIP-7623 calldata floor, draft BLS precompiles, and
EIP-3607 applied to calls (a call from a Safe or a delegated account refused). The
ethereumjs EVM runs Prague and Osaka as the chain does and skips EIP-3607 for calls, as nodes
do. Its processes read state exactly as pyrevm's: each run asks its loopback URL
(loopback.py) for the four reads of pyrevm's fork mode, and the endpoint's rounds, padding
and limits are unchanged. A process takes a run at a time over its stdin and stdout (one JSON
line each way), behind `CallWorkers` as pyrevm's processes are: queued fairly, stopped at
their time limit, replaced when they die.

It needs node (>= 20.19) and the client built (`cd clients/js && npm ci && npm run build`);
`available()` says whether both are here.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
from pathlib import Path
from typing import Any

WORKER = (Path(__file__).resolve().parents[2] / "clients" / "js" / "dist" / "src" / "eth"
          / "call_worker.js")
BUILD = "cd clients/js && npm ci && npm run build"
# "chain": a public chain's fork at the run's block by its schedule (mainnet, sepolia, holesky,
# hoodi), Osaka for any other chain (anvil's default); or one fork for every block
HARDFORKS = ("chain", "prague", "osaka")
START_S = 60.0


def node_binary() -> str | None:
    return os.environ.get("MORPHOGEN_NODE") or shutil.which("node")


def available() -> str | None:
    """Why the node EVM cannot run here (None: it can)."""
    if node_binary() is None:
        return "node is not on PATH (or MORPHOGEN_NODE)"
    if not WORKER.is_file():
        return f"the TypeScript client is not built ({WORKER.name} missing): run `{BUILD}`"
    return None


def _job(url: str, block: dict, tx: dict, estimate: bool, accounts: list,
         hardfork: str) -> dict:
    prevrandao = block.get("prevrandao")
    return {
        "url": url, "estimate": estimate, "hardfork": hardfork,
        "block": {"number": block["number"], "timestamp": block["timestamp"],
                  "gas_limit": block["gas_limit"], "chain_id": block["chain_id"],
                  "coinbase": block.get("coinbase"),
                  "prevrandao": None if prevrandao is None else "0x" + bytes(prevrandao).hex()},
        "tx": {"from": tx["from"], "to": tx["to"], "data": "0x" + bytes(tx["data"]).hex(),
               "value": str(tx["value"]), "gas": tx["gas"],
               "access_list": [[a, [str(s) for s in slots]] for a, slots in tx["access_list"]]},
        "accounts": [[a, str(balance), nonce, "0x" + bytes(code_hash).hex(), "0x" + code.hex()]
                     for a, balance, nonce, code_hash, code in accounts],
    }


class _Pipe:
    """What `CallWorkers` uses of a process's connection: `send` a run's arguments, `poll`
    for its result, `recv` it; EOFError where the process has gone."""

    def __init__(self, proc: subprocess.Popen, hardfork: str) -> None:
        self._proc, self._hardfork = proc, hardfork
        self._buffer = b""

    def send(self, args: tuple) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(_job(*args, hardfork=self._hardfork)).encode() + b"\n")
        self._proc.stdin.flush()

    def poll(self, timeout: float) -> bool:
        if b"\n" in self._buffer:
            return True
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while True:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return False
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError("the EVM process closed its output")
            self._buffer += chunk
            if b"\n" in self._buffer:
                return True
            timeout = 0.05  # the rest of a line that has begun

    def recv(self) -> Any:
        while b"\n" not in self._buffer:
            self.poll(START_S)
        line, self._buffer = self._buffer.split(b"\n", 1)
        result = json.loads(line)
        if isinstance(result, dict) and "out" in result:
            result["out"] = bytes.fromhex(result["out"])
            result["gas"] = int(result["gas"])
        return result

    def close(self) -> None:
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):  # a dead process's pipe: nothing to flush to
                    stream.close()


class NodeProcess:
    """One node EVM process (for `CallWorkers(start=...)`)."""

    def __init__(self, hardfork: str = "chain") -> None:
        why = available()
        if why is not None:
            raise RuntimeError(f"the node EVM cannot run: {why}")
        if hardfork not in HARDFORKS:
            raise ValueError(f"the hardfork is one of {', '.join(HARDFORKS)}")
        self.proc = subprocess.Popen([node_binary(), str(WORKER)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.conn = _Pipe(self.proc, hardfork)
        try:
            if not self.conn.poll(START_S) or self.conn.recv() != "ready":
                raise RuntimeError(f"a node EVM process did not start within {START_S:g} s")
        except (EOFError, RuntimeError):
            self.kill()
            raise

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def kill(self) -> None:
        self.proc.kill()
        try:
            self.proc.wait(10)
        finally:
            self.conn.close()
