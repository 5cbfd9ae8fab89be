"""Every source of a block's changes gives the same `Touched`: on a real anvil, blocks of
transfers, deployments, storage writes (new, rewritten, zeroed), reverted and failed
transactions and self-destructs (before and after EIP-6780), traced by the prestate tracer and
by `trace_replayBlockTransactions`, agree key for key and expectation for expectation, and the
node's values after each block meet them. The probe picks the cheapest source a node answers
and falls back where it answers none; a malformed or foreign trace stops with the block and the
transaction named."""

from __future__ import annotations

from typing import Any

import pytest
from chain_node import DEV_ACCOUNTS, running_anvil

from morphogen.chain.blocks import ChainMoved, Header, header, read_state
from morphogen.chain.rpc import ChainError, EthRpc, MethodMissing, RpcError, quantity
from morphogen.chain.traces import PRESTATE, REPLAY, REPLAY_BY_NUMBER, Tracer, touched_by

# with calldata (slot, word) it stores the word; without, it self-destructs to the caller
RUNTIME = bytes.fromhex("36600757" "33ff00" "5b" "602035" "600035" "55" "00")
# init: SSTORE(1, 42), then return the runtime
INIT = (bytes.fromhex("602a600155") + b"\x61" + len(RUNTIME).to_bytes(2, "big")
        + bytes.fromhex("80" "6011" "6000" "39" "6000" "f3"))
REVERTS = bytes.fromhex("6001600055" "60006000fd")  # SSTORE(0, 1), then REVERT
REVERTS_INIT = (b"\x61" + len(REVERTS).to_bytes(2, "big")
                + bytes.fromhex("80" "600c" "6000" "39" "6000" "f3"))
DESTRUCT_AT_BIRTH = bytes.fromhex("33ff")


def _send(rpc: EthRpc, sender: int = 0, **tx: Any) -> str:
    return rpc.call("eth_sendTransaction", {"from": DEV_ACCOUNTS[sender], **tx})


def _store(rpc: EthRpc, contract: str, slot: int, word: int, **kw: Any) -> str:
    return _send(rpc, to=contract, gas=quantity(100_000),
                 data="0x" + slot.to_bytes(32, "big").hex() + word.to_bytes(32, "big").hex(),
                 **kw)


def _same_everywhere(rpc: EthRpc, tracer: Tracer) -> Header:
    """Mine the pending transactions; every source's Touched of the block is the same, and
    the node's values after it meet its expectations."""
    rpc.call("evm_mine")
    head = header(rpc, rpc.block_number())
    prestate = touched_by(rpc, head, PRESTATE)
    for touched in (tracer.touched(head), touched_by(rpc, head, tracer.source or REPLAY)):
        assert touched.accounts == prestate.accounts
        assert touched.slots == prestate.slots
        assert touched.expected == prestate.expected
    read_state(rpc, head, prestate, pause_s=0.0)
    return head


def _receipt(rpc: EthRpc, tx: str) -> dict:
    return rpc.call("eth_getTransactionReceipt", tx)


