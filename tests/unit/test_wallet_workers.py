"""The EVM processes (real pyrevm, no loopback reads: every account a run touches is given up
front): a gas estimate is the node's search in a few runs; a run past its time is stopped and
its process replaced, the time counted from its start, not its queueing (clients' turns:
test_wallet_turns.py)."""

from __future__ import annotations

import threading

import pytest

from morphogen.chain.state import keccak256

pytest.importorskip("pyrevm")

from morphogen.wallet.workers import (  # noqa: E402 - after the skip
    ESTIMATE_ERROR_RATIO,
    CallWorkers,
    RunTimedOut,
    run_call,
)

# n = calldata word 0; loop n times (about 40 gas each), then STOP
LOOP = bytes.fromhex("600035" "5b" "80" "15" "6010" "57" "6001" "90" "03" "6003" "56" "5b" "00")
TO, SENDER, COINBASE = "0x" + "22" * 20, "0x" + "11" * 20, "0x" + "00" * 20
EMPTY = keccak256(b"")
ACCOUNTS = [(TO, 0, 1, keccak256(LOOP), LOOP), (SENDER, 0, 0, EMPTY, b""),
            (COINBASE, 0, 0, EMPTY, b"")]
BLOCK = {"number": 5, "timestamp": 1, "chain_id": 1, "gas_limit": 50_000_000}
URL = "http://127.0.0.1:9"  # nothing is read through it: a read would fail the run


def _tx(n: int, gas: int = 50_000_000) -> dict:
    return {"from": SENDER, "to": TO, "data": n.to_bytes(32, "big"), "value": 0, "gas": gas}


def test_an_estimate_is_the_nodes_search_on_one_evm():
    """The least gas that succeeds (as anvil answers), found from the optimistic guess in
    about log2(gas / 63) steps, not by halving the whole 50 M cap."""
    for n in (10, 300, 100_000):  # 22 k to 4 M gas
        got = run_call(URL, BLOCK, _tx(n), True, ACCOUNTS)
        assert got["ok"], (n, got)
        assert got["runs"] <= 3 + (got["gas"] // 63 + 2_300).bit_length(), (n, got)
        assert run_call(URL, BLOCK, _tx(n, got["gas"]), False, ACCOUNTS)["ok"]
        below = int(got["gas"] * (1 - ESTIMATE_ERROR_RATIO)) - 1
        assert not run_call(URL, BLOCK, _tx(n, below), False, ACCOUNTS)["ok"]
    # a call that fails with all the gas is the failure, not an estimate
    assert not run_call(URL, BLOCK, _tx(10**9), True, ACCOUNTS)["ok"]


@pytest.fixture(scope="module")
def workers():
    w = CallWorkers(1)
    yield w
    w.close()


def test_a_run_past_its_time_is_stopped_and_queueing_does_not_count(workers):
    first = workers.pids()
    with pytest.raises(RunTimedOut):
        workers.run(URL, BLOCK, _tx(10**9), False, 0.01, ACCOUNTS)  # 50 M gas of loop
    assert workers.pids() != first  # its process was killed and replaced
    got = workers.run(URL, BLOCK, _tx(100), False, 30.0, ACCOUNTS)
    assert got["ok"] and got["seconds"] < 30
    # twenty runs queued at once on one process, each limited to a second: together they
    # take longer than that, but each one's own time is what counts
    n = 40_000  # 1.6 M gas: milliseconds
    results: list[dict] = []

    def one() -> None:
        results.append(workers.run(URL, BLOCK, _tx(n), False, 1.0, ACCOUNTS))

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 20 and all(r["ok"] for r in results)


def test_an_access_list_is_paid_for_and_warm(workers):
    """EIP-2930: 2,400 gas an address and 1,900 a key on top of 21,000, as a node estimates a
    plain transfer with one address and two keys (27,200). The listed slots are loaded at the
    start, so they are read like any (here through a loopback that knows them)."""
    from morphogen.chain.state import Account
    from morphogen.wallet.loopback import CallReads, CallRoutes
    from morphogen.wallet.server import RpcServer
    from morphogen.wallet.state import CallCache
    from morphogen.wallet.versions import Served

    other = "0x" + "33" * 20
    cache = CallCache()
    for address in (TO, SENDER, COINBASE, other):
        cache.accounts[bytes.fromhex(address[2:])] = Account(0, 0, EMPTY)
    for slot in (1, 2):
        cache.words[(bytes.fromhex(other[2:]), slot.to_bytes(32, "big"))] = 0

    class Known:
        def known_code(self, code_hash):
            return b"" if code_hash == EMPTY else None

    routes = CallRoutes()
    server = RpcServer(None, "127.0.0.1", 0, route=routes.reads)
    server.start()
    try:
        reads = CallReads(Known(), Served(1, 5, "0x" + "ab" * 32, 1, 1), cache)
        url = f"{server.url}/call/{routes.open(reads)}"
        tx = {"from": SENDER, "to": other, "data": b"", "value": 0, "gas": 100_000}
        assert workers.run(url, BLOCK, tx, True, 30.0)["gas"] == 21_000
        listed = {**tx, "access_list": [[other, [1, 2]]]}
        assert workers.run(url, BLOCK, listed, True, 30.0)["gas"] == 27_200
        assert workers.run(url, BLOCK, listed, False, 30.0)["gas"] == 27_200
        assert not reads.want and reads.failure is None
    finally:
        server.shutdown()
        server.server_close()
