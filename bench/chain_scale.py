"""What a block costs the owner and the parties, against the size of the chain's tables.

Synthetic state in mainnet's proportions (as bench/chain_build.py: per million records about
199 k accounts, 800 k storage slots and a few hundred codes), built into the three joined
tables of one owner directory at each size. Then the same blocks of 3,000 changed records
(the shape of a mainnet block's state changes: 30 % accounts changed, 2 % accounts created,
53 % slots changed, 12 % slots created, 3 % slots cleared) are applied one version a block,
under two policies, each on an owner directory of its own:

- *now*: the current pages in a mapped file written in place (`map_working_pages`), a full
  copy once the diffs since the last one add up to the table (`keyword.owner.FULL_EVERY = 0`),
  written in a thread of its own (`checkpoints_in_background`), both as a follower does, and
  every version published as updates, in as many
  requests as its pages need (`ROTATE_ABOVE` of the table is the only way to a rotation);
- *before*: a full copy every 8 versions, and a version over one request's 1,024 pages
  published as a rotation (the owner writes the version's full snapshot, every party loads it).

Per size and policy: the owner's apply time a block (median), the pages a block changes, the
bytes the owner writes a block (amortized over the blocks, full copies included), the
publication's form, the bytes each party receives and writes to its log a block, and the
owner's resident memory of its own (not the file pages it maps) once loaded and after the
blocks. The costs that do not depend on the table
(the node's trace, the HTTP hops) are bench/chain_follow.py's.

    python bench/chain_scale.py                          # 1 M, 2 M and 4 M records
    python bench/chain_scale.py --sizes 1000000 --blocks 8
Results: bench/results/chain_scale.json (`--out` another file)
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from _common import dir_bytes  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MAINNET = {"accounts": 388_000_000, "storage": 1_560_000_000, "codes": 2_400_000}
BLOCK = 3_000
SHAPE = {"account": 0.30, "new_account": 0.02, "slot": 0.53, "new_slot": 0.12, "clear": 0.03}
REQUEST_PAGES = 1024  # a party's default admin_max_updates
SPARSE_PAGES = 16384  # and admin_max_sparse_updates
OLD_FULL_EVERY = 8
ROOM = 1.25


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_state(records: int, seed: int = 1):
    """(StateRecords, accounts, slots) of about `records` records in mainnet's proportions."""
    from morphogen.chain.export import StateRecords
    from morphogen.chain.state import Account, code_records, encode_account

    rng = np.random.default_rng(seed)
    total = sum(MAINNET.values())
    n_acc = round(records * MAINNET["accounts"] / total)
    n_slot = round(records * MAINNET["storage"] / total)
    n_code = max(1, round(records * MAINNET["codes"] / total))
    addrs = [bytes(a) for a in rng.integers(0, 256, (n_acc, 20), np.uint8)]
    balances = rng.integers(0, 2**62, n_acc)
    accounts = [(a, encode_account(Account(int(n), int(b))))
                for a, n, b in zip(addrs, rng.integers(0, 1000, n_acc), balances, strict=True)]
    contracts = addrs[: max(1, n_acc * 15 // 100)]
    owners = rng.pareto(1.2, n_slot)
    owners = np.minimum((owners / owners.max() * len(contracts)).astype(int), len(contracts) - 1)
    slot_words = rng.integers(0, 256, (n_slot, 32), np.uint8)
    values = rng.integers(0, 256, (n_slot, 32), np.uint8)
    storage = [(contracts[o] + bytes(w), bytes(v))
               for o, w, v in zip(owners.tolist(), slot_words, values, strict=True)]
    codes = []
    for _ in range(n_code):
        codes += code_records(rng.bytes(int(rng.integers(100, 24_576))))
    return StateRecords(accounts, storage, codes), addrs, [k for k, _ in storage]


def block_changes(rng: np.random.Generator, addrs: list[bytes], slots: list[bytes],
                  number: int):
    """One block's changed records, in the mainnet shape (SHAPE)."""
    from morphogen.chain.state import Account, encode_account
    from morphogen.keyword.owner import Change

    out = []
    counts = {k: round(BLOCK * f) for k, f in SHAPE.items()}
    for i in rng.choice(len(addrs), counts["account"], replace=False).tolist():
        value = encode_account(Account(number, int(rng.integers(0, 2**62))))
        out.append(Change("put", addrs[i], value, table="accounts"))
    for _ in range(counts["new_account"]):
        addr = rng.bytes(20)
        addrs.append(addr)
        out.append(Change("put", addr, encode_account(Account(0, 1)), table="accounts"))
    picked = rng.choice(len(slots), counts["slot"] + counts["clear"], replace=False).tolist()
    for i in picked[: counts["slot"]]:
        out.append(Change("put", slots[i], rng.bytes(32), table="storage"))
    for i in sorted(picked[counts["slot"]:], reverse=True):
        out.append(Change("delete", slots[i], table="storage"))
        slots[i] = slots[-1]
        slots.pop()
    for _ in range(counts["new_slot"]):
        key = addrs[int(rng.integers(0, len(addrs)))] + rng.bytes(32)
        slots.append(key)
        out.append(Change("put", key, rng.bytes(32), table="storage"))
    return out


def run_policy(policy: str, root: Path, table, addrs: list[bytes], slots: list[bytes],
               blocks: int, key) -> dict:
    import psutil

    from morphogen.client.wire import encode_sparse_updates
    from morphogen.keyword.descriptor import Anchor
    from morphogen.keyword.owner import OwnerTable, create_owner_dir
    from morphogen.keyword.publishing import ROTATE_ABOVE
    from morphogen.protocol.codec import admin_body_bytes

    owner_dir = root / policy
    create_owner_dir(table, owner_dir, full_every=OLD_FULL_EVERY if policy == "before" else 0)
    gc.collect()
    rss_before = _anon(psutil)
    owner = OwnerTable(owner_dir)
    if policy == "now":  # as a follower does
        owner.checkpoints_in_background()
        owner.map_working_pages()
    owner.holds()  # loaded, as a running follower holds it
    rss = _anon(psutil) - rss_before
    table_pages = owner.num_pages()
    table_bytes = table_pages * 4096
    full_copy = _version_bytes(owner_dir, 1)  # the table's pages and keys
    rng = np.random.default_rng(7)  # the same blocks under both policies
    addrs, slots = list(addrs), list(slots)
    applies, pages, owner_bytes, party_in, party_log, forms = [], [], 0, 0, 0, []
    version_bytes: list[int] = []
    batch_bytes: list[int] = []
    full_flags: list[bool] = []
    for b in range(blocks):
        changes = block_changes(rng, addrs, slots, b + 2)
        t = time.perf_counter()
        version, batch = owner.apply(changes, key, rng=lambda n: int(rng.integers(0, n)),
                                     anchor=Anchor(1, 1000 + b, "0x" + f"{b:064x}"))
        applies.append(time.perf_counter() - t)
        owner.mark_published(version)
        n = len(batch)
        pages.append(n)
        full = owner.store.is_full(version)
        written = _version_bytes(owner_dir, version)
        version_bytes.append(written)
        batch_bytes.append(owner.store.batch_bytes(version))
        full_flags.append(full)
        if policy == "before":
            rotate, parts = n > REQUEST_PAGES, 1
        else:
            rotate, parts = n > ROTATE_ABOVE * table_pages, -(-n // REQUEST_PAGES)
        forms.append("rotation" if rotate else f"updates/{parts}")
        owner_bytes += written
        if rotate:
            # the version's snapshot staged for the rotation, then loaded by each party
            owner_bytes += table_bytes
            party_in += table_bytes
        elif policy == "before":  # whole pages, in the log as they came
            party_in += n * 4096
            party_log += n * (4096 + 9)
        else:  # what goes over the wire and into each party's log: the bytes that changed,
            # in one body where a party's defaults take it (AdminClient.updates), else parts
            body = encode_sparse_updates(batch)
            if n <= SPARSE_PAGES and len(body) <= admin_body_bytes(REQUEST_PAGES):
                parts = 1
                forms[-1] = "updates/1"
                party_in += len(body)
            else:
                triples = batch.triples()
                party_in += sum(len(encode_sparse_updates(triples[i:i + REQUEST_PAGES]))
                                for i in range(0, n, REQUEST_PAGES))
            triples = batch.triples() if parts > 1 else []
            staged = sum(_blob_bytes(triples[i:i + REQUEST_PAGES])
                         for i in range(0, n, REQUEST_PAGES)) if parts > 1 else 0
            party_log += staged + _blob_bytes(batch)  # the parts, then the batch's file
        _log(f"  {policy}: block {b + 1}/{blocks}: {n} pages, {'full' if full else 'diff'} "
             f"{written / 2**20:.1f} MiB, apply {applies[-1]:.2f} s")
    owner.wait_checkpoints()
    rss_after = _anon(psutil) - rss_before
    checkpoints = sum(owner.store.is_full(v) for v in range(2, blocks + 2))
    del owner
    gc.collect()
    if policy == "before":  # one full copy every OLD_FULL_EVERY versions
        share = full_copy / OLD_FULL_EVERY
    else:  # one full copy (through a raw file of the pages) each time the batches' bytes
        # add up to the table's
        share = (full_copy + table_bytes) * statistics.mean(batch_bytes) / table_bytes
    diffs = [w for w, f in zip(version_bytes, full_flags, strict=True) if not f]
    staged = table_bytes * forms.count("rotation") / blocks
    return {"table_pages": table_pages, "table_mib": round(table_bytes / 2**20, 1),
            "full_copy_mib": round(full_copy / 2**20, 1),
            "full_copies_in_run": checkpoints,
            # in steady state: a block's own version, its share of the full copies, and a
            # rotation's snapshot where the block went as one
            "owner_mib_per_block_steady": round(
                (statistics.mean(diffs) + share + staged) / 2**20, 2),
            "apply_s_median": round(statistics.median(applies), 3),
            "apply_s_max": round(max(applies), 3),
            "apply_s": [round(a, 3) for a in applies],
            "block_pages_median": int(statistics.median(pages)),
            "owner_mib_per_block_in_run": round(owner_bytes / blocks / 2**20, 2),
            "party_received_mib_per_block": round(party_in / blocks / 2**20, 2),
            "party_log_mib_per_block": round(party_log / blocks / 2**20, 2),
            "forms": forms, "owner_resident_mib": round(rss / 2**20),
            "owner_resident_mib_after_blocks": round(rss_after / 2**20)}


def _blob_bytes(batch) -> int:
    """The bytes of a party's log file of `batch` (`publication.records.encode_batch`)."""
    from morphogen.protocol.changes import ChangeBatch
    from morphogen.publication.records import encode_batch

    whole = batch if isinstance(batch, ChangeBatch) else ChangeBatch.from_triples(batch)
    return sum(len(x) for x in encode_batch(whole))


def _anon(psutil) -> int:
    """Resident memory of the process's own (not pages of files it maps, which the kernel
    writes out and drops under pressure)."""
    info = psutil.Process().memory_info()
    return info.rss - info.shared


def _version_bytes(root: Path, version: int) -> int:
    from morphogen.keyword.versions import vdir

    return dir_bytes(vdir(root, version))


def run(sizes: list[int], blocks: int, work: Path,
        policies: tuple[str, ...] = ("now", "before")) -> dict:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from morphogen.chain.tables import build_chain_tables
    from morphogen.keyword.descriptor import Anchor

    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    out = {"block_records": BLOCK, "shape": SHAPE, "blocks": blocks,
           "request_pages": REQUEST_PAGES, "old_full_every": OLD_FULL_EVERY, "sizes": {}}
    for size in sizes:
        _log(f"{size:,} records: making the state and building the tables")
        t = time.perf_counter()
        records, addrs, slots = make_state(size)
        table = build_chain_tables(records, key, Anchor(1, 999, "0x" + "00" * 32), room=ROOM,
                                   min_records=0, seed=1)
        built_s = time.perf_counter() - t
        del records
        gc.collect()
        root = work / f"n{size}"
        row = {"build_s": round(built_s, 1)}
        for policy in policies:
            row[policy] = run_policy(policy, root, table, addrs, slots, blocks, key)
            shutil.rmtree(root / policy, ignore_errors=True)
        del table
        gc.collect()
        out["sizes"][str(size)] = row
        _log(json.dumps(row))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 2_000_000, 4_000_000])
    ap.add_argument("--blocks", type=int, default=12,
                    help="blocks a policy (12: each policy's full copy comes at least once at "
                         "1 M records)")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--policies", nargs="+", choices=("now", "before"), default=["now", "before"])
    ap.add_argument("--out", type=Path, default=RESULTS / "chain_scale.json")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="morphogen-scale-"))
    try:
        result = run(args.sizes, args.blocks, work, tuple(args.policies))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    small, large = result["sizes"][str(min(args.sizes))], result["sizes"][str(max(args.sizes))]
    result["ratios_largest_to_smallest"] = {
        policy: {k: round(large[policy][k] / small[policy][k], 2) if small[policy][k] else None
                 for k in ("apply_s_median", "owner_mib_per_block_steady",
                           "party_received_mib_per_block", "party_log_mib_per_block",
                           "block_pages_median", "owner_resident_mib",
                           "owner_resident_mib_after_blocks")}
        for policy in args.policies}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["ratios_largest_to_smallest"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
