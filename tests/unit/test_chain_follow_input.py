"""`morphogen chain follow` on bad input, one line each: an unreachable node, an endpoint that
is not Ethereum, a node on another chain, a node without the tracer, a gap in the chain; the
block's own changes (system contracts, withdrawals, the fee recipient) and the trace's diff
read right; a follower's metrics."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from chain_node import free_port, running_anvil

from cluster.cli import main
from morphogen.chain.blocks import (
    BEACON_ROOTS_CONTRACT,
    HISTORY_CONTRACT,
    WITHDRAWAL_REQUESTS_CONTRACT,
    Header,
    Touched,
)
from morphogen.chain.export import BlockRef, ExportHeader, write_export
from morphogen.chain.progress import Progress
from morphogen.chain.state import word_bytes
from morphogen.chain.traces import _block_changes, _diff
from tests.web.server import reply_json

TIP = "0x" + "aa" * 32
A, B, C = "0x" + "01" * 20, "0x" + "02" * 20, "0x" + "03" * 20


@pytest.fixture(scope="module")
def owner(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("follow-input")
    assert main(["records", "keygen", "--out", str(root / "o.key")]) == 0
    write_export(root / "s.jsonl", ExportHeader(31337, BlockRef(5, TIP, "0x" + "bb" * 32,
                                                                "0x" + "cc" * 32)), [])
    assert main(["chain", "build", "--state", str(root / "s.jsonl"), "--signing-key",
                 str(root / "o.key"), "--out", str(root / "owner"), "--min-records", "64"]) == 0
    return root


class FakeNode(http.server.BaseHTTPRequestHandler):
    """A JSON-RPC node whose answers the test sets: method -> result, or an error dict."""

    answers: dict = {}

    def do_POST(self) -> None:  # noqa: N802 - the standard library's name
        request = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        answer = self.answers.get(request["method"], {"code": -32601, "message": "nope"})
        reply = {"jsonrpc": "2.0", "id": request["id"]}
        if isinstance(answer, dict) and "code" in answer:
            reply["error"] = answer
        else:
            reply["result"] = answer(request["params"]) if callable(answer) else answer
        reply_json(self, reply)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def fake_node(answers: dict) -> Iterator[str]:
    handler = type("Node", (FakeNode,), {"answers": answers})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _block(number: int, parent: str) -> dict:
    return {"number": hex(number), "hash": "0x" + f"{number:064x}", "parentHash": parent,
            "timestamp": "0x10", "miner": C, "withdrawals": []}


def _follow(owner: Path, url: str, capsys) -> str:
    capsys.readouterr()
    code = main(["chain", "follow", "--rpc", url, "--owner", str(owner / "owner"),
                 "--signing-key", str(owner / "o.key"), "--server-a", "http://127.0.0.1:9/a",
                 "--server-b", "http://127.0.0.1:9/b", "--token-env", "NO_SUCH_VARIABLE_SET",
                 "--blocks", "1", "--timeout", "5"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1, err
    return err


def test_bad_nodes_are_one_line_each(owner: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("NO_SUCH_VARIABLE_SET", "token-0123456789abcdef")
    assert "cannot reach the Ethereum node" in _follow(owner, f"http://127.0.0.1:{free_port()}",
                                                        capsys)
    with fake_node({"eth_chainId": "0x1"}) as url:
        assert "on chain 1" in _follow(owner, url, capsys)
    base = {"eth_chainId": hex(31337), "eth_blockNumber": "0x6"}
    with fake_node({**base, "eth_getBlockByNumber": lambda p: _block(int(p[0], 16), TIP)}) as url:
        assert "debug_traceBlockByHash" in _follow(owner, url, capsys)
    with fake_node({**base, "eth_getBlockByNumber": None}) as url:
        assert "has no block 6" in _follow(owner, url, capsys)
    with fake_node({**base, "eth_getBlockByNumber": lambda p: _block(int(p[0], 16), TIP),
                    "debug_traceBlockByHash": {"not": "a list"}}) as url:
        assert "not a list of traces" in _follow(owner, url, capsys)


def test_an_endpoint_that_is_not_ethereum(owner: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("NO_SUCH_VARIABLE_SET", "token-0123456789abcdef")

    class Web(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>hello</html>")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Web)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        err = _follow(owner, f"http://127.0.0.1:{server.server_address[1]}", capsys)
        assert "not an Ethereum JSON-RPC endpoint" in err
    finally:
        server.shutdown()
        server.server_close()


def test_a_node_of_another_chain_and_no_token(owner: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("NO_SUCH_VARIABLE_SET", raising=False)
    with running_anvil(chain_id=5) as url:
        assert "no admin token" in _follow(owner, url, capsys)
        monkeypatch.setenv("NO_SUCH_VARIABLE_SET", "token-0123456789abcdef")
        err = _follow(owner, url, capsys)
        assert "on chain 5" in err and "chain 31337" in err


def test_the_diff_and_the_blocks_own_changes() -> None:
    out = Touched()
    slot1, slot2 = "0x" + "00" * 31 + "01", "0x" + "00" * 31 + "02"
    # tx 1: A pays B, writes two slots; tx 2: zeroes slot 1 (in pre, not in post), deletes C
    _diff(out, {A: {"balance": "0x10", "nonce": 1, "storage": {slot1: "0x5"}},
                B: {"balance": "0x0"}},
          {A: {"balance": "0x8", "nonce": 2, "storage": {slot1: "0x6", slot2: "0x7"}},
           B: {"balance": "0x8"}})
    _diff(out, {A: {"storage": {slot1: "0x6"}}, C: {"balance": "0x3", "code": "0x6000"}},
          {A: {"nonce": 3}})
    a, b, c = (bytes.fromhex(x[2:]) for x in (A, B, C))
    assert out.accounts == {a, b, c}
    assert out.slots == {(a, word_bytes(1)), (a, word_bytes(2))}
    assert out.expected[("slot", a, word_bytes(1))] == 0
    assert out.expected[("slot", a, word_bytes(2))] == 7
    assert out.expected[("nonce", a)] == 3 and out.expected[("balance", a)] == 8
    assert out.expected[("gone", c)] is True
    head = Header(9, TIP, TIP, 8191 * 3 + 5, c, (b,))
    _block_changes(out, head)
    assert (HISTORY_CONTRACT, word_bytes(8)) in out.slots
    assert {(BEACON_ROOTS_CONTRACT, word_bytes(5)),
            (BEACON_ROOTS_CONTRACT, word_bytes(5 + 8191))} <= out.slots
    assert (WITHDRAWAL_REQUESTS_CONTRACT, word_bytes(0)) in out.slots
    assert ("balance", b) not in out.expected  # credited after the transactions
    assert HISTORY_CONTRACT in out.accounts and c in out.accounts
    again = Touched.from_json(json.loads(json.dumps(out.to_json())))
    assert (again.accounts, again.slots) == (out.accounts, out.slots)


def test_metrics_name_head_served_and_lag() -> None:
    p = Progress(head=12, served=9, blocks=4, records=40, reorgs=1, last_seconds=0.25)
    text = p.metrics()
    for line in ("morphogen_chain_head_block 12", "morphogen_chain_served_block 9",
                 "morphogen_chain_lag_blocks 3", "morphogen_chain_blocks_total 4",
                 "morphogen_chain_reorgs_total 1", "morphogen_chain_block_seconds 0.25"):
        assert line in text.splitlines()
    assert "# TYPE morphogen_chain_blocks_total counter" in text


def test_a_block_gone_from_under_a_step_is_the_chain_moving_not_an_error() -> None:
    """A node whose head was past block 11 a moment ago and now has neither block 11 nor a
    head that reaches it (anvil_reorg drops the blocks it replaces before mining the new
    ones): the follower's step is tried again (ChainMoved, which `run` waits out). Where the
    head passes it again, the block is asked once more; a node that still lacks it is
    broken: an error that stops the follower."""
    from types import SimpleNamespace

    from morphogen.chain.blocks import ChainMoved
    from morphogen.chain.follow import Follower, _passing
    from morphogen.chain.rpc import ChainError

    def node(blocks: list, head: int) -> SimpleNamespace:
        return SimpleNamespace(call=lambda method, *params: blocks.pop(0), shown="node",
                               block_number=lambda: head)

    for head, raised_as in ((10, ChainMoved), (11, ChainError)):
        with pytest.raises(ChainError) as raised:
            Follower._header(SimpleNamespace(rpc=node([None, None], head)), 11)
        assert type(raised.value) is raised_as and "block 11" in str(raised.value)
        assert _passing(raised.value) == (raised_as is ChainMoved)
    # mined meanwhile: the new block 11 (whose parent the step then checks)
    got = Follower._header(SimpleNamespace(rpc=node([None, _block(11, TIP)], 12)), 11)
    assert got.number == 11


def test_a_reorg_that_finds_the_last_applied_block_again_is_the_chain_moving() -> None:
    """A step saw the last applied block gone (a node behind a balancer, a height that
    dipped); by the time the reorg looks for the common ancestor the node holds that block
    again: nothing is orphaned, so there is no reorg to apply, and the step is tried again
    (it raised IndexError out of the follower, counted a reorg and logged one)."""
    from types import SimpleNamespace

    from morphogen.chain.blocks import ChainMoved
    from morphogen.chain.follow import Follower, _passing

    journal = [{"number": 9, "hash": "0x" + "9" * 64, "touched": None},
               {"number": 10, "hash": "0x" + "a" * 64, "touched": "x.json"}]
    applied, progress = [], Progress()
    stub = SimpleNamespace(
        _journal=lambda: journal, _hash_at=lambda n: journal[n - 9]["hash"],
        _touched_of=lambda b: None, keep=64, progress=progress, report=lambda line: None,
        _apply=lambda *a, **k: applied.append(a))
    with pytest.raises(ChainMoved) as raised:
        Follower._reorg(stub, 0.0, target=10)
    assert _passing(raised.value) and not applied and progress.reorgs == 0
