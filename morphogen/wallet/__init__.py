"""A wallet's Ethereum JSON-RPC endpoint over private, verified state (`morphogen rpc`).

- `state`: `PrivateState`, account, storage and code reads through the keyword tables of a
  followed chain, each held to one signed block (`versions`: `Served`, that block, and whether
  the parties still serve it);
- `methods`: the JSON-RPC methods answered from it, in a node's formats, and their params;
- `jsonrpc`: `Endpoint`, requests, batches, errors, and the upstream node for the rest;
- `server`: `RpcServer`, the HTTP endpoint with CORS, and `Upstream`;
- `evm`: `CallService`, eth_call and eth_estimateGas in revm over the same private reads:
  `call_params` (the call), `loopback` (its runs' reads), `rounds` (reads shared by the calls
  in flight), `memo` (what calls read last time), `costs` (limits and padding), `blocks` (the
  block a run sees), `call_errors` (how a call fails);
- `workers`: the processes revm runs in (fair, time-limited), `guard`: the HTTP checks.

The modules import one way, from `evm` down to `versions` (pyproject.toml's wallet layers).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from morphogen.wallet.evm import CallService
    from morphogen.wallet.jsonrpc import Endpoint
    from morphogen.wallet.server import RpcServer, Upstream
    from morphogen.wallet.state import PrivateState
    from morphogen.wallet.versions import Served

# Loaded when first named: the EVM processes import `workers` alone (spawned, each a fresh
# interpreter), not the endpoint, its state and their clients.
_WHERE = {"CallService": "evm", "Endpoint": "jsonrpc", "RpcServer": "server",
          "Upstream": "server", "PrivateState": "state", "Served": "versions"}

__all__ = ["CallService", "Endpoint", "PrivateState", "RpcServer", "Served", "Upstream"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"morphogen.wallet.{_WHERE[name]}"), name)
