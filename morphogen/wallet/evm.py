"""`eth_call` and `eth_estimateGas` over private state: revm (pyrevm) over accounts, code and
storage words read through private, verified lookups at the served block.

pyrevm's only lazy state is its fork mode, which asks a JSON-RPC URL for each account
(`eth_getBalance`, `eth_getTransactionCount`, `eth_getCode`) and word (`eth_getStorageAt`) as
execution reaches them, at one block number, every load in every frame (reverted ones too). So
each run of a call gets a URL of its own on a loopback server here (`CallReads` behind
`/call/<token>`) that answers those four methods from what the calls at that block have read,
and nothing else (loopback.py). pyrevm holds the interpreter lock while it waits on its HTTP
requests, so it runs in worker processes (`CallWorkers`), never in the process that answers
them.

Runs and rounds. The loopback never waits on the parties: what a run asks that is not known yet
(an account, a code hash's code, a word) is answered with a placeholder and noted, and the run
is thrown away. What it noted is read in the next round (morphogen/wallet/rounds.py: shared with
the other calls in flight) and the call runs again. A run that asked nothing unknown is the
answer: every value it saw was read at its block and verified. A run takes milliseconds, a round
a private request of each table, so a call costs its rounds: ERC-20 `balanceOf` would be three
(the accounts, the token's code, the balance word). Code is kept across versions (it is checked
against its hash), and `CallMemo` (memo.py) has the same call's first round ask everything it
read last time, so a call repeated at a new version takes one; a run is given the accounts the
call read before that are known at its block (`CallReads.preloaded`), so it asks the loopback
only for the rest. A call starts at the newest version seen here without reading the head:
the parties' GET /epoch, read while it runs, or else its first round, says whether that
version is still served (docs/wallet.md).

The working set. At each new version a read of the head finds (the watcher's, or a request's:
`PrivateState.on_new_version`), what the remembered calls read and the accounts asked by
address are read again in one round (`PrivateCalls.warm`), while state was asked in the last
WARM_IDLE_S: a wallet reopening finds its state read at the served block. A call whose run
then asks nothing unknown is confirmed by both parties' GET /epoch naming the data its version
was read from (`PrivateState.still_served`), not by a round: zero rounds, nothing asked about
any key.

Padding. Every round asks accounts and storage once each (code where new), its lookups padded
to buckets (`PrivateState.read_round`), and a call's count of rounds is raised to the next of
ROUND_BUCKETS (costs.py) with rounds of random keys (which ride along with other calls' rounds
when there are any); a call answered from the working set reads none. The parties learn those
buckets and how many calls were in flight, not which contract was called nor what it read; the
working set's round comes with each publication, whenever the wallet opens. The timing of the
rounds is not padded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from morphogen.wallet.blocks import BlockEnvironments
from morphogen.wallet.call_errors import CallFailed, CallLimit
from morphogen.wallet.call_params import Call, call_param
from morphogen.wallet.costs import MAX_CALL_LOOKUPS, MAX_ROUNDS, Tally, round_bucket
from morphogen.wallet.loopback import CallReads, CallRoutes
from morphogen.wallet.memo import CallMemo
from morphogen.wallet.methods import InvalidParams, NotServed, block_param
from morphogen.wallet.rounds import Coming, Rounds, Want, lacking
from morphogen.wallet.server import RpcServer
from morphogen.wallet.state import CallCache, PrivateState
from morphogen.wallet.versions import Served
from morphogen.wallet.workers import CallWorkers, RunTimedOut, current_request

RUN_S = 10.0  # EVM time one call's runs may take together
EVMS = ("revm", "ethereumjs")
WARM_IDLE_S = 600.0  # the working set is read at each new version while state was asked
TRIES = 4  # runs at a version: a call may start at one the parties have left
log = logging.getLogger(__name__)


class PrivateCalls:
    """eth_call and eth_estimateGas: revm in `workers`, its reads served by `routes` on the
    loopback server at `url`, read privately in `rounds` shared by the calls in flight."""

    def __init__(self, state: PrivateState, workers: CallWorkers, routes: CallRoutes,
                 url: Callable[[], str], *, run_s: float = RUN_S,
                 headers: Callable[[str], Any] | None = None) -> None:
        """`run_s`: the EVM time one call's runs may take together (rounds not counted).
        `headers(block_hash)`: a node's header of that block (the upstream's
        `eth_getBlockByHash`), checked against the signed hash, for what a call sees of its
        block; without it, or where it does not check, the block's number and the owner's
        version time, the gas cap as gas limit, COINBASE and PREVRANDAO 0."""
        self.state, self.workers, self.routes, self.url = state, workers, routes, url
        self.run_s = run_s
        self.rounds = Rounds(state)
        self._memo = CallMemo()
        self.blocks = BlockEnvironments(headers)
        state.on_new_version(self.warm)
        if headers is not None:
            # one header request a publication, when it is seen, whatever the wallet does
            state.on_new_version(self.blocks.environment)

    def warm(self, served: Served) -> None:
        """Read the working set (what the remembered calls read, the accounts asked by
        address) at `served`, when state was asked in the last WARM_IDLE_S: one round, padded
        as any, that the requests then find read."""
        if time.monotonic() - self.state.last_asked > WARM_IDLE_S:
            return
        latest = self.state.latest
        if latest is not None and latest.version > served.version:
            return  # a newer one came meanwhile (the head read that finds it warms it)
        cache = self.state.call_cache(served)
        want = lacking(self._working_set(), self.state, cache)
        if want:
            self.rounds.fetch(served, cache, want)

    def _working_set(self) -> Want:
        want = self._memo.union()
        want.accounts.update(self.state.recent_accounts())
        return want

    def _naming(self, want: Want, served: Served) -> Want:
        """A round at a version not confirmed, reading `want`: it is read at the version
        served now. Where the parties are known to have left `served`, that is a newer one
        whose reads start empty, so the round reads the working set too (what `warm` would
        read there): the calls coming after it find their reads done, where each wave of
        requests would otherwise take a round of its own. `want` itself is not changed (it
        may be what the run read, which the memo keeps)."""
        if not self.state.left(served):
            return want
        out = self._working_set()
        out.merge(want)
        return out

    def _run(self, call: Call, served: Served, cache: CallCache, estimate: bool,
             tally: Tally, accounts: set[bytes] = frozenset()) -> tuple[dict, Want, Want]:
        """One run, within what is left of the call's run time; the `accounts` known at
        `served` go with it (read, not asked for)."""
        _check_given_up()
        left = self.run_s - tally.seconds
        if left <= 0:
            raise RunTimedOut(f"the call's runs took {self.run_s:g} s of EVM time")
        reads = CallReads(self.state, served, cache)
        token = self.routes.open(reads)
        try:
            block = self.blocks.block(served)
            # no more gas than the block holds (revm refuses more; anvil gives a call the
            # block's gas limit by default)
            result = self.workers.run(
                f"{self.url()}/call/{token}", block,
                {"from": call.sender, "to": call.to, "data": call.data, "value": call.value,
                 "gas": min(call.gas, block["gas_limit"]),
                 "access_list": [list(e) for e in call.access_list]},
                estimate, left, reads.preloaded(accounts))
        finally:
            self.routes.close(token)
        tally.seconds += result.get("seconds", 0.0)
        # a read refused (a block hash, another block) is the call's answer, unless the run
        # saw placeholders: a path that real values may not take, thrown away anyway
        if reads.failure is not None and not reads.want:
            raise reads.failure
        return result, reads.want, reads.touched

    def _execute(self, params: list, method: str, estimate: bool) -> dict:
        # coming from the start: a batch announced this call (`Rounds.expecting`), and a call
        # refused here arrives at once rather than keep a round waiting for it
        with self.rounds.coming() as coming:
            if not 1 <= len(params) <= 3:
                raise InvalidParams(f"{method} takes 1 to 3 params, got {len(params)}")
            call = call_param(params[0])
            wanted = block_param(params[1] if len(params) > 1 else None)
            if len(params) > 2 and params[2] not in (None, {}):
                raise NotServed("state overrides are not run privately")
            self.state.asked()
            tally = Tally()
            try:
                return self._execute_coming(call, wanted, estimate, coming, tally)
            finally:
                # Whatever the call ended on (an answer, a revert, a read refused such as
                # BLOCKHASH, a limit, a timeout, an error of the parties, a version change on
                # the way), its rounds are raised to the same buckets: the parties cannot
                # tell the contract's path from their count.
                self._pad(tally)

    def _pad(self, tally: Tally) -> None:
        # A round that failed ends the call's rounds, its own and the padding's alike. A party
        # can make any round fail; were the call padded after its own round k failed, but not
        # after a padding round k, the rounds that follow would tell which round k was, and
        # so how many the contract's path took. Ended at the failure, a call sends k rounds
        # either way.
        if tally.served is None or tally.cache is None or tally.failed:
            return
        for _ in range(round_bucket(tally.rounds) - tally.rounds):
            try:
                self.rounds.fetch(tally.served, tally.cache, Want())
            except Exception as exc:  # noqa: BLE001 - the call's own outcome stands
                log.debug("a padding round: %s", type(exc).__name__)
                return

    def _round(self, tally: Tally, want: Want, served: Served, cache: CallCache,
               reading: Want, coming: Coming | None, *, held: bool = False
               ) -> tuple[Served | None, bool]:
        """One of the call's rounds, within its limits: `want` its own reads, `reading`
        what the round asks for it (the working set may ride along)."""
        _check_given_up()
        if tally.rounds >= MAX_ROUNDS:
            raise CallLimit(f"the call reads state over more than {MAX_ROUNDS} rounds")
        tally.reads.merge(want)
        if tally.lookups() > MAX_CALL_LOOKUPS:
            raise CallLimit(f"the call reads more than {MAX_CALL_LOOKUPS} accounts, storage "
                            "words and codes")
        try:
            at, read = self.rounds.fetch(served, cache, reading, coming, held=held)
        except BaseException:
            tally.failed = True
            raise
        if read:
            tally.rounds += 1
            tally.served, tally.cache = served, cache
        return at, read

    def _execute_coming(self, call: Call, wanted: Any, estimate: bool, coming: Coming,
                        tally: Tally) -> dict:
        # A call for the served block starts at the newest version seen here, unconfirmed:
        # a run on that version's reads stands where both parties still serve its data
        # (GET /epoch); else its first round is read at the version served now, and names it
        # where it is newer (the round then counts for that version, not lost). No call
        # reads the head on its own (a head read costs more).
        served = self.state.latest if wanted.number is None and wanted.hash is None else None
        confirmed = False
        for _ in range(TRIES):
            if served is None:
                served, confirmed = self.rounds.head(), True
            wanted.check(served)
            cache = self.state.call_cache(served)
            if tally.served is None:
                tally.served, tally.cache = served, cache
            rounds, at = 0, served
            # Both parties' /epoch naming the very data the version was read from confirms
            # it (no round); read while the call runs, where it can confirm at all.
            confirming = None if confirmed else self.state.confirming(served)
            # what the same call read last time: its first round, before any run (only what
            # this version's reads lack, where /epoch may confirm the version; all of it
            # otherwise, the round then saying which version the parties serve)
            last = self._memo.last(call)
            want = (lacking(last, self.state, cache)
                    if confirmed or confirming is not None else last)
            accounts = set(last.accounts)
            while True:
                if want:
                    rounds += 1
                    at, read = self._round(
                        tally, want, served, cache,
                        want if confirmed else self._naming(want, served), coming,
                        held=confirmed or confirming is not None)
                    if at != served:
                        break
                    confirmed = confirmed or read
                # the accounts the call read last time, and in this call's runs so far
                result, want, touched = self._run(call, served, cache, estimate, tally,
                                                  accounts)
                accounts |= touched.accounts
                if confirming is not None:
                    confirmed = confirmed or confirming.result()
                    confirming = None
                if not want and not confirmed:
                    # Nothing unknown, at a version not yet confirmed: what the run read,
                    # read again. At that version, the run's answer stands; at a newer
                    # one, that version's cache has what the call needs there.
                    rounds += 1
                    at, _ = self._round(tally, touched, served, cache,
                                        self._naming(touched, served), coming)
                    confirmed = at == served
                    break
                if not want:
                    break
                if rounds == 0:  # and whatever the run will ask next, in the same round
                    want.merge(lacking(last, self.state, cache))
            if at != served:  # a newer version (or a publication mid-round: the head)
                served, confirmed = at, at is not None
                continue
            self._memo.put(call, touched)
            return result
        raise NotServed(f"the served block moved during each of {TRIES} runs of the call")

    def eth_call(self, params: list) -> str:
        result = _succeeded(self._execute(params, "eth_call", estimate=False))
        return "0x" + result["out"].hex()

    def eth_estimate_gas(self, params: list) -> str:
        result = _succeeded(self._execute(params, "eth_estimateGas", estimate=True))
        return hex(result["gas"])


def _check_given_up() -> None:
    """`Cancelled` where the request this call is for was given up (its client gone, its
    deadline passed): no round and no run more for it (its rounds are still padded)."""
    request = current_request()
    if request is not None:
        request.check()


def _succeeded(result: dict) -> dict:
    if result["ok"]:
        return result
    if "RejectCallerWithCode" in result["reason"]:
        # Nodes skip EIP-3607 for eth_call and eth_estimateGas; this EVM (pyrevm 0.3.7, revm
        # 8) cannot, and hiding the sender's code would answer wrongly where the call reads
        # it or calls back. So not answered here: upstream, or refused saying why.
        raise NotServed("a call from an address with code (a Safe, a 4337 account, any "
                        "contract) is not run privately: this EVM applies EIP-3607 to calls")
    raise CallFailed(result["reason"], result["out"])


class CallService:
    """eth_call and eth_estimateGas for one endpoint: the worker processes, the loopback
    server their reads go to, and `calls` (a `PrivateCalls`) for the Endpoint."""

    def __init__(self, state: PrivateState, *, processes: int = 2,
                 run_s: float = RUN_S, headers: Callable[[str], Any] | None = None,
                 evm: str = "revm", hardfork: str = "chain") -> None:
        """`evm`: "revm" (pyrevm, in Python processes) or "ethereumjs" (node processes:
        node_evm.py, today's forks), `hardfork` the latter's rules (node_evm.HARDFORKS)."""
        if evm not in EVMS:
            raise ValueError(f"the EVM is one of {', '.join(EVMS)}")
        start = None
        if evm == "ethereumjs":
            from functools import partial

            from morphogen.wallet.node_evm import NodeProcess

            start = partial(NodeProcess, hardfork)
        self.evm = evm
        self.routes = CallRoutes()
        # the runs' reads: answered from memory at once, their only client this process's
        self.server = RpcServer(None, "127.0.0.1", 0, route=self.routes.reads,
                                request_s=None, watch=False)
        self.server.start()
        try:
            self.workers = CallWorkers(processes, start=start)
        except BaseException:
            self.server.shutdown()
            self.server.server_close()
            raise
        self.calls = PrivateCalls(state, self.workers, self.routes, lambda: self.server.url,
                                  run_s=run_s, headers=headers)

    def close(self) -> None:
        self.workers.close()
        self.server.shutdown()
        self.server.server_close()
