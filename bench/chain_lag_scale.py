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
apply: its own work; publish: the parties) and its own work a block (apply and publish: the
wall time outside waiting on the node), median and max, the first block after its start
named apart; its own resident memory (not the file pages it maps) once started and after the
blocks; each shard's resident memory; the rate of catching up (`--catch-up` blocks mined back
to back while no follower runs, then followed to the head: records/s from its first block
published to its last); and, at the end, private reads of rewritten slots through both
parties checked against the node.

    python bench/chain_lag_scale.py                            # 1 M, 4 M and 16 M records
    python bench/chain_lag_scale.py --sizes 1000000 --blocks 4
Each size runs in a process of its own (`--in-process`: all in this one).
Results: bench/results/chain_lag_scale.json (`--out` another file)
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


class FollowerProcess:
    """`morphogen chain follow` in a process of its own, its block lines timed as they come."""

    def __init__(self, cmd: list[str]) -> None:
        self.published: dict[int, float] = {}
        self.phases: dict[int, dict] = {}
        self.records: dict[int, int] = {}
        self.lines: list[str] = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.monotonic()
            self.lines.append(line.rstrip())
            m = BLOCK_LINE.match(line)
            if m:
                n = int(m["number"])
                parts = m["phases"].split()
                self.phases[n] = {k: float(v) for k, v in zip(parts[::2], parts[1::2],
                                                              strict=True)}
                self.records[n] = int(m["records"])
                self.published[n] = now

    def wait_started(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(x.startswith("following chain") for x in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the follower did not start:\n" + "\n".join(self.lines))
            time.sleep(0.05)

    def wait_block(self, number: int, timeout_s: float = 300) -> float:
        deadline = time.monotonic() + timeout_s
        while number not in self.published:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"block {number} was not published:\n"
                                   + "\n".join(self.lines[-20:]))
            time.sleep(0.002)
        return self.published[number]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=10)


def run_size(cluster, size: int, blocks: int, spacing: float, txs: int, per_tx: int,
             catch_up: int, work: Path) -> dict:
    import psutil
    from _common import percentile, serve_two_parties
    from chain_follow import FILL_INIT, FILL_RUNTIME, TOKEN
    from chain_scale import ROOM, make_state
    from ray import serve

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
    with running_anvil() as url, EthRpc(url) as rpc:
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
        cmd = [sys.executable, "-m", "cluster.cli", "chain", "follow", "--rpc", url,
               "--owner", str(work / "owner"), "--signing-key", str(key_path),
               "--server-a", urls[0], "--server-b", urls[1],
               "--token-file", str(work / "token"), "--snapshot-dir", str(work / "snaps"),
               "--poll", str(POLL_S)]
        new = round(txs * per_tx * NEW_SHARE)
        written = 0

        def send_block(b: int) -> None:
            nonlocal written
            first = 1 + b * new
            for j in range(txs):
                rpc.call("eth_sendTransaction", {
                    "from": DEV_ACCOUNTS[0], "to": "0x" + filler.hex(),
                    "gas": quantity(30_000 + 25_000 * per_tx),
                    "data": "0x" + b"".join(x.to_bytes(32, "big")
                                            for x in (first + j * per_tx, per_tx, b + 1)).hex()})
            written = max(written, first + txs * per_tx - 1)

        follower = FollowerProcess(cmd)
        try:
            follower.wait_started()
            me = psutil.Process(follower.proc.pid)
            row["follower_own_mib_loaded"] = _anon_mib(me)
            lags = []
            for b in range(blocks):
                send_block(b)
                rpc.call("evm_mine")
                at = time.monotonic()
                number = rpc.block_number()
                lags.append(follower.wait_block(number) - at)
                _log(f"  {size:,}: block {b + 1}/{blocks}: lag {lags[-1]:.2f} s "
                     f"{follower.phases[number]}")
                time.sleep(max(0.0, at + spacing - time.monotonic()))
            row["follower_own_mib_after"] = _anon_mib(me)
            row["follower_rss_mib_after"] = round(me.memory_info().rss / 2**20, 1)
            row["shard_rss_mib"] = _shard_mib()
            mine = [follower.phases[n] for n in sorted(follower.phases)[-blocks:]]
            row.update({
                "lag_p50_s": round(percentile(lags, 50), 3),
                "lag_p99_s": round(percentile(lags, 99), 3),
                "lag_max_s": round(max(lags), 3),
                "records_a_block_median": int(statistics.median(
                    follower.records[n] for n in sorted(follower.records)[-blocks:])),
                "phase_s_median": {k: round(statistics.median(p[k] for p in mine if k in p), 3)
                                   for k in mine[0]},
                "phase_s_max": {k: round(max(p[k] for p in mine if k in p), 3)
                                for k in mine[0]}})
            own = [p["apply"] + p["publish"] for p in mine]
            row["own_work_s"] = {"median": round(statistics.median(own), 3),
                                 "max": round(max(own), 3), "first_block": round(own[0], 3),
                                 "max_after_first": round(max(own[1:] or own), 3)}
        finally:
            follower.stop()
        # catching up: blocks mined back to back while no follower runs, then followed to
        # the head; the rate from its first block published to its last
        if catch_up:
            for b in range(blocks, blocks + catch_up):
                send_block(b)
                rpc.call("evm_mine")
            head = rpc.block_number()
            behind = FollowerProcess(cmd + ["--until-block", str(head)])
            try:
                behind.wait_block(head, timeout_s=900)
            finally:
                behind.stop()
            done = sorted(behind.published)
            seconds = behind.published[done[-1]] - behind.published[done[0]]
            records = sum(behind.records[n] for n in done[1:])
            row["catch_up"] = {"blocks": len(done), "seconds": round(seconds, 2),
                               "records_per_s": round(records / seconds),
                               "phase_s_median": {k: round(statistics.median(
                                   behind.phases[n][k] for n in done), 3)
                                   for k in behind.phases[done[0]]}}
            _log(f"  {size:,}: catch-up {row['catch_up']}")
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
        for name in ("a", "b"):
            serve.delete(name)
    return row


