"""The nonces of the transactions this endpoint sent to the upstream node, for `pending`.

A node answers eth_getTransactionCount(address, "pending") with its pool's transactions
counted, and wallet libraries ask it for the nonce of the next transaction (ethers' and viem's
`sendTransaction`): two sent one after the other get consecutive nonces. The parties serve the
signed block only, which a transaction sent a moment ago is not in, so answered as `latest`
the second of two would reuse the first's nonce and the node would refuse it.

So the endpoint keeps, for the sender of each transaction it forwarded and the node took, the
nonce after it, and answers `pending` with the larger of that and the signed block's nonce.
The sender and the nonce are the node's own answer for the transaction's hash
(eth_getTransactionByHash), asked once right after the send: the node holds that transaction
already, so the question tells it nothing new, and nothing is asked for an address that only
reads. An entry goes once the signed block's nonce reaches it, or after `KEEP_S` (a
transaction the pool dropped); at most `MAX_SENDERS` are kept, the oldest sent going first.
Transactions sent to the node some other way are not counted, as they are not here.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

KEEP_S = 600.0
MAX_SENDERS = 4096
_HASH = re.compile(r"0x[0-9a-fA-F]{64}")


class SentNonces:
    def __init__(self, keep_s: float = KEEP_S, max_senders: int = MAX_SENDERS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.keep_s, self.max_senders, self._clock = keep_s, max_senders, clock
        self._lock = threading.Lock()
        self._next: OrderedDict[bytes, tuple[int, float]] = OrderedDict()  # -> (nonce, when)

    def sent(self, address: bytes, nonce: int) -> None:
        """The node took a transaction of `address` with `nonce`."""
        with self._lock:
            was = self._next.pop(address, (0, 0.0))[0]
            self._next[address] = (max(was, nonce + 1), self._clock())
            while len(self._next) > self.max_senders:
                self._next.popitem(last=False)

    def pending(self, address: bytes, signed: int) -> int:
        """The nonce of `address`'s next transaction, given its nonce at the signed block."""
        with self._lock:
            entry = self._next.get(address)
            if entry is None:
                return signed
            nonce, when = entry
            if nonce <= signed or self._clock() - when > self.keep_s:
                del self._next[address]
                return signed
            return nonce


def learn(sent: SentNonces, forward: Callable[[dict], dict], tx_hash: object) -> None:
    """Note the sender and nonce of the transaction the node took as `tx_hash`, as the node
    gives them; nothing where it does not (an answer of another shape, the send's or the
    node's, is left alone)."""
    if not (isinstance(tx_hash, str) and _HASH.fullmatch(tx_hash)):
        return
    try:
        answer = forward({"jsonrpc": "2.0", "id": 1, "method": "eth_getTransactionByHash",
                          "params": [tx_hash]})
        tx = answer.get("result") if isinstance(answer, dict) else None
        if not isinstance(tx, dict):
            return
        sender, nonce = tx.get("from"), tx.get("nonce")
        if not (isinstance(sender, str) and isinstance(nonce, str)):
            return
        address = bytes.fromhex(sender.removeprefix("0x"))
        if len(address) != 20:
            return
        sent.sent(address, int(nonce, 16))
    except Exception:  # noqa: BLE001 - the send stands; `pending` is the signed block's
        return