def test_every_source_gives_the_prestate_tracers_keys_and_expectations() -> None:
    with running_anvil() as url, EthRpc(url) as rpc:
        rpc.call("evm_setAutomine", False)
        tracer = Tracer(rpc)
        fresh = ["0x" + bytes([0x31 + i]).hex() * 20 for i in range(3)]
        # deployments: with a constructor's store and value; one whose code reverts when
        # called; one that self-destructs in its creating transaction (with value: it goes
        # back); transfers to new accounts (one of zero value: nothing changes) and between
        # existing ones
        deployed = _send(rpc, data="0x" + (INIT + RUNTIME).hex(), gas=quantity(300_000),
                         value="0x99")
        reverter = _send(rpc, data="0x" + (REVERTS_INIT + REVERTS).hex(),
                         gas=quantity(300_000))
        _send(rpc, 2, data="0x" + DESTRUCT_AT_BIRTH.hex(), gas=quantity(200_000), value="0x5")
        _send(rpc, 3, to=fresh[0], value="0x0")
        _send(rpc, 3, to=fresh[1], value=hex(10**18))
        _send(rpc, 4, to=DEV_ACCOUNTS[5], value="0x7")
        head = _same_everywhere(rpc, tracer)
        assert tracer.source in (REPLAY, REPLAY_BY_NUMBER)  # anvil answers the replay
        assert len(head.transactions) == 6
        contract = _receipt(rpc, deployed)["contractAddress"]
        reverts = _receipt(rpc, reverter)["contractAddress"]
        assert rpc.call("eth_getStorageAt", contract, "0x1", "latest") == "0x" + "00" * 31 + "2a"

        # storage: new slots, one rewritten and zeroed within the block, the constructor's
        # slot zeroed, a write of the value it holds; a call that reverts after a store, one
        # that runs out of gas
        _store(rpc, contract, 5, 7)
        _store(rpc, contract, 6, 2**255 + 3)
        _store(rpc, contract, 5, 0)
        _store(rpc, contract, 1, 0)
        _store(rpc, contract, 6, 2**255 + 3)
        failed = [_send(rpc, 4, to=reverts, gas=quantity(100_000)),
                  _send(rpc, 5, to=contract, gas=quantity(23_000), data="0x" + "00" * 64)]
        head = _same_everywhere(rpc, tracer)
        assert len(head.transactions) == 7
        assert [_receipt(rpc, t)["status"] for t in failed] == ["0x0", "0x0"]

        # a self-destruct of a contract created before (EIP-6780: only its balance moves),
        # then a store into it; and a block with no transaction
        _send(rpc, to=contract, gas=quantity(100_000), data="0x")
        _store(rpc, contract, 9, 1)
        _same_everywhere(rpc, tracer)
        _same_everywhere(rpc, tracer)


def test_a_self_destruct_before_eip_6780_deletes_the_account() -> None:
    """Before Cancun a self-destruct deletes the account, which a replay's stateDiff need not
    say (anvil's shows its balance going to zero): such blocks are traced by the prestate
    tracer."""
    with running_anvil(args=["--hardfork", "shanghai"]) as url, EthRpc(url) as rpc:
        rpc.call("evm_setAutomine", False)
        tracer = Tracer(rpc)
        deployed = _send(rpc, data="0x" + (INIT + RUNTIME).hex(), gas=quantity(300_000),
                         value="0x99")
        _same_everywhere(rpc, tracer)
        contract = _receipt(rpc, deployed)["contractAddress"]
        _store(rpc, contract, 3, 4)
        _same_everywhere(rpc, tracer)
        _send(rpc, to=contract, gas=quantity(100_000), data="0x")
        head = _same_everywhere(rpc, tracer)
        assert head.deletes and tracer.source is None  # never probed: no replay asked
        touched = tracer.touched(head)
        assert touched.expected[("gone", bytes.fromhex(contract[2:]))] is True
        assert rpc.call("eth_getCode", contract, "latest") == "0x"


class Node:
    """A node's answers, set by the test: method -> result, or an exception to raise."""

    shown = "http://node"

    def __init__(self, **answers: Any) -> None:
        self.answers, self.calls = answers, []

    def call(self, method: str, *params: Any) -> Any:
        self.calls.append(method)
        answer = self.answers.get(method)
        if answer is None:
            raise MethodMissing(f"no {method}", method, -32601, "method not found")
        if isinstance(answer, Exception):
            raise answer
        return answer(*params) if callable(answer) else answer


HEAD = Header(7, "0x" + "ab" * 32, "0x" + "cd" * 32, 100, bytes(20), (),
              ("0x" + "01" * 32, "0x" + "02" * 32))
A = "0x" + "aa" * 20


def _diff(nonce_to: str = "0x2") -> dict:
    return {A: {"balance": "=", "code": "=", "storage": {},
                "nonce": {"*": {"from": "0x1", "to": nonce_to}}}}


def _replays(*diffs: Any, hashes: tuple[str, ...] | None = None) -> list[dict]:
    return [{"stateDiff": d, "transactionHash": h}
            for d, h in zip(diffs, hashes or HEAD.transactions, strict=True)]


def _block(number: str, *_: Any) -> dict:
    return {"hash": HEAD.hash}


