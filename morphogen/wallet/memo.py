"""The memo of what recent calls read (`CallMemo`): a prediction of what a call reads at the
next version, so its first round there asks it all, and, all calls together, the working set
read at each new version (evm.py, "The working set").
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from morphogen.wallet.call_params import Call
from morphogen.wallet.rounds import Want

MEMO_CALLS = 4096


class CallMemo:
    """What each recent call read (the reads of the run that answered it), by the call: at
    the next version the same call's first round asks all of it at once, where the reads
    would otherwise come a round after another (the account, then its code, then its words).
    A prediction only: every value a run sees is still read at its block."""

    def __init__(self, size: int = MEMO_CALLS) -> None:
        self._size = size
        self._calls: OrderedDict[Call, Want] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, call: Call, read: Want) -> None:
        with self._lock:
            self._calls[call] = read
            self._calls.move_to_end(call)
            while len(self._calls) > self._size:
                self._calls.popitem(last=False)

    def last(self, call: Call) -> Want:
        """All the call read last time (empty for a call not seen)."""
        with self._lock:
            last = self._calls.get(call)
        return Want() if last is None else Want(set(last.accounts), set(last.code),
                                                set(last.words))

    def union(self) -> Want:
        """Everything the remembered calls read: the working set."""
        out = Want()
        with self._lock:
            for read in self._calls.values():
                out.merge(read)
        return out
