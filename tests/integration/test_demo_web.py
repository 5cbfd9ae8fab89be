"""`morphogen demo --web` as a newcomer runs it: the command starts its own cluster and prints
a page's address; headless Chromium opens it, and the page shows the balance and the token
balance of the demo chain's holder (an eth_call run in the page), proven at the demo's block,
and what each party was sent: the same requests and bytes for another address asked. The
command stops on SIGINT. Needs Chromium and the page's bundle (as test_js_browser_chain.py).
"""

from __future__ import annotations

import signal
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest

from cluster.demo_web import BLOCK, CHAIN_ID, PAGE_FILES, demo_chain
from tests.integration.cli_process import CliProcess, cli_env

from .chromium import chromium, need_chromium
from .test_js_browser import need_bundle

ACCOUNTS = 300


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    binary = need_chromium()
    need_bundle(PAGE_FILES["/chain-page.js"])
    tmp = tmp_path_factory.mktemp("demo-web")
    proc = CliProcess(["demo", "--web", "--records", str(ACCOUNTS)], cli_env(tmp),
                      tmp / "demo.log")
    try:
        url = proc.wait_for(r"^open (http://\S+)$", timeout=240).group(1)
        with chromium(binary) as page:
            yield proc, page, url
    finally:
        proc.finish()


def _open(page, url: str, **changed: str) -> dict:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()} | changed
    page.open(f"{parts.scheme}://{parts.netloc}{parts.path}?{urlencode(query)}")
    return page.awaited("window.results")


def test_the_page_shows_the_holders_reads_proven_and_what_each_party_saw(demo) -> None:
    proc, page, url = demo
    chain = demo_chain(ACCOUNTS)
    got = _open(page, url)
    steps = got["steps"]
    assert all(s["ok"] for s in steps.values()), steps
    assert (got["served"]["chainId"], got["served"]["number"]) == (CHAIN_ID, BLOCK)
    assert int(steps["balance (wei)"]["value"]) == chain.balance
    assert int(steps["token balance (eth_call)"]["value"]) == chain.token_balance > 0
    assert steps["token symbol (eth_call)"]["value"] == "DEMO"
    # another address, holding none of the token: the parties are sent as much as before
    other = "0x" + "42" * 20
    again = _open(page, url, holder=other)
    assert again["steps"]["token balance (eth_call)"]["value"] == "0"
    assert again["seen"] == got["seen"] and got["seen"]["A"] == got["seen"]["B"]
    assert got["seen"]["A"]["requests"] > 0


def test_it_stops_on_sigint(demo) -> None:
    proc, _, _ = demo
    sent = proc.signal(signal.SIGINT)
    assert proc.wait_exit(sent, 60) == 0, proc.output[-3000:]
    assert proc.leftovers() == [], proc.output[-3000:]
