"""A wallet's Ethereum JSON-RPC endpoint over private, verified state (`morphogen rpc`).

- `state`: `PrivateState`, account, storage and code reads through the keyword tables of a
  followed chain, each held to one signed block;
- `methods`: the JSON-RPC methods answered from it, in a node's formats, and their params;
- `jsonrpc`: `Endpoint`, requests, batches, errors, and the upstream node for the rest;
- `server`: `RpcServer`, the HTTP endpoint with CORS, and `Upstream`;
- `evm`: `CallService`, eth_call and eth_estimateGas in revm over the same private reads.
"""

from morphogen.wallet.evm import CallService
from morphogen.wallet.jsonrpc import Endpoint
from morphogen.wallet.server import RpcServer, Upstream
from morphogen.wallet.state import PrivateState, Served

__all__ = ["CallService", "Endpoint", "PrivateState", "RpcServer", "Served", "Upstream"]
