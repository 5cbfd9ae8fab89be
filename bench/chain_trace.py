"""How fast each source a node offers gives one block's changed keys, on mainnet-shaped blocks.

A block of `--txs` transactions (default 200; mainnet carries 150 to 300) from as many
senders: two in three call a contract that writes fresh storage slots (about `--records`
slots in all, default 2,500), one in three sends value to a new account. For each of
`--blocks` such blocks (anvil, mined back to back) every source is timed from the request to
the block's `Touched` (the node's work, the transfer and the parsing), in a rotating order:

- `prestate`: `debug_traceBlockByHash` with the prestate tracer in diff mode (the follower's
  source before this measurement);
- `tx_batch`: `debug_traceTransaction` with the same tracer for every transaction, as one
  JSON-RPC batch;
- `tx_parallel_N`: the same, as N batches sent at once from N connections;
- `replay`: `trace_replayBlockTransactions` with `stateDiff` (the source `Tracer` picks on a
  node that answers it);
- `call_tracer`: `debug_traceBlockByHash` with the call tracer, for reference only: the
  lightest tracer a debug trace runs, and it names no storage slot, so no source.

Every source's `Touched` is checked equal to the prestate's. `read` is the follower's next
phase (every key's value read at the block, named by its hash), for scale; `read_by_number`
the same reads naming the block by number, which anvil answers far faster (the follower reads
by hash: a reorg cannot swap the block under the reads). The figure is each source's median
over the blocks and its ratio to the prestate's.

    python bench/chain_trace.py                    # 200 transactions, 2,500 slots, 7 blocks
    python bench/chain_trace.py --txs 300 --records 3000
Results: bench/results/chain_trace.json (chain_trace_<txs>.json for other sizes)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"
PARALLEL = (4, 16)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(txs: int, records: int, blocks: int) -> dict:
    from chain_follow import FILL_INIT, FILL_RUNTIME

    from morphogen.chain.blocks import TRACER, Touched, _accounts, _slots, header, read_state
    from morphogen.chain.rpc import EthRpc, quantity
    from morphogen.chain.traces import PRESTATE, Tracer, _block_changes, _diff
    from tests.chain_node import DEV_ACCOUNTS, running_anvil

    def prestate_of(results: list[dict], head) -> Touched:
        out = Touched()
        for result in results:
            _diff(out, result["pre"], result["post"])
        _block_changes(out, head)
        return out

    load_before = os.getloadavg()[0]
    with running_anvil() as url, EthRpc(url, timeout_s=300) as rpc:
        conns = [EthRpc(url, timeout_s=300) for _ in range(max(PARALLEL))]
        rpc.call("evm_setAutomine", False)
        rpc.call("evm_setBlockGasLimit", quantity(2_000_000_000))
        rpc.call("anvil_autoImpersonateAccount", True)
        tx = rpc.call("eth_sendTransaction", {"from": DEV_ACCOUNTS[0], "gas": quantity(500_000),
                                              "data": "0x" + (FILL_INIT + FILL_RUNTIME).hex()})
        rpc.call("evm_mine")
        filler = rpc.call("eth_getTransactionReceipt", tx)["contractAddress"]
        senders = ["0x" + (0x5E0000 + i).to_bytes(20, "big").hex() for i in range(txs)]
        rpc.batch_values([("anvil_setBalance", [s, quantity(10**20)]) for s in senders])
        rpc.call("evm_mine")
        writers = [i for i in range(txs) if i % 3 != 2]
        per_tx = max(1, records // len(writers))

        tracer = Tracer(rpc)
        sources = {
            "prestate": lambda head: Tracer(rpc, PRESTATE).touched(head),
            "tx_batch": lambda head: prestate_of(rpc.batch_values(
                [("debug_traceTransaction", [t, TRACER]) for t in head.transactions]), head),
            **{f"tx_parallel_{n}": partial(_parallel, conns[:n], tracer=TRACER,
                                           prestate_of=prestate_of) for n in PARALLEL},
            "replay": tracer.touched,
            "call_tracer": lambda head: rpc.call("debug_traceBlockByHash", head.hash,
                                                 {"tracer": "callTracer"}),
        }
        times: dict[str, list[float]] = {name: [] for name in [*sources, "read",
                                                               "read_by_number"]}
        shape = []
        for b in range(blocks + 1):  # the first block warms the node and probes the source
            calls = []
            for i, sender in enumerate(senders):
                if i % 3 == 2:
                    to = "0x" + (0xA70000 + b * 100_000 + i).to_bytes(20, "big").hex()
                    calls.append(("eth_sendTransaction", [{"from": sender, "to": to,
                                                           "value": "0x1", "gas": "0x5208"}]))
                else:
                    start = 1 + (b * txs + i) * per_tx  # fresh slots: every write is new
                    calls.append(("eth_sendTransaction", [{
                        "from": sender, "to": filler, "gas": quantity(30_000 * per_tx + 60_000),
                        "data": "0x" + b"".join(x.to_bytes(32, "big")
                                                for x in (start, per_tx, b + 1)).hex()}]))
            rpc.batch_values(calls)
            rpc.call("evm_mine")
            head = header(rpc, rpc.block_number())
            assert len(head.transactions) == txs, (len(head.transactions), txs)
            names = list(sources)
            names = names[b % len(names):] + names[:b % len(names)]
            got = {}
            for name in names:
                t = time.perf_counter()
                got[name] = sources[name](head)
                if b:
                    times[name].append(time.perf_counter() - t)
            want = got["prestate"]
            for name, touched in got.items():
                if isinstance(touched, Touched):
                    assert (touched.accounts, touched.slots, touched.expected) == (
                        want.accounts, want.slots, want.expected), (name, head.number)
            t = time.perf_counter()
            read_state(rpc, head, want)
            by_hash = time.perf_counter() - t
            t = time.perf_counter()
            _slots(rpc, sorted(want.slots), hex(head.number))
            _accounts(rpc, sorted(want.accounts), hex(head.number))
            if b:
                times["read_by_number"].append(time.perf_counter() - t)
                times["read"].append(by_hash)
                shape.append({"accounts": len(want.accounts), "slots": len(want.slots)})
                _log(f"[bench] block {head.number}: {len(want.accounts)} accounts, "
                     f"{len(want.slots)} slots: " + ", ".join(
                         f"{k} {v[-1] * 1000:.0f} ms" for k, v in times.items()))
        for c in conns:
            c.close()
    base = statistics.median(times["prestate"])
    out = {
        # the machine's other work moves every figure alike; the ratios hold better
        "machine": {"cpus": os.cpu_count(), "load_average_1min_before_after": [
            round(load_before, 2), round(os.getloadavg()[0], 2)]},
        "transactions_a_block": txs, "blocks": blocks,
        "changed_records_a_block_median": round(statistics.median(
            s["accounts"] + s["slots"] for s in shape)),
        "accounts_a_block_median": round(statistics.median(s["accounts"] for s in shape)),
        "slots_a_block_median": round(statistics.median(s["slots"] for s in shape)),
        "source_picked": tracer.source,
        "median_ms": {k: round(statistics.median(v) * 1000, 1) for k, v in times.items()},
        "ratio_to_prestate": {k: round(statistics.median(v) / base, 3)
                              for k, v in times.items()},
        "same_touched_as_prestate": True,  # asserted above, every block
    }
    return out


def _parallel(conns, head, *, tracer, prestate_of):
    """The block's transactions traced one by one, as len(conns) batches sent at once."""
    n = len(conns)
    hashes = list(head.transactions)
    parts = [hashes[i::n] for i in range(n)]

    def send(k: int) -> list:
        return conns[k].batch_values([("debug_traceTransaction", [t, tracer])
                                      for t in parts[k]])

    with ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(send, range(n)))
    ordered = [None] * len(hashes)
    for k, part in enumerate(answers):
        for j, result in enumerate(part):
            ordered[k + j * n] = result
    return prestate_of(ordered, head)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--txs", type=int, default=200, help="transactions a block (default 200)")
    ap.add_argument("--records", type=int, default=2500,
                    help="storage slots the block writes in all (default 2500)")
    ap.add_argument("--blocks", type=int, default=7, help="blocks measured (default 7)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "bench"))
    result = run(args.txs, args.records, args.blocks)
    RESULTS.mkdir(exist_ok=True)
    name = "chain_trace.json" if args.txs == 200 else f"chain_trace_{args.txs}.json"
    (RESULTS / name).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