def _ratios(out: dict, sizes: list[int]) -> dict:
    small, large = out["sizes"][str(sizes[0])], out["sizes"][str(sizes[-1])]
    ratios = {k: round(large[k] / small[k], 2) if small[k] else None
              for k in ("lag_p50_s", "lag_p99_s", "follower_own_mib_after")}
    ratios["apply_s_median"] = round(
        large["phase_s_median"]["apply"] / small["phase_s_median"]["apply"], 2)
    for k in ("median", "max"):
        ratios[f"own_work_s_{k}"] = round(large["own_work_s"][k] / small["own_work_s"][k], 2)
    return ratios


def _in_process(args) -> dict:
    from cluster import local

    out: dict = {"machine_cpus": os.cpu_count(), "sizes": {}}
    # one cluster for the sizes of one process: each size's parties are deleted before the next
    with local.running(num_cpus=max(2, os.cpu_count() or 2), disable_auth=True) as cluster:
        for size in args.sizes:
            work = Path(tempfile.mkdtemp(prefix="morphogen-lagscale-"))
            try:
                _log(f"{size:,} records")
                out["sizes"][str(size)] = run_size(cluster, size, args.blocks, args.spacing,
                                                   args.txs, args.per_tx, args.catch_up, work)
                _log(json.dumps(out["sizes"][str(size)]))
            finally:
                shutil.rmtree(work, ignore_errors=True)
    return out


def _each_in_a_process(args) -> dict:
    """Every size in a process (and a local cluster) of its own, one after another: what a
    size leaves behind in a process (the heap of the state it built, a cluster's workers)
    does not weigh on the next one's blocks."""
    out: dict = {"machine_cpus": os.cpu_count(), "sizes": {}, "a_process_a_size": True}
    rest = ["--blocks", str(args.blocks), "--spacing", str(args.spacing), "--txs",
            str(args.txs), "--per-tx", str(args.per_tx), "--catch-up", str(args.catch_up)]
    with tempfile.TemporaryDirectory(prefix="morphogen-lagscale-") as tmp:
        for size in args.sizes:
            one = Path(tmp) / f"{size}.json"
            subprocess.run([sys.executable, __file__, "--in-process", "--sizes", str(size),
                            "--out", str(one), *rest], check=True)
            out["sizes"][str(size)] = json.loads(one.read_text())["sizes"][str(size)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000, 16_000_000])
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--spacing", type=float, default=12.0, help="seconds between blocks")
    ap.add_argument("--txs", type=int, default=200, help="transactions a block")
    ap.add_argument("--per-tx", type=int, default=15, help="slots each transaction rewrites")
    ap.add_argument("--catch-up", type=int, default=20,
                    help="blocks mined while no follower runs, then followed (0: none)")
    ap.add_argument("--in-process", action="store_true",
                    help="every size in this process (by default each runs in its own)")
    ap.add_argument("--out", type=Path, default=RESULTS / "chain_lag_scale.json")
    args = ap.parse_args(argv)
    if args.in_process or len(args.sizes) == 1:
        out = _in_process(args)
    else:
        out = _each_in_a_process(args)
    out["ratios_largest_to_smallest"] = _ratios(out, args.sizes)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["ratios_largest_to_smallest"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
