"""A header checked against its block hash: a Prague header as anvil (1.7.1) served it hashes to
its hash; any field changed, or one left out, does not; the environment a call sees is read
from a header that checks, and only from one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from morphogen.chain.headers import HeaderMismatch, environment, header_hash

HEADER = json.loads((Path(__file__).parents[1] / "vectors" / "anvil_prague_header.json")
                    .read_text())


def test_a_header_hashes_to_its_block_hash():
    assert header_hash(HEADER) == HEADER["hash"]
    env = environment(HEADER, HEADER["hash"])
    assert (env.number, env.timestamp, env.gas_limit) == (
        int(HEADER["number"], 16), int(HEADER["timestamp"], 16), int(HEADER["gasLimit"], 16))
    assert env.coinbase == HEADER["miner"] and env.prevrandao.hex() == HEADER["mixHash"][2:]


@pytest.mark.parametrize("field", ["gasLimit", "miner", "mixHash", "timestamp", "number",
                                   "baseFeePerGas", "requestsHash"])
def test_a_header_that_does_not_hash_to_the_signed_hash_is_refused(field):
    bad = dict(HEADER)
    value = bad[field]
    bad[field] = value[:-1] + ("1" if value[-1] != "1" else "2")
    with pytest.raises(HeaderMismatch):
        environment(bad, HEADER["hash"])
    short = {k: v for k, v in HEADER.items() if k != "requestsHash"}  # a field left out
    with pytest.raises(HeaderMismatch):
        environment(short, HEADER["hash"])
    with pytest.raises(HeaderMismatch):
        environment(None, HEADER["hash"])


def test_a_header_not_had_is_asked_again_on_a_timer_never_on_a_calls_path():
    """A call's block environment: the header is asked for when the block is first seen,
    and one the node could not give (down, behind, or one that does not check) is asked
    again on a timer of its own, a few times, never when a call runs (the node would learn
    when calls run); once had, it is kept."""
    from morphogen.wallet import blocks
    from morphogen.wallet.versions import Served

    asked, timers = [], []
    answers = [OSError("refused"), dict(HEADER, miner="0x" + "11" * 20), HEADER]

    def headers(block_hash):
        asked.append(block_hash)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    envs = blocks.BlockEnvironments(headers, later=lambda s, action: timers.append(action))
    served = Served(31337, int(HEADER["number"], 16), HEADER["hash"], 3, 1_700_000_000)
    assert envs.environment(served) is None and len(asked) == 1  # the version's hook
    for _ in range(3):  # calls at that block: the fallback, and nothing asked
        assert envs.block(served)["gas_limit"] == blocks.CALL_GAS
    assert len(asked) == 1 and len(timers) == 1
    timers.pop()()  # a header that does not check: asked again later
    assert len(asked) == 2 and envs.block(served)["timestamp"] == served.time
    timers.pop()()
    assert envs.block(served)["timestamp"] == int(HEADER["timestamp"], 16)
    assert len(asked) == 3 and not timers
    assert envs.block(served)["gas_limit"] == int(HEADER["gasLimit"], 16) and len(asked) == 3
    # a node that never gives it is asked TRIES times in all, then left alone
    never = blocks.BlockEnvironments(lambda h: (asked.append(h), None)[1],
                                     later=lambda s, action: timers.append(action))
    other = Served(31337, 5, "0x" + "cd" * 32, 4, 1_700_000_000)
    asked.clear()
    never.environment(other)
    while timers:
        timers.pop()()
    assert len(asked) == blocks.TRIES and never.block(other)["gas_limit"] == blocks.CALL_GAS