def test_the_probe_takes_the_first_source_the_node_answers() -> None:
    refused = RpcError("bad params", "trace_replayBlockTransactions", -32602, "invalid params")
    by_hash = Node(trace_replayBlockTransactions=_replays(_diff(), _diff("0x3")))
    tracer = Tracer(by_hash)  # type: ignore[arg-type]
    assert tracer.touched(HEAD).expected[("nonce", bytes.fromhex(A[2:]))] == 3
    assert tracer.source == REPLAY

    def by_number_only(block: str, kinds: list) -> list:
        if len(block) == 66:
            raise refused
        return _replays(_diff(), _diff())

    node = Node(trace_replayBlockTransactions=by_number_only, eth_getBlockByNumber=_block)
    tracer = Tracer(node)  # type: ignore[arg-type]
    tracer.touched(HEAD)
    assert tracer.source == REPLAY_BY_NUMBER
    node.calls.clear()
    tracer.touched(HEAD)  # the source is kept: no probe again
    assert node.calls == ["trace_replayBlockTransactions", "eth_getBlockByNumber"]

    prestate = [{"result": {"pre": {A: {"nonce": 1}}, "post": {A: {"nonce": 2}}}}] * 2
    node = Node(debug_traceBlockByHash=prestate)
    tracer = Tracer(node)  # type: ignore[arg-type]
    tracer.touched(HEAD)
    assert tracer.source == PRESTATE
    # no trace_ namespace: the other form of the same method is not tried
    assert node.calls == ["trace_replayBlockTransactions", "debug_traceBlockByHash"]
    with pytest.raises(ChainError, match="has no debug_traceBlockByHash"):
        Tracer(Node()).touched(HEAD)  # type: ignore[arg-type]


@pytest.mark.parametrize("traces, message", [
    ({"not": "a list"}, "not a list of traces"),
    (_replays(_diff(), hashes=("0x" + "01" * 32,)), "1 traces for its 2"),
    ([{"stateDiff": _diff()}, {"output": "0x"}], "block 7, transaction 1: .* no stateDiff"),
    (_replays(_diff(), {A: {"nonce": {"~": 1}}}), "block 7, transaction 1: a malformed"),
    (_replays(_diff(), {A: {"storage": {"0x1": "0x2"}}}), "block 7, transaction 1: a malfor"),
    (_replays(_diff(), {"0x12": {}}), "block 7, transaction 1: a malformed"),
    (_replays(_diff(), _diff(), hashes=(HEAD.transactions[0], "0x" + "09" * 32)),
     "block 7, transaction 1: the trace names transaction 0x0909"),
])
def test_a_malformed_or_foreign_replay_names_the_block_and_transaction(traces, message) -> None:
    node = Node(trace_replayBlockTransactions=traces)
    with pytest.raises(ChainError, match=message):
        Tracer(node, REPLAY).touched(HEAD)  # type: ignore[arg-type]


def test_a_block_replaced_while_traced_by_number_is_tried_again() -> None:
    node = Node(trace_replayBlockTransactions=_replays(_diff(), _diff()),
                eth_getBlockByNumber={"hash": "0x" + "ee" * 32})
    with pytest.raises(ChainMoved, match="block 7 changed"):
        Tracer(node, REPLAY_BY_NUMBER).touched(HEAD)  # type: ignore[arg-type]
    # by number, each trace must name its transaction
    node = Node(trace_replayBlockTransactions=[{"stateDiff": _diff()}] * 2,
                eth_getBlockByNumber=_block)
    with pytest.raises(ChainError, match="transaction 0: the trace names transaction None"):
        Tracer(node, REPLAY_BY_NUMBER).touched(HEAD)  # type: ignore[arg-type]


def test_a_malformed_prestate_diff_names_the_block_and_transaction() -> None:
    node = Node(debug_traceBlockByHash=[
        {"result": {"pre": {}, "post": {}}}, {"result": {"pre": {"0x12": {}}, "post": {}}}])
    with pytest.raises(ChainError, match="block 7, transaction 1: a malformed prestate"):
        Tracer(node, PRESTATE).touched(HEAD)  # type: ignore[arg-type]
