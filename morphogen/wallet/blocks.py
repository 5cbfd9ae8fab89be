"""What a call's runs see of their block: the served block's environment (timestamp, gas limit,
COINBASE, PREVRANDAO) from a node's header of it, checked against the hash the owner signed,
read once a block and kept for the last ENVS_KEPT.

The header comes from the upstream node (`eth_getBlockByHash`), which is trusted for nothing:
a header that does not hash to the signed block is not used. Without one, a run sees the
block's number and the owner's version time, the gas cap as gas limit, COINBASE and
PREVRANDAO 0. A block whose header could not be had (the node down, or not at that block
yet, or a header that does not check) is asked again `RETRY_S` later, not given up for the
block: a request that failed once must not leave every call at that block on the fallback.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from morphogen.chain.headers import BlockEnvironment, environment
from morphogen.wallet.call_params import CALL_GAS
from morphogen.wallet.versions import Served

ENVS_KEPT = 8  # block environments of the last blocks served
RETRY_S = 2.0  # a header not had is asked again after this long (not on every call)
log = logging.getLogger(__name__)


class BlockEnvironments:
    """The environments of the blocks served, by `headers(block_hash)`: a node's header of
    that block (None: no headers, every run sees the fallback)."""

    def __init__(self, headers: Callable[[str], Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._headers, self._clock = headers, clock
        # block hash -> (its environment, or None and when to ask again)
        self._envs: OrderedDict[str, tuple[BlockEnvironment | None, float]] = OrderedDict()
        self._lock = threading.Lock()

    def environment(self, served: Served) -> BlockEnvironment | None:
        """`served`'s block environment from its checked header, read once a block (a header
        not had: again after `RETRY_S`)."""
        if self._headers is None:
            return None
        with self._lock:
            if served.hash in self._envs:
                env, again = self._envs[served.hash]
                if env is not None or self._clock() < again:
                    return env
        try:
            env = environment(self._headers(served.hash), served.hash)
        except Exception as exc:  # noqa: BLE001 - no header, or one that does not check
            log.warning("the served block's header: %s", type(exc).__name__)
            env = None
        with self._lock:
            self._envs[served.hash] = (env, self._clock() + RETRY_S)
            self._envs.move_to_end(served.hash)
            while len(self._envs) > ENVS_KEPT:
                self._envs.popitem(last=False)
        return env

    def block(self, served: Served) -> dict:
        """What a run at `served` sees of its block."""
        env = self.environment(served)
        if env is None:
            return {"number": served.number, "timestamp": served.time,
                    "chain_id": served.chain_id, "gas_limit": CALL_GAS}
        return {"number": env.number, "timestamp": env.timestamp, "chain_id": served.chain_id,
                "gas_limit": env.gas_limit, "coinbase": env.coinbase,
                "prevrandao": env.prevrandao}
