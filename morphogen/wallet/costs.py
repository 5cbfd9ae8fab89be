"""What one call may cost, and how its count of rounds is padded: `Tally` keeps a call's rounds,
its own reads and its runs' EVM time against the limits (`CallLimit` past them), and
`round_bucket` raises the rounds it read to the next of ROUND_BUCKETS, with rounds of random
keys, so the parties learn a bucket, not the contract's path (evm.py, "Padding").
"""

from __future__ import annotations

from morphogen.wallet.methods import NotServed
from morphogen.wallet.rounds import Want
from morphogen.wallet.state import CallCache
from morphogen.wallet.versions import Served

ROUND_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MAX_ROUNDS = ROUND_BUCKETS[-1]
# What one call may read, all its rounds together: a 50 M-gas loop over fresh slots would
# otherwise ask tens of thousands of lookups in one round.
MAX_CALL_LOOKUPS = 4096


def round_bucket(n: int) -> int:
    """The padded count of a call's `n` rounds (0 where a version change took its round)."""
    if n == 0:
        return 0
    for b in ROUND_BUCKETS:
        if n <= b:
            return b
    raise NotServed(f"the call reads state over more than {MAX_ROUNDS} rounds")


class Tally:
    """One call's costs so far: the rounds it read (for the padding), its own reads (for the
    lookup limit), and its runs' EVM time (for the time limit)."""

    def __init__(self) -> None:
        self.rounds = 0
        self.reads = Want()
        self.seconds = 0.0
        self.served: Served | None = None  # where its padding rounds go
        self.cache: CallCache | None = None
        # a round that failed (a party's error, most often): nothing more is sent for the
        # call, no padding either (wallet/evm.py, `_pad`)
        self.failed = False

    def lookups(self) -> int:
        return len(self.reads.accounts) + len(self.reads.words) + len(self.reads.code)

