"""What a call's runs see of their block: the served block's environment (timestamp, gas limit,
COINBASE, PREVRANDAO) from a node's header of it, checked against the hash the owner signed,
read once a block and kept for the last ENVS_KEPT.

The header comes from the upstream node (`eth_getBlockByHash`), which is trusted for nothing:
a header that does not hash to the signed block is not used. Without one, a run sees the
block's number and the owner's version time, the gas cap as gas limit, COINBASE and
PREVRANDAO 0.

The header is asked for when a version is first seen (the watcher's hook), whatever the wallet
does, so the node learns nothing of when calls run. One not had (the node down, or not at that
block yet, or a header that does not check) is asked again `RETRY_S` later, `TRIES` times in
all, on a timer of its own: never from a call's path, and never given up for the block after
one failed request, which left every call at that block on the fallback values.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from morphogen.chain.headers import BlockEnvironment, environment
from morphogen.wallet.call_params import CALL_GAS
from morphogen.wallet.versions import Served

ENVS_KEPT = 8  # block environments of the last blocks served
RETRY_S = 2.0  # a header not had is asked again this long after
TRIES = 5  # times a block's header is asked for, at most
log = logging.getLogger(__name__)


def _later(delay_s: float, action: Callable[[], object]) -> None:
    timer = threading.Timer(delay_s, action)
    timer.daemon = True
    timer.start()


class BlockEnvironments:
    """The environments of the blocks served, by `headers(block_hash)`: a node's header of
    that block (None: no headers, every run sees the fallback)."""

    def __init__(self, headers: Callable[[str], Any] | None = None,
                 later: Callable[[float, Callable[[], object]], None] = _later) -> None:
        self._headers, self._later = headers, later
        # block hash -> (its environment or None, the requests made for it)
        self._envs: OrderedDict[str, tuple[BlockEnvironment | None, int]] = OrderedDict()
        self._lock = threading.Lock()

    def environment(self, served: Served, *, again: bool = False) -> BlockEnvironment | None:
        """`served`'s block environment from its checked header: asked for the first time a
        block is seen, and (`again`) on the retry timer; otherwise what is known."""
        if self._headers is None:
            return None
        with self._lock:
            known = self._envs.get(served.hash)
            if known is not None and (known[0] is not None or not again):
                return known[0]
            tries = 0 if known is None else known[1]
            if tries >= TRIES:
                return None
        try:
            env: BlockEnvironment | None = environment(self._headers(served.hash), served.hash)
        except Exception as exc:  # noqa: BLE001 - no header, or one that does not check
            log.warning("the served block's header: %s", type(exc).__name__)
            env = None
        with self._lock:
            self._envs[served.hash] = (env, tries + 1)
            self._envs.move_to_end(served.hash)
            while len(self._envs) > ENVS_KEPT:
                self._envs.popitem(last=False)
        if env is None and tries + 1 < TRIES:
            self._later(RETRY_S, lambda: self.environment(served, again=True))
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
