"""The chain follower against a real node (anvil) and two real parties (local Ray Serve).

Four measurements, each from its own phase of one run:

- **Lag**: blocks of ~200 and ~2,000 changed records (a contract rewriting that many slots,
  plus the block's own system slots and accounts) mined every 1 s and every 12 s; the lag of a
  block is from its `evm_mine` returning to the follower having published it on both parties.
  Readers run meanwhile (private lookups of the rewritten slots through both parties), and
  every value they get is checked: a wrong answer is a value of another slot, or of a block
  not yet mined, or older than one the reader had already read of that slot.
- **Sustained records/s**: blocks of 2,000 changed records mined back to back as fast as the
  node mines them, the follower behind; from the first block mined to the last published,
  readers running. A block's publication overlaps the next block's reads and version. Five
  rounds of 20 blocks; the median round is the figure.
- **Catch-up**: 1,000 blocks mined while the follower is stopped, then followed: blocks/s.
- **Build**: `build_chain_tables` over a synthetic state of accounts and slots: records/s, and
  the time that rate projects for 330 M accounts and 1.43 B slots (one process).

    python bench/chain_follow.py                   # everything (about 5 minutes on 2 cores)
    python bench/chain_follow.py --quick           # fewer blocks
    python bench/chain_follow.py --only sustained  # one measurement
Results: bench/results/chain_follow.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"
TOKEN = "chain-follow-bench-token-0123456789"
# FILL(start, n, salt): slot i := i * 2**32 + salt for i in start .. start + n - 1
FILL_RUNTIME = bytes.fromhex(
    "600035" "602035" "81" "01"          # i = start; end = start + n
    "5b" "80" "82" "10" "15" "6022" "57"  # loop: if !(i < end) goto done
    "6040" "35" "82" "6020" "1b" "17"    # word = (i << 32) | salt
    "82" "55"                            # sstore(i, word)
    "90" "6001" "01" "90" "6008" "56"    # i += 1; goto loop
    "5b" "00")
FILL_INIT = (b"\x61" + len(FILL_RUNTIME).to_bytes(2, "big")
             + bytes.fromhex("80" "600c" "6000" "39" "6000" "f3"))
PROJECT_ACCOUNTS, PROJECT_SLOTS = 330_000_000, 1_430_000_000
PHASES = ("lag", "sustained", "catch-up", "build")
SUSTAINED_ROUNDS = 5  # back-to-back runs of 20 blocks; the median is the figure


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Readers:
    """Reader processes looking up rewritten slots privately, checking every value they get.
    Processes of their own, as a wallet is: threads in this one would queue for the
    interpreter behind the follower, which a deployment never does (they share the cores
    here all the same)."""

    def __init__(self, urls: list[str], pub, filler: bytes, slots: int, count: int = 2):
        ctx = multiprocessing.get_context("spawn")
        self.mined = ctx.Value("q", 0)  # the salt of the last block mined: no value above it
        self._reads, self._wrong = ctx.Value("q", 0), ctx.Value("q", 0)
        self._failed = ctx.Value("q", 0)  # lookups that raised (a table changing under them)
        self.stop = ctx.Event()
        self.procs = [ctx.Process(target=_read_forever, daemon=True, args=(
            i, urls, str(pub), filler, slots, self.mined, self._reads, self._wrong,
            self._failed, self.stop)) for i in range(count)]

    @property
    def reads(self) -> int:
        return self._reads.value

    @property
    def wrong(self) -> int:
        return self._wrong.value

    @property
    def failed(self) -> int:
        return self._failed.value

    def __enter__(self) -> Readers:
        for p in self.procs:
            p.start()
        # measured from their first read on: a reader's start (imports, compiled code) is
        # not a reader running
        deadline = time.monotonic() + 120
        while self.reads < len(self.procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def _read_forever(seed, urls, pub, filler, slots, mined, reads, wrong, failed, stop) -> None:
    from morphogen.client import PirClient
    from morphogen.keyword import KeywordClient

    rng = random.Random(seed)
    last: dict[int, int] = {}  # slot -> the newest salt read of it
    with PirClient(*urls, encoding="msgpack") as pir:
        kc = KeywordClient(pir, pub, table="storage")
        while not stop.is_set():
            slot = rng.randrange(1, slots + 1)
            try:
                value = kc.get(filler + slot.to_bytes(32, "big"))
            except Exception as exc:  # noqa: BLE001 - a failed read is not a wrong one
                _log(f"[bench] reader: {type(exc).__name__}: {exc}")
                with failed.get_lock():
                    failed.value += 1
                time.sleep(0.2)
                continue
            with reads.get_lock():
                reads.value += 1
            if value is None:
                continue  # not written yet
            word = int.from_bytes(value, "big")
            salt = word & 0xFFFFFFFF
            if word >> 32 != slot or salt > mined.value or salt < last.get(slot, 0):
                with wrong.get_lock():
                    wrong.value += 1
            last[slot] = max(last.get(slot, 0), salt)


def run(quick: bool, only: set[str], reader_count: int = 2) -> dict:
    import _cpu_by_process as cpu_by_process
    from _common import percentile, serve_two_parties
    from ray import serve

    from cluster import local
    from cluster.parties import HttpParties
    from morphogen.chain.export import state_records
    from morphogen.chain.follow import Follower
    from morphogen.chain.node_export import export_from_node
    from morphogen.chain.rpc import EthRpc, quantity
    from morphogen.chain.tables import build_chain_tables
    from morphogen.client.admin import AdminClient
    from morphogen.keyword.descriptor import Anchor
    from morphogen.keyword.owner import OwnerTable, create_owner_dir
    from morphogen.keyword.signing import generate_key_files, load_signing_key
    from tests.chain_node import DEV_ACCOUNTS, running_anvil

    work = Path(tempfile.mkdtemp(prefix="morphogen-chainbench-"))
    key_path, pub_path = generate_key_files(work / "owner.key")
    key = load_signing_key(key_path)
    out: dict = {"machine_cpus": os.cpu_count()}
    with running_anvil() as url, EthRpc(url) as rpc, \
            local.running(num_cpus=max(2, os.cpu_count() or 2), disable_auth=True) as cluster:
        rpc.call("evm_setAutomine", False)
        rpc.call("evm_setBlockGasLimit", quantity(2_000_000_000))

        def mine() -> float:
            rpc.call("evm_mine")
            return time.monotonic()

        def fill(start: int, n: int, salt: int) -> None:
            rpc.call("eth_sendTransaction", {
                "from": DEV_ACCOUNTS[0], "to": "0x" + filler.hex(), "gas": quantity(60_000_000),
                "data": "0x" + b"".join(x.to_bytes(32, "big") for x in (start, n, salt)).hex()})

        tx = rpc.call("eth_sendTransaction", {"from": DEV_ACCOUNTS[0], "gas": quantity(500_000),
                                              "data": "0x" + (FILL_INIT + FILL_RUNTIME).hex()})
        mine()
        filler = bytes.fromhex(rpc.call("eth_getTransactionReceipt", tx)
                               ["contractAddress"][2:])
        header = export_from_node(rpc, work / "state.jsonl")
        anchor = Anchor(header.chain_id, header.block.number, header.block.hash)
        table = build_chain_tables(state_records(work / "state.jsonl"), key, anchor,
                                   min_records=4096)
        snapshot = create_owner_dir(table, work / "owner")
        owner = OwnerTable(work / "owner")
        owner.grow("storage", key, records=40_000)  # room for every slot the run writes
        owner.mark_published(owner.current)
        snapshot = owner.snapshot_dir(owner.current)
        (work / "token").write_text(TOKEN)
        (work / "snaps").mkdir()
        urls = serve_two_parties(cluster, snapshot, work)
        admins = [AdminClient(u, TOKEN) for u in urls]
        published: dict[int, float] = {}
        phases: dict[int, dict] = {}
        follower = Follower(rpc.__class__(url), owner, HttpParties(admins, 120.0, None), key,
                            snapshot_dir=str(work / "snaps"))
        def noted(line: str) -> None:
            published[follower.progress.served] = time.monotonic()
            phases[follower.progress.served] = dict(follower.progress.phases)

        follower.report = noted
        stop = threading.Event()

        def following() -> None:
            follower.run(until=stop.is_set, poll_s=0.005)

        thread = threading.Thread(target=following, daemon=True)
        thread.start()
        try:
            with Readers(urls, pub_path, filler, 2_000, reader_count) as readers:
                out["lag"] = []
                salt = 0
                for records, block_time in ((200, 1.0), (2000, 1.0), (200, 12.0),
                                            (2000, 12.0)) if "lag" in only else ():
                    blocks = (4 if quick else 15) if block_time == 1.0 else (2 if quick else 5)
                    lags = []
                    for _ in range(blocks):
                        salt += 1
                        fill(1, records, salt)
                        readers.mined.value = salt
                        at = mine()
                        number = rpc.block_number()
                        while number not in published:
                            time.sleep(0.002)
                        lags.append(published[number] - at)
                        time.sleep(max(0.0, at + block_time - time.monotonic()))
                    row = {"records_a_block": records, "block_time_s": block_time,
                           "blocks": blocks, "lag_p50_s": round(percentile(lags, 50), 3),
                           "lag_p99_s": round(percentile(lags, 99), 3),
                           "lag_max_s": round(max(lags), 3)}
                    out["lag"].append(row)
                    _log(f"[bench] {row}")
                if "sustained" in only:
                    rounds = []
                    for _ in range(1 if quick else SUSTAINED_ROUNDS):
                        blocks = 5 if quick else 20
                        cpu_before = cpu_by_process.snapshot()
                        t0 = time.monotonic()
                        records_before = follower.progress.records
                        for _ in range(blocks):  # as fast as the node mines them: the
                            salt += 1               # follower works behind, block after block
                            fill(1, 2000, salt)
                            readers.mined.value = salt
                            mine()
                        mined_s = time.monotonic() - t0
                        number = rpc.block_number()
                        while number not in published:
                            time.sleep(0.002)
                        seconds = time.monotonic() - t0
                        cpu = cpu_by_process.spent(cpu_before)
                        done = follower.progress.records - records_before
                        last = [phases[n] for n in sorted(phases)[-blocks:]]
                        rounds.append({
                            "blocks": blocks, "records": done, "seconds": round(seconds, 2),
                            # when the node had mined the last block: the follower is behind
                            # only if this is well below `seconds`
                            "mined_by_s": round(mined_s, 2),
                            "records_per_s": round(done / seconds),
                            "phase_s_median": {k: round(statistics.median(
                                p[k] for p in last if k in p), 3) for k in last[0]},
                            # CPU seconds each process (group) spent meanwhile: where the two
                            # cores went
                            "cpu_s_by_process": {k: round(v, 2) for k, v in cpu.items()
                                                 if v >= 0.05}})
                        _log(f"[bench] sustained {rounds[-1]}")
                    rates = [r["records_per_s"] for r in rounds]
                    out["sustained"] = {"records_per_s_median": round(statistics.median(rates)),
                                        "records_per_s": rates, "rounds": rounds}
                out["readers"] = {"reads": readers.reads, "wrong": readers.wrong,
                                  "failed": readers.failed}
            stop.set()
            thread.join(timeout=120)
            if "catch-up" in only:  # after missed blocks
                missed = 100 if quick else 1000
                rpc.call("anvil_mine", quantity(missed))
                head = rpc.block_number()
                stop.clear()
                t0 = time.monotonic()
                follower.run(last=head, poll_s=0.005)
                seconds = time.monotonic() - t0
                out["catch_up"] = {"blocks": missed, "seconds": round(seconds, 2),
                                   "blocks_per_s": round(missed / seconds, 2)}
                _log(f"[bench] catch-up {out['catch_up']}")
        finally:
            stop.set()
            for a in admins:
                a.close()
            for name in ("a", "b"):
                serve.delete(name)
    if "build" in only:
        out["build"] = _build(key, 50_000 if quick else 200_000)
    return out


def _build(key, n: int) -> dict:
    """build_chain_tables over n accounts and n slots (and a little code)."""
    from morphogen.chain.export import StateRecords
    from morphogen.chain.state import ACCOUNT_VALUE_SIZE, code_records
    from morphogen.chain.tables import build_chain_tables
    from morphogen.keyword.descriptor import Anchor

    rng = random.Random(5)
    accounts = [(rng.randbytes(20), rng.randbytes(ACCOUNT_VALUE_SIZE)) for _ in range(n)]
    slots = [(rng.randbytes(52), rng.randbytes(32)) for _ in range(n)]
    code = [r for _ in range(50) for r in code_records(rng.randbytes(3000))]
    t = time.perf_counter()
    build_chain_tables(StateRecords(accounts, slots, code), key,
                       Anchor(1, 1, "0x" + "00" * 32), room=1.25, min_records=0)
    seconds = time.perf_counter() - t
    rate = (2 * n + len(code)) / seconds
    hours = (PROJECT_ACCOUNTS + PROJECT_SLOTS) / rate / 3600
    out = {"records": 2 * n + len(code), "seconds": round(seconds, 2),
           "records_per_s": round(rate), "projected_hours_mainnet_one_process": round(hours, 1)}
    _log(f"[bench] build {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer blocks (a smoke run)")
    ap.add_argument("--only", action="append", choices=PHASES,
                    help="run only this measurement (repeatable; the results go to "
                         "chain_follow_partial.json)")
    ap.add_argument("--readers", type=int, default=2,
                    help="reader processes looking up slots meanwhile (default 2)")
    args = ap.parse_args(argv)
    result = run(args.quick, set(args.only or PHASES), args.readers)
    RESULTS.mkdir(exist_ok=True)
    name = ("chain_follow_partial.json" if args.only else
            "chain_follow_quick.json" if args.quick else "chain_follow.json")
    (RESULTS / name).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
