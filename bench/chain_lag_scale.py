"""The chain follower's lag through a real node, against the size of the chain's tables.

At each size the tables hold the node's own state (anvil's, with a contract that rewrites
storage slots) plus a synthetic state in mainnet's proportions (bench/chain_scale.py's), built
into one owner directory that two real parties (local Ray Serve, one CPU shard each) serve.
Then blocks of about 3,000 changed records in mainnet's shape of a block (`--txs` transactions,
each rewriting `--per-tx` slots of the contract, some 15 % of them new slots a block; the
senders' accounts and the block's system slots besides) are mined every `--spacing` seconds,
and `morphogen chain follow` follows them, in a process of its own (`--poll 0.1`): its
pages and keys in mapped files, full copies in a thread of its own.

Per size: the lag of each block (from `evm_mine` returning to the block published on both
parties) p50 / p99 / max; the follower's time a block by phase (trace and read: the node;
apply: its own work; publish: the parties); its own resident memory (not the file pages it
maps) once started and after the blocks; each shard's resident memory; and, at the end, private
reads of rewritten slots through both parties checked against the node.

    python bench/chain_lag_scale.py                            # 1 M, 4 M and 16 M records
    python bench/chain_lag_scale.py --sizes 1000000 --blocks 4
Results: bench/results/chain_lag_scale.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
RESULTS = ROOT / "bench" / "results"
NEW_SHARE = 0.15  # of a block's slot writes, slots never written before
POLL_S = 0.1      # the follower's look at the node's head (`chain follow --poll`)
BLOCK_LINE = re.compile(r"^block (?P<number>\d+) \(.*?\): (?P<records>\d+) records, .*? in "
                        r"[\d.]+ s \((?P<phases>[^)]*)\)")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _anon_mib(proc) -> float:
    info = proc.memory_info()
    return round((info.rss - info.shared) / 2**20, 1)


def _shard_mib() -> dict[str, float]:
    import psutil

    out = {}
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd and cmd[0].startswith("ray::ServeReplica") and "shard" in cmd[0]:
            out[cmd[0].split()[0][5:]] = round(proc.memory_info().rss / 2**20, 1)
    return out


def run_size(size: int, blocks: int, spacing: float, txs: int, per_tx: int,
             work: Path) -> dict:
    import psutil
    from _common import percentile, serve_two_parties
    from chain_follow import FILL_INIT, FILL_RUNTIME, TOKEN
    from chain_scale import ROOM, make_state
    from ray import serve

    from cluster import local
    from morphogen.chain.export import StateRecords, state_records
    from morphogen.chain.node_export import export_from_node
    from morphogen.chain.rpc import EthRpc, quantity
    from morphogen.chain.tables import build_chain_tables
    from morphogen.client import PirClient
    from morphogen.keyword import KeywordClient
    from morphogen.keyword.descriptor import Anchor
    from morphogen.keyword.owner import create_owner_dir
    from morphogen.keyword.signing import generate_key_files, load_signing_key
    from tests.chain_node import DEV_ACCOUNTS, running_anvil

    key_path, pub_path = generate_key_files(work / "owner.key")
    key = load_signing_key(key_path)
    row: dict = {"records": size, "blocks": blocks, "spacing_s": spacing,
                 "transactions_a_block": txs}
    with running_anvil() as url, EthRpc(url) as rpc, \
            local.running(num_cpus=max(2, os.cpu_count() or 2), disable_auth=True) as cluster:
        rpc.call("evm_setAutomine", False)
        rpc.call("evm_setBlockGasLimit", quantity(2_000_000_000))
        tx = rpc.call("eth_sendTransaction", {"from": DEV_ACCOUNTS[0], "gas": quantity(500_000),
                                              "data": "0x" + (FILL_INIT + FILL_RUNTIME).hex()})
        rpc.call("evm_mine")
        filler = bytes.fromhex(rpc.call("eth_getTransactionReceipt", tx)
                               ["contractAddress"][2:])
        header = export_from_node(rpc, work / "state.jsonl")
        node = state_records(work / "state.jsonl")
        t = time.perf_counter()
        synthetic, _, _ = make_state(size)
        records = StateRecords(*(list(getattr(node, n)) + list(getattr(synthetic, n))
                                 for n in ("accounts", "storage", "code")))
        del synthetic
        anchor = Anchor(header.chain_id, header.block.number, header.block.hash)
        table = build_chain_tables(records, key, anchor, room=ROOM, min_records=0, seed=1)
        del records
        snapshot = create_owner_dir(table, work / "owner")
        row["table_pages"] = int(len(table.pages))
        del table
        gc.collect()
        row["build_s"] = round(time.perf_counter() - t, 1)
        (work / "token").write_text(TOKEN)
        (work / "snaps").mkdir()
        urls = serve_two_parties(cluster, snapshot, work)
        published: dict[int, float] = {}
        phases: dict[int, dict] = {}
        cmd = [sys.executable, "-m", "cluster.cli", "chain", "follow", "--rpc", url,
               "--owner", str(work / "owner"), "--signing-key", str(key_path),
               "--server-a", urls[0], "--server-b", urls[1],
               "--token-file", str(work / "token"), "--snapshot-dir", str(work / "snaps"),
               "--poll", str(POLL_S)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env)
        lines: list[str] = []

        def reading() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                now = time.monotonic()
                lines.append(line.rstrip())
                m = BLOCK_LINE.match(line)
                if m:
                    phases[int(m["number"])] = {
                        k: float(v) for k, v in zip(*[iter(m["phases"].split())] * 2,
                                                    strict=True)}
                    published[int(m["number"])] = now

        reader = threading.Thread(target=reading, daemon=True)
        reader.start()
        try:
            follower = psutil.Process(proc.pid)
            deadline = time.monotonic() + 600
            while not any(x.startswith("following chain") for x in lines):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the follower did not start:\n" + "\n".join(lines))
                time.sleep(0.05)
            row["follower_own_mib_loaded"] = _anon_mib(follower)
            new = round(txs * per_tx * NEW_SHARE)
            lags, written = [], 0
            for b in range(blocks):
                first = 1 + b * new
                for j in range(txs):
                    start = first + j * per_tx
                    rpc.call("eth_sendTransaction", {
                        "from": DEV_ACCOUNTS[0], "to": "0x" + filler.hex(),
                        "gas": quantity(30_000 + 25_000 * per_tx),
                        "data": "0x" + b"".join(x.to_bytes(32, "big")
                                                for x in (start, per_tx, b + 1)).hex()})
                written = first + txs * per_tx - 1
                rpc.call("evm_mine")
                at = time.monotonic()
                number = rpc.block_number()
                while number not in published:
                    if time.monotonic() > at + 300 or proc.poll() is not None:
                        raise RuntimeError(f"block {number} was not published:\n"
                                           + "\n".join(lines[-20:]))
                    time.sleep(0.002)
                lags.append(published[number] - at)
                _log(f"  {size:,}: block {b + 1}/{blocks}: lag {lags[-1]:.2f} s "
                     f"{phases[number]}")
                time.sleep(max(0.0, at + spacing - time.monotonic()))
            row["follower_own_mib_after"] = _anon_mib(follower)
            row["follower_rss_mib_after"] = round(follower.memory_info().rss / 2**20, 1)
            row["shard_rss_mib"] = _shard_mib()
            mine = [phases[n] for n in sorted(phases)[-blocks:]]
            counts = [int(m["records"]) for x in lines[-blocks:]
                      if (m := BLOCK_LINE.match(x))]
            row.update({
                "lag_p50_s": round(percentile(lags, 50), 3),
                "lag_p99_s": round(percentile(lags, 99), 3),
                "lag_max_s": round(max(lags), 3),
                "records_a_block_median": int(statistics.median(counts)) if counts else None,
                "phase_s_median": {k: round(statistics.median(p[k] for p in mine if k in p), 3)
                                   for k in mine[0]},
                "phase_s_max": {k: round(max(p[k] for p in mine if k in p), 3)
                                for k in mine[0]}})
            # what a wallet reads now: rewritten slots through both parties, against the node
            rng, wrong = random.Random(size), 0
            with PirClient(*urls, encoding="msgpack") as pir:
                kc = KeywordClient(pir, pub_path, table="storage")
                for slot in rng.sample(range(1, written + 1), 12):
                    got = kc.get(filler + slot.to_bytes(32, "big"))
                    want = bytes.fromhex(rpc.call("eth_getStorageAt", "0x" + filler.hex(),
                                                  hex(slot), "latest")[2:])
                    wrong += (got or bytes(32)) != want
            row["reads_checked"], row["reads_wrong"] = 12, wrong
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            for name in ("a", "b"):
                serve.delete(name)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000, 16_000_000])
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--spacing", type=float, default=12.0, help="seconds between blocks")
    ap.add_argument("--txs", type=int, default=200, help="transactions a block")
    ap.add_argument("--per-tx", type=int, default=15, help="slots each transaction rewrites")
    args = ap.parse_args(argv)
    out: dict = {"machine_cpus": os.cpu_count(), "sizes": {}}
    for size in args.sizes:
        work = Path(tempfile.mkdtemp(prefix="morphogen-lagscale-"))
        try:
            _log(f"{size:,} records")
            out["sizes"][str(size)] = run_size(size, args.blocks, args.spacing, args.txs,
                                               args.per_tx, work)
            _log(json.dumps(out["sizes"][str(size)]))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    sizes = [str(s) for s in args.sizes]
    small, large = out["sizes"][sizes[0]], out["sizes"][sizes[-1]]
    out["ratios_largest_to_smallest"] = {
        k: round(large[k] / small[k], 2) if small[k] else None
        for k in ("lag_p50_s", "lag_p99_s", "follower_own_mib_after")}
    out["ratios_largest_to_smallest"]["apply_s_median"] = round(
        large["phase_s_median"]["apply"] / small["phase_s_median"]["apply"], 2)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "chain_lag_scale.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["ratios_largest_to_smallest"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
