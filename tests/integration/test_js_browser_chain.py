"""A wallet's reads from a web page, end to end: a real chain (anvil) followed into two real
parties (local Ray Serve, over HTTP, CORS for the page's origin), and headless Chromium opening
clients/js/test/browser/chain.html, where viem, with the private provider as its transport,
reads the block number, an account's balance and its balance of an ERC-20 token through
eth_call, run in the page's EVM over private lookups. Every answer must be anvil's at the block
the page says it is proven at; with party B lying, every read is refused, never a number. The
page's screenshot is written to $MORPHOGEN_ARTIFACTS (else the test's temporary folder).

Needs Chromium, anvil and the page's bundle (`npm run build && npm run bundle:pages` in
clients/js, which .ci/run does); skipped without them, failed where CI is set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlencode

import pytest

from morphogen.chain.follow import Follower
from morphogen.chain.rpc import EthRpc
from morphogen.keyword.signing import load_signing_key, public_bytes
from tests.chain_node import DEV_ACCOUNTS, running_anvil
from tests.integration.conftest import (
    chain_follower,
    chain_owner,
    delete_apps,
    following_parties,
)

from .chromium import chromium, need_chromium
from .test_js_browser import JS, PAGE, need_bundle, site

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
PAGES = JS / "dist" / "browser-pages"
TOKEN = "browser-chain-admin-token-0123456789"
CONTRACTS = json.loads((ROOT / "tests" / "vectors" / "wallet_contracts.json").read_text())
HOLDER = DEV_ACCOUNTS[2]


def _word(n: int) -> str:
    return f"{n:064x}"


def _mine_and_follow(rpc: EthRpc, follower: Follower) -> dict:
    rpc.call("evm_mine")
    for _ in range(50):
        if not follower.step():
            return rpc.block("latest")
    raise AssertionError("the follower did not catch up")


@pytest.fixture(scope="module")
def chain_page(serve_instance, tmp_path_factory):
    """Chromium, the page's origin, anvil with a token, and two parties following it."""
    binary = need_chromium()
    need_bundle(PAGES / "chain-page.js")
    root = tmp_path_factory.mktemp("browser-chain")
    files = {"/": PAGE / "chain.html", "/chain.html": PAGE / "chain.html",
             "/chain-page.js": PAGES / "chain-page.js",
             "/chain-page.js.map": PAGES / "chain-page.js.map"}
    with running_anvil() as url, EthRpc(url) as rpc, site(files) as origin:
        rpc.call("evm_setAutomine", False)
        owner = chain_owner(url, root)
        urls = following_parties(serve_instance, owner, root, TOKEN, {"bcha": 1, "bchb": 1},
                                 cors_origins=[origin])
        follower = chain_follower(rpc, root, urls, TOKEN)
        try:
            deployed = rpc.call("eth_sendTransaction", {
                "from": DEV_ACCOUNTS[0], "gas": hex(2_000_000),
                "data": CONTRACTS["Token"]["bytecode"] + _word(10**24)})
            _mine_and_follow(rpc, follower)
            token = rpc.call("eth_getTransactionReceipt", deployed)["contractAddress"]
            transfer = "0xa9059cbb" + _word(int(HOLDER, 16)) + _word(1234 * 10**18)
            rpc.call("eth_sendTransaction", {"from": DEV_ACCOUNTS[0], "to": token,
                                             "data": transfer, "gas": hex(100_000)})
            block = _mine_and_follow(rpc, follower)
            with chromium(binary) as page:
                yield {"page": page, "origin": origin, "urls": urls, "rpc": rpc,
                       "token": token, "block": block,
                       "owner": public_bytes(load_signing_key(root / "o.key").public_key()).hex()}
        finally:
            delete_apps("bcha", "bchb")


def _open(env: dict, **extra: str) -> dict:
    query = {"a": env["urls"][0], "b": env["urls"][1], "owner": env["owner"],
             "holder": HOLDER, "token": env["token"], **extra}
    env["page"].open(f"{env['origin']}/chain.html?{urlencode(query)}")
    return env["page"].awaited("window.results")


def test_a_page_reads_a_balance_and_a_token_balance_as_the_node_answers(chain_page,
                                                                       tmp_path) -> None:
    rpc, block = chain_page["rpc"], chain_page["block"]
    got = _open(chain_page)
    steps = got["steps"]
    failed = {k: v for k, v in steps.items() if not v["ok"]}
    assert not failed, failed
    # proven at the block the follower published last, and every answer anvil's there
    assert (got["served"]["number"], got["served"]["hash"]) == (int(block["number"], 16),
                                                               block["hash"])
    at = {"blockHash": block["hash"]}
    assert int(steps["block number"]["value"]) == int(block["number"], 16)
    assert int(steps["balance (wei)"]["value"]) == int(rpc.call("eth_getBalance", HOLDER, at), 16)
    balance_of = "0x70a08231" + _word(int(HOLDER, 16))
    node = rpc.call("eth_call", {"to": chain_page["token"], "data": balance_of}, at)
    assert int(steps["token balance (eth_call)"]["value"]) == int(node, 16) == 1234 * 10**18
    assert steps["token symbol (eth_call)"]["value"] == "TST"
    assert got["seen"]["A"]["requests"] > 0 and got["seen"]["B"]["requests"] > 0
    shots = Path(os.environ.get("MORPHOGEN_ARTIFACTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    chain_page["page"].screenshot(shots / "browser_chain_page.png")
    print(f"chain page ms per step: { {k: round(v['ms'], 1) for k, v in steps.items()} }")


def test_with_a_lying_party_the_page_shows_errors_never_numbers(chain_page) -> None:
    honest = _open(chain_page)["steps"]
    steps = _open(chain_page, lie="b")["steps"]
    print({k: (v["ok"], v.get("value"), v.get("error", "")[:80]) for k, v in steps.items()})
    for name, step in steps.items():
        # a byte B changes where no proof covers it (a descriptor page's unsigned zero tail)
        # changes nothing asked: the answer is the honest one; anywhere else it is refused
        assert (step["ok"] and step["value"] == honest[name]["value"]) or \
            "no verified answer" in step["error"], (name, step)
    refused = [name for name, step in steps.items() if not step["ok"]]
    assert {"balance (wei)", "token balance (eth_call)"} <= set(refused), steps
