"""The endpoint's node EVM process (morphogen/wallet/node_evm.py running
clients/js/src/eth/call_worker.ts): a run's reads go to its loopback URL as pyrevm's do (a
JSON-RPC server here answers them from a small state), its result comes back as pyrevm's
processes give it, a read the loopback refuses is the run's failure, and a dead process is
an EOFError for the workers to replace it."""

from __future__ import annotations

import json
import os
import signal
from http.server import BaseHTTPRequestHandler

import pytest

from morphogen.chain.state import EMPTY_CODE_HASH, keccak256
from morphogen.chain.token_code import balance_slot, token_code, token_storage
from morphogen.wallet import node_evm
from tests.chain_node import need_node_evm
from tests.web.server import reply_json, serving_with

TOKEN = "0x" + "70" * 20
HOLDER = bytes.fromhex("11" * 20)
STORAGE = token_storage({HOLDER: 5 * 10**18})
CODE = token_code("T")
BLOCK = {"number": 7, "timestamp": 1_800_000_000, "gas_limit": 30_000_000, "chain_id": 31337}


def _loopback(asked: list[str], code: bytes = CODE):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            requests = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            answers = []
            for r in requests:
                method, params = r["method"], r["params"]
                asked.append(method)
                at_token = params[0].lower() == TOKEN
                if method == "eth_getBalance":
                    result = "0x0"
                elif method == "eth_getTransactionCount":
                    result = "0x1" if at_token else "0x0"
                elif method == "eth_getCode":
                    result = "0x" + (code.hex() if at_token else "")
                elif method == "eth_getStorageAt":
                    result = "0x" + STORAGE.get(int(params[1], 16), 0).to_bytes(32, "big").hex()
                else:  # a block hash: not read privately
                    answers.append({"jsonrpc": "2.0", "id": r["id"],
                                    "error": {"code": -32002, "message": "no private answer"}})
                    continue
                answers.append({"jsonrpc": "2.0", "id": r["id"], "result": result})
            reply_json(self, answers)

    return serving_with(Handler)


def _tx(data: bytes, to: str = TOKEN) -> dict:
    return {"from": "0x" + "22" * 20, "to": to, "data": data, "value": 0, "gas": 1_000_000,
            "access_list": []}


@pytest.fixture(scope="module")
def process():
    need_node_evm()
    proc = node_evm.NodeProcess()
    yield proc
    proc.kill()


def _run(process, url: str, tx: dict, estimate: bool = False, accounts: list = ()) -> dict:
    process.conn.send((url, BLOCK, tx, estimate, list(accounts)))
    assert process.conn.poll(30)
    return process.conn.recv()


def test_a_run_reads_through_its_url_and_answers_as_pyrevm_processes_do(process) -> None:
    asked: list[str] = []
    with _loopback(asked) as url:
        got = _run(process, url, _tx(bytes.fromhex("70a08231") + bytes(12) + HOLDER))
        assert got["ok"] and int.from_bytes(got["out"]) == 5 * 10**18 and got["gas"] > 21_000
        assert {"eth_getCode", "eth_getStorageAt"} <= set(asked)
        # an estimate is the least gas the call succeeds with
        estimate = _run(process, url, _tx(bytes.fromhex("18160ddd")), estimate=True)
        assert estimate["ok"] and 21_000 < estimate["gas"] < 30_000
        # a revert's data is `out`, its reason "Revert", as evm.py reads pyrevm's
        reverted = _run(process, url, _tx(bytes.fromhex("deadbeef")))
        assert (reverted["ok"], reverted["reason"], reverted["out"]) == (False, "Revert", b"")
        # accounts given up front are not asked for
        asked.clear()
        known = [(TOKEN, 0, 1, keccak256(CODE), CODE), ("0x" + "22" * 20, 0, 0, EMPTY_CODE_HASH,
                                                         b"")]
        again = _run(process, url, _tx(bytes.fromhex("18160ddd")), accounts=known)
        assert again["ok"] and int.from_bytes(again["out"]) == STORAGE[2]
        assert asked == ["eth_getStorageAt"], asked
        assert balance_slot(HOLDER) in STORAGE


def test_a_read_the_loopback_refuses_is_the_runs_failure(process) -> None:
    # BLOCKHASH(NUMBER - 1), returned: the loopback refuses the block, the run fails (the
    # endpoint answers with the refusal it recorded), never a made-up hash
    runtime = bytes.fromhex("43600190034060005260206000f3")
    with _loopback([], runtime) as url:
        got = _run(process, url, _tx(b""))
    assert not got["ok"] and "refused" in got["reason"], got


def test_a_dead_process_is_an_eof_and_a_bad_fork_is_refused() -> None:
    need_node_evm()
    proc = node_evm.NodeProcess("osaka")
    os.kill(proc.pid, signal.SIGKILL)
    with pytest.raises(EOFError):
        proc.conn.poll(10)
    proc.kill()
    with pytest.raises(ValueError, match="hardfork"):
        node_evm.NodeProcess("homestead")
