"""A publisher waiting for another's undecided proposal (morphogen.publication.lease.BusyWait):
short reads again once the log moves, longer ones while one proposal holds, never past its
lease. A fake log and a patched clock: the policy is asserted, no timing."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from morphogen.party import publisher as publisher_module
from morphogen.publication import lease as lease_module
from morphogen.publication.lease import FIRST_POLL_S, MAX_POLL_S
from morphogen.publication.log import EpochLogBusy


class _HeldLog:
    """A log another publisher holds: `holders` names its undecided proposal at each read."""

    durable = True

    def __init__(self, holders: list[tuple[int, str, str]], left_s: float = 5.0) -> None:
        self.holders, self.left_s, self.reads = list(holders), left_s, 0

    def propose(self, *args: object) -> str:
        self.reads += 1
        if self.holders:
            raise EpochLogBusy("busy", self.left_s, self.holders.pop(0))
        return "proposed"


def _waits(log: _HeldLog, monkeypatch: pytest.MonkeyPatch, read_s: float = 0.0
           ) -> list[float]:
    """What a publisher sleeps between its reads of `log` until its proposal is appended,
    each read taking `read_s` by the clock that times them."""
    slept: list[float] = []
    ticks = iter(range(1000))
    monkeypatch.setattr(lease_module, "poll_clock", lambda: read_s * next(ticks))
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await real_sleep(0)

    # the wait's own module only: patching asyncio.sleep itself would also catch (and speed
    # up) the sleeps of any event loop another test left running in a thread
    monkeypatch.setattr(lease_module, "asyncio", SimpleNamespace(sleep=sleep))
    party = SimpleNamespace(cfg=SimpleNamespace(admin_timeout_s=60.0, admin_failpoint_file=None),
                            epoch_log=log, unavailable=RuntimeError)
    pub = publisher_module.Publisher(party)  # type: ignore[arg-type]
    assert asyncio.run(pub._propose("pub-y", "req", lambda head, seq: None)) == "proposed"
    return slept


def test_a_waiting_publisher_reads_again_soon_after_the_log_moves(monkeypatch):
    """The other publisher's next proposal follows its decision within milliseconds: a waiter
    that read the log every 250 ms missed that gap again and again (issue 28's two-writer p99).
    Waits start short and start short again when the log moved; they grow only while one
    proposal stays undecided, and never run past its lease."""
    a, b = (3, "pub-a", "router-1"), (5, "pub-b", "router-1")
    log = _HeldLog([a] * 8 + [b, b])
    slept = _waits(log, monkeypatch)
    assert log.reads == 11 and len(slept) == 10
    on_a, on_b = slept[:8], slept[8:]
    assert on_a[0] <= 1.5 * FIRST_POLL_S and on_b[0] <= 1.5 * FIRST_POLL_S
    assert on_a[-1] >= 0.5 * MAX_POLL_S  # one proposal held long: fewer reads
    assert max(slept) <= 1.5 * MAX_POLL_S
    # the lease ends sooner than the next step: read again just after it, to abort it
    assert _waits(_HeldLog([a] * 8, left_s=0.002), monkeypatch)[-1] <= 0.012
    # a long log read slowly: never read more often than a read takes, whatever moved
    assert min(_waits(_HeldLog([a, b, a, b]), monkeypatch, read_s=0.05)) >= 0.025
