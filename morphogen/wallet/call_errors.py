"""How an eth_call or eth_estimateGas ends without a result, besides a refusal (`NotServed`,
`InvalidParams`: methods.py) and a run past its time (`RunTimedOut`: workers.py).

Raised where calls run (evm.py) and answered with their JSON-RPC codes by the endpoint
(jsonrpc.py). They live apart from both so the endpoint imports nothing of the EVM's side,
which itself serves its runs' reads on the endpoint's HTTP server (server.py): the wallet's
modules import one way (pyproject.toml's wallet layers).
"""

from __future__ import annotations


class CallFailed(RuntimeError):
    """The call ran and did not succeed: reverted (with its data) or halted."""

    def __init__(self, reason: str, data: bytes = b"") -> None:
        super().__init__(reason)
        self.reason, self.data = reason, data


class CallLimit(RuntimeError):
    """A call past this endpoint's limits on what one call may read (JSON-RPC -32005)."""
