"""The wallet endpoint's eth_call on today's chain rules: its EVM processes in node (the
ethereumjs EVM, `--evm ethereumjs`) against anvil, which runs Osaka's rules by default. A
chain set up at one block (a contract, an account delegated to it by EIP-7702, storage) is
exported into two real parties, and every call through the endpoint must answer as anvil
answers at that block: a call to the delegated account (its code runs in its own storage), a
call from it and from a contract (EIP-3607 is not applied to calls), Osaka's CLZ opcode, the
BLS12-381 G1 addition precompile, and gas estimates with Prague's calldata floor (EIP-7623)
and an access list. revm 8 (pyrevm) halts or refuses every one of these but the access list.

Needs anvil, node and clients/js built (`npm ci && npm run build`); skipped without them,
failed where CI is set.
"""

from __future__ import annotations

import httpx
import pytest

from morphogen.chain.rpc import EthRpc
from morphogen.client import PirClient
from morphogen.wallet import CallService, Endpoint, PrivateState, RpcServer
from tests.chain_node import DEV_ACCOUNTS, need_node_evm, running_anvil
from tests.integration.conftest import chain_owner, delete_apps, deploy

pytestmark = pytest.mark.ray

# returns (SLOAD(0), ADDRESS, CALLER), whatever it is called with
READER = bytes.fromhex("600054600052" "30602052" "33604052" "60606000f3")
# returns CLZ(1): 255 (Osaka, EIP-7939)
CLZ = bytes.fromhex("60011e60005260206000f3")
DELEGATED = DEV_ACCOUNTS[5]
READER_AT = "0x" + "c0" * 20
CLZ_AT = "0x" + "c1" * 20
BLS_G1ADD = "0x000000000000000000000000000000000000000b"
# BLS12-381's G1 generator, each coordinate in EIP-2537's 64 bytes
G1 = ("00" * 16 + "17f1d3a73197d7942695638c4fa9ac0fc3688c4f9774b905a14e3a3f171bac586c55e83ff97a1aef"
      "fb3af00adb22c6bb" + "00" * 16 + "08b3f481e3aaa0f1a09e30ed741d8ae4fcf5e095d5d00af600db18cb"
      "2c04b3edd03cc744a2888ae40caa232946c5e7e1")


@pytest.fixture(scope="module")
def chain(serve_instance, tmp_path_factory):
    need_node_evm()
    root = tmp_path_factory.mktemp("forks")
    with running_anvil() as url, EthRpc(url) as rpc:
        rpc.call("anvil_setCode", READER_AT, "0x" + READER.hex())
        rpc.call("anvil_setCode", CLZ_AT, "0x" + CLZ.hex())
        rpc.call("anvil_setStorageAt", READER_AT, "0x0", "0x" + "00" * 31 + "07")
        # an EOA delegated to the reader (EIP-7702's designator), with storage of its own
        rpc.call("anvil_setCode", DELEGATED, "0xef0100" + READER_AT[2:])
        rpc.call("anvil_setStorageAt", DELEGATED, "0x0", "0x" + "00" * 30 + "1234")
        rpc.call("evm_mine")
        block = rpc.block("latest")
        owner = chain_owner(url, root)
        urls = []
        for name in ("wfa", "wfb"):
            deploy(serve_instance, name, snapshot=str(owner.snapshot_dir(1)), num_shards=1)
            urls.append(serve_instance.app_url(name))
        pir = PirClient(*urls)
        state = PrivateState(pir, root / "o.pub")
        calls = CallService(state, processes=1, evm="ethereumjs")
        server = RpcServer(Endpoint(state, calls=calls.calls), "127.0.0.1", 0)
        server.start()
        try:
            yield {"rpc": rpc, "url": url, "block": block, "server": server}
        finally:
            server.shutdown()
            server.server_close()
            calls.close()
            pir.close()
            delete_apps("wfa", "wfb")


def _both(chain, method: str, tx: dict) -> tuple[dict, dict]:
    """The endpoint's answer and anvil's at the chain's block."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": [tx]}
    mine = httpx.post(chain["server"].url, json={**body, "params": [tx, "latest"]}).json()
    at = {"blockHash": chain["block"]["hash"]}
    theirs = httpx.post(chain["url"], json={**body, "params": [tx, at]}).json()
    return mine, theirs


@pytest.mark.parametrize("tx", [
    pytest.param({"from": DEV_ACCOUNTS[1], "to": DELEGATED}, id="to-a-7702-delegated-account"),
    pytest.param({"from": DELEGATED, "to": READER_AT}, id="from-a-7702-delegated-account"),
    pytest.param({"from": READER_AT, "to": READER_AT}, id="from-a-contract"),
    pytest.param({"to": CLZ_AT}, id="osaka-clz"),
    pytest.param({"to": BLS_G1ADD, "data": "0x" + G1 + "00" * 128}, id="bls12-381-g1add-g-0"),
    pytest.param({"to": BLS_G1ADD, "data": "0x" + G1 + G1}, id="bls12-381-g1add-g-g"),
])
def test_a_call_answers_as_anvil_does(chain, tx) -> None:
    mine, theirs = _both(chain, "eth_call", tx)
    assert "result" in theirs, theirs
    assert mine.get("result") == theirs["result"], (mine, theirs)


@pytest.mark.parametrize("tx", [
    # EIP-7623: 1,000 non-zero calldata bytes cost the floor, 21,000 + 40,000
    pytest.param({"from": DEV_ACCOUNTS[1], "to": READER_AT, "data": "0x" + "ab" * 1000},
                 id="calldata-floor"),
    pytest.param({"from": DEV_ACCOUNTS[1], "to": READER_AT, "accessList": [
        {"address": READER_AT, "storageKeys": ["0x" + "00" * 32]}]}, id="access-list"),
    pytest.param({"from": DEV_ACCOUNTS[1], "to": DELEGATED}, id="to-a-delegated-account"),
])
def test_a_gas_estimate_is_anvils(chain, tx) -> None:
    mine, theirs = _both(chain, "eth_estimateGas", tx)
    assert "result" in theirs, theirs
    assert mine.get("result") == theirs["result"], (mine, theirs)
    if "data" in tx:
        assert int(mine["result"], 16) == 61_000
