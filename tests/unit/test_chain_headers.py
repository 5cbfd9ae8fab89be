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
