"""`morphogen rpc` against a real chain (anvil) followed into two real parties (local Ray Serve).

Three measurements, one run, every answer checked against anvil's:

- **eth_getBalance** through the endpoint (HTTP, one at a time): requests/s, p50/p99 latency,
  against the yardstick measured in the same run: one plain private page read of the same
  parties (`PirClient.get`). Two ways: an address not asked before each time (a private
  lookup: an absent account costs the same requests as any), and the wallet's own address
  again (read at the served block already: answered after the parties' GET /epoch).
- **eth_call of balanceOf**: latency p50/p99 and the private rounds one call makes (a round is
  one request of each of the three tables; padding rounds included), for the first call at a
  new version (cold: nothing of the version read yet) and for the next calls at it (warm).
- **A wallet's opening burst** at a new version: chain id, block number, balance, nonce and 20
  token balances (20 eth_calls to 20 tokens), sent at once as a wallet does (8 in flight), end
  to end; target p50 <= 300 ms. Then the same burst as one JSON-RPC batch; each right after
  the version is published, and a second after (the endpoint, watching every 0.5 s, has read
  the new version's descriptors by then: a wallet opens at any time within a block). And the
  way an open wallet refreshes: it polls `eth_blockNumber` (every 50 ms here) and sends the
  burst as soon as that names the new block (`on_block`; timed from that answer).

    python bench/wallet_rpc.py [--runs 200] [--only balance|call|burst] [--evm revm|ethereumjs]
Results: bench/results/wallet_rpc.json (wallet_rpc_partial.json with --only; with --evm,
wallet_rpc_<evm>.json). The EVM is the endpoint's default (ethereumjs where it can run)
unless --evm names one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from _common import percentile, serve_two_parties  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TOKEN = "wallet-bench-token-0123456789"
TOKENS = 20
CONTRACTS = json.loads((ROOT / "tests" / "vectors" / "wallet_contracts.json").read_text())


def _summary(ms: list[float]) -> dict:
    return {"n": len(ms), "p50_ms": round(percentile(ms, 50), 2),
            "p99_ms": round(percentile(ms, 99), 2), "per_s": round(len(ms) / (sum(ms) / 1e3), 1)}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(runs: int, only: str | None = None, evm: str = "revm") -> dict:
    from cluster import local
    from cluster.parties import HttpParties
    from morphogen.chain import EthRpc, export_from_node, state_records
    from morphogen.chain.follow import Follower
    from morphogen.chain.tables import build_chain_tables
    from morphogen.client import PirClient
    from morphogen.client.admin import AdminClient
    from morphogen.keyword.descriptor import Anchor
    from morphogen.keyword.owner import OwnerTable, create_owner_dir
    from morphogen.keyword.signing import generate_key_files, load_signing_key
    from morphogen.wallet import CallService, Endpoint, PrivateState, RpcServer
    from tests.chain_node import DEV_ACCOUNTS, running_anvil

    work = Path(tempfile.mkdtemp(prefix="morphogen-walletbench-"))
    key_path, pub_path = generate_key_files(work / "owner.key")
    key = load_signing_key(key_path)
    wallet = DEV_ACCOUNTS[3]
    out: dict = {"machine_cpus": os.cpu_count()}
    with running_anvil() as url, EthRpc(url) as rpc, \
            local.running(num_cpus=max(2, os.cpu_count() or 2), disable_auth=True) as cluster:
        rpc.call("evm_setAutomine", False)
        deploys = [rpc.call("eth_sendTransaction", {
            "from": DEV_ACCOUNTS[0], "gas": hex(2_000_000),
            "data": CONTRACTS["Token"]["bytecode"] + f"{10**24 + i:064x}"})
            for i in range(TOKENS)]
        rpc.call("evm_mine")
        tokens = [rpc.call("eth_getTransactionReceipt", t)["contractAddress"] for t in deploys]
        for i, t in enumerate(tokens):  # transfer(wallet, i + 1)
            rpc.call("eth_sendTransaction", {
                "from": DEV_ACCOUNTS[0], "to": t, "gas": hex(100_000),
                "data": "0xa9059cbb" + "00" * 12 + wallet[2:] + f"{i + 1:064x}"})
        rpc.call("evm_mine")
        header = export_from_node(rpc, work / "state.jsonl")
        table = build_chain_tables(state_records(work / "state.jsonl"), key,
                                   Anchor(header.chain_id, header.block.number,
                                          header.block.hash), min_records=4096)
        create_owner_dir(table, work / "owner")
        owner = OwnerTable(work / "owner")
        (work / "token").write_text(TOKEN)
        (work / "snaps").mkdir()
        urls = serve_two_parties(cluster, owner.snapshot_dir(1), work)
        admins = [AdminClient(u, TOKEN) for u in urls]
        follower = Follower(rpc, owner, HttpParties(admins, 120.0, None), key,
                            snapshot_dir=str(work / "snaps"))
        while follower.step():
            pass
        pir = PirClient(*urls)
        state = PrivateState(pir, pub_path, watch_s=0.5)
        calls = CallService(state, processes=2, evm=evm)
        out["evm"] = evm
        rounds = calls.calls.rounds
        server = RpcServer(Endpoint(state, calls=calls.calls), "127.0.0.1", 0)
        server.start()
        http = httpx.Client(base_url=server.url, timeout=60,
                            headers={"content-type": "application/json"})

        def ask(method: str, *params) -> object:
            r = http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": method,
                                     "params": list(params)}).json()
            if "result" not in r:
                raise RuntimeError(f"{method}: {r['error']}")
            return r["result"]

        try:
            _log("warming up")
            ask("eth_getBalance", wallet, "latest")
            n_pages = pir.info().num_pages
            def new_version() -> dict:
                """An empty block, followed: the calls' shared reads start cold."""
                rpc.call("evm_mine")
                while follower.step():
                    pass
                return {"blockHash": rpc.block("latest")["hash"]}

            # 2. eth_call of balanceOf: latency and lookups, the first call at a version (cold)
            #    and the calls after it at the same version (warm: caller and code known)
            data = "0x70a08231" + "00" * 12 + wallet[2:]
            cold_ms, warm_ms = [], []
            cold_rounds = warm_rounds = 0
            cold = max(5, runs // 8)
            for _ in range(cold if only in (None, "call") else 0):
                at = new_version()
                want = rpc.call("eth_call", {"to": tokens[0], "data": data}, at)
                for i in range(3):
                    before = rounds.rounds
                    t = time.perf_counter()
                    got = ask("eth_call", {"to": tokens[0], "data": data}, "latest")
                    (warm_ms if i else cold_ms).append((time.perf_counter() - t) * 1e3)
                    if i:
                        warm_rounds += rounds.rounds - before
                    else:
                        cold_rounds += rounds.rounds - before
                    assert got == want, (got, want)
            # a round is one request of each of the three tables, padding rounds included
            if cold_ms:
                out["eth_call_balanceOf_cold"] = {
                    **_summary(cold_ms), "rounds_per_call": round(cold_rounds / cold, 2)}
                out["eth_call_balanceOf_warm"] = {
                    **_summary(warm_ms), "rounds_per_call": round(warm_rounds / cold / 2, 2)}
                _log(f"eth_call balanceOf cold {out['eth_call_balanceOf_cold']}, "
                     f"warm {out['eth_call_balanceOf_warm']}")
            # 3. the opening burst at a new version: 8 requests in flight, or one batch; right
            #    after the publication, and a second after it (the endpoint has seen it then)
            def opening(pool, batch: bool, after_s: float | None) -> tuple[float, int]:
                before_block = int(ask("eth_blockNumber"), 16)
                at = new_version()
                wants = [rpc.call("eth_call", {"to": tk, "data": data}, at) for tk in tokens]
                if after_s is None:  # a wallet's block tracker: the burst at the new block
                    while int(ask("eth_blockNumber"), 16) == before_block:
                        time.sleep(0.05)
                else:
                    time.sleep(after_s)
                asks = [("eth_chainId", []), ("eth_blockNumber", []),
                        ("eth_getBalance", [wallet, "latest"]),
                        ("eth_getTransactionCount", [wallet, "latest"])]
                asks += [("eth_call", [{"to": tk, "data": data}, "latest"]) for tk in tokens]
                before = rounds.rounds
                t = time.perf_counter()
                if batch:
                    answers = http.post("/", json=[
                        {"jsonrpc": "2.0", "id": i, "method": m, "params": p}
                        for i, (m, p) in enumerate(asks)]).json()
                    by_id = {a["id"]: a for a in answers}
                    got = [by_id[i].get("result") for i in range(len(asks))]
                else:
                    got = [j.result() for j in [pool.submit(ask, m, *p) for m, p in asks]]
                ms = (time.perf_counter() - t) * 1e3
                assert got[4:] == wants, got
                return ms, rounds.rounds - before

            with ThreadPoolExecutor(8) as pool:
                for name, batch, after_s in (
                        ("opening_burst", False, 0.0), ("opening_burst_batch", True, 0.0),
                        ("opening_burst_after_1s", False, 1.0),
                        ("opening_burst_batch_after_1s", True, 1.0),
                        ("opening_burst_on_block", False, None),
                        ("opening_burst_batch_on_block", True, None)):
                    if only not in (None, "burst"):
                        break
                    seen = [opening(pool, batch, after_s) for _ in range(max(5, runs // 20))]
                    out[name] = {**_summary([ms for ms, _ in seen]), "requests": 4 + TOKENS,
                                 "in_flight": 24 if batch else 8, "batch": batch,
                                 "published_s_before": after_s, "target_p50_ms": 300,
                                 "rounds_per_burst": round(sum(r for _, r in seen) / len(seen),
                                                           2)}
                    _log(f"{name} {out[name]}")
            # 4. eth_getBalance against a plain page read of the same parties; last, since every
            #    address asked joins the endpoint's working set (read at each new version)
            at = {"blockHash": rpc.block("latest")["hash"]}
            want = rpc.call("eth_getBalance", wallet, at)
            page_ms, balance_ms, again_ms = [], [], []
            for i in range(runs if only in (None, "balance") else 0):
                t = time.perf_counter()
                pir.get([i % n_pages])
                page_ms.append((time.perf_counter() - t) * 1e3)
                fresh = "0x" + os.urandom(20).hex()  # never asked: a lookup
                t = time.perf_counter()
                got = ask("eth_getBalance", fresh, "latest")
                balance_ms.append((time.perf_counter() - t) * 1e3)
                assert got == rpc.call("eth_getBalance", fresh, at), got
                t = time.perf_counter()
                got = ask("eth_getBalance", wallet, "latest")
                again_ms.append((time.perf_counter() - t) * 1e3)
                assert got == want, (got, want)
            if page_ms:
                out["page_read"] = _summary(page_ms)
                out["eth_getBalance"] = _summary(balance_ms)
                out["eth_getBalance_over_page_read_p50"] = round(
                    percentile(balance_ms, 50) / percentile(page_ms, 50), 2)
                out["eth_getBalance_read_already"] = _summary(again_ms)
                _log(f"page read {out['page_read']}, eth_getBalance {out['eth_getBalance']}, "
                     f"read already {out['eth_getBalance_read_already']}")
        finally:
            http.close()
            server.shutdown()
            server.server_close()
            calls.close()
            state.close()
            pir.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--only", choices=("balance", "call", "burst"),
                    help="one measurement (its results go to wallet_rpc_partial.json)")
    ap.add_argument("--evm", choices=("revm", "ethereumjs"), default=None,
                    help="the EVM eth_call runs in (default: the endpoint's, ethereumjs where "
                         "node and clients/js are here)")
    args = ap.parse_args(argv)
    from morphogen.wallet import node_evm

    evm = args.evm or ("ethereumjs" if node_evm.available() is None else "revm")
    result = run(args.runs, args.only, evm)
    RESULTS.mkdir(exist_ok=True)
    name = ("wallet_rpc.json" if args.only is None else "wallet_rpc_partial.json") \
        if args.evm is None else f"wallet_rpc_{args.evm}.json"
    (RESULTS / name).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
