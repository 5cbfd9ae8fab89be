"""A chain's tables from a state dump: the one-process `chain build` against `chain import`
on Ray with 1, 2 and all cores as workers, end to end (dump read to signed owner directory).

Synthetic state in mainnet's proportions (block ~25.3 M: 388 M accounts, 1.56 B storage
slots, 2.4 M distinct codes): per million records about 199 k accounts (15 % of them contracts
sharing the codes, slots spread over them by a Pareto law, as a few contracts hold most) and
800 k slots, codes of 100 B to 24 KiB. Each size is written twice, as geth's JSON lines in no
address order (what `chain import` reads) and as the state export (what `chain build` reads),
neither timed. One local Ray instance with every core is started, and its workers warmed (the
encoder imported), before the timed imports, as a cluster is up before an import (that start is
reported apart); `workers` bounds the tasks in flight, as `chain import --workers` does. The
builds take turns, round after round, and each figure is the median of its rounds (`--runs`
up to 1 M records; above, `--big-rounds`, the one-process build in the first round only).
Rates are given per wall second and per CPU second: this host's two cores are shared, so the
bench also measures what it gives two processes of pure CPU work at the time
(`host_speedup_2_processes`), the ceiling of any 1 -> 2 worker speed-up measured here.

Each import reports its steps: encode (Ray tasks: parse, encode, tag, hash; the part that
scales with workers), during which the one process loads each range a worker finished (all but
the keys of accounts and storage) and puts what the key index needs of it in the object store,
then place and write (that process: the placing funnel) while a Ray task builds the owner's key
index (the index funnel; the wait for it after placing is `index_wait_s`). The projection for
R records on N nodes of C cores:

    T(N) = max(R / (N * C * r_worker), R / r_load, R / r_index_read)
           + max(R / r_place, R / r_index)

with r_worker the encode rate of one worker (per CPU second), r_load and r_index_read the rates at
which the one process reads the ranges in and puts the index's part of them in the object store
(they keep up with the workers or the workers wait on them), r_place the placing rate through
placing and writing and r_index the index's from its build's start to its synced files, all
measured here. The two funnels run at once: on a cluster on nodes of their own, on this host on the
same two cores, each slowed by the other. So r_place and r_index are measured alone too, from
the same encoded ranges, `--runs` times a size (`funnels_alone`, per wall second, the medians;
the result compared with the one-process build's), and the projection uses those, beside the
same projection with the one funnel
of before (`r_one_process`: place, then write with the index built in the same process; measured
from the same ranges in the same run); the rates within the imports are in the rows (`place_rps`,
`index_rps`; `funnel_rps`, both together on this host). The memory each needs: its peak during an
import above what it held before, per record (`peak_bytes_per_record`, `index_bytes_per_record`),
and that times R (`funnel_gib`, `index_gib`). The disk it needs beside the dump: the encoded
ranges in its work directory and the owner directory, per record (`ranges_bytes_per_record`,
`owner_bytes_per_record`) and times R (`ranges_gib`, `owner_gib`).

    python bench/chain_build.py                    # 1 M, 4 M, 16 M records
    python bench/chain_build.py --sizes 1000000    # one size
    python bench/chain_build.py --sizes 16000000 --big-rounds 3   # the imports 3 rounds
Results: bench/results/chain_build.json and chain_build.png
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import shutil
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
PER_RECORD = sum(MAINNET.values())
PROJECT_RECORDS = 2_000_000_000
PROJECT_CORES = 16
FORMULA = ("T(N) = max(R / (N * C * r_worker), R / r_load, R / r_index_read)"
           " + max(R / r_place, R / r_index)")
ROOM = 1.25  # both builds: slots for 1.25 times the records (the default 4 is for a dev chain)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_state(records: int, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    n_acc = round(records * MAINNET["accounts"] / PER_RECORD)
    n_slots = round(records * MAINNET["storage"] / PER_RECORD)
    n_codes = max(1, round(records * MAINNET["codes"] / PER_RECORD))
    addresses = rng.integers(0, 256, (n_acc, 20), dtype=np.uint8)
    addresses = addresses[np.lexsort(addresses.T[::-1])]
    contracts = rng.random(n_acc) < 0.15
    code_of = np.where(contracts, (rng.pareto(1.2, n_acc) * n_codes / 10).astype(np.int64)
                       % n_codes, -1)
    weights = np.where(contracts, rng.pareto(1.1, n_acc) + 0.01, 0)
    slots = rng.multinomial(n_slots, weights / weights.sum())
    lengths = rng.integers(100, 24_576, n_codes) // (1 + rng.integers(0, 8, n_codes))
    codes = [rng.bytes(int(n)).hex() for n in lengths]
    words = rng.integers(0, 256, (n_slots, 32), dtype=np.uint8)
    small = rng.random(n_slots) < 0.6
    words[small, :24] = 0  # many words are small numbers
    words[:, 31] |= 1  # never zero
    return {"addresses": addresses, "code_of": code_of, "slots": slots, "codes": codes,
            "slot_hex": rng.bytes(32 * n_slots).hex(), "word_hex": words.tobytes().hex(),
            "nonces": rng.integers(0, 3000, n_acc),
            "balances": rng.integers(0, 2**62, n_acc)}


def write_dumps(state: dict, dump: Path, export: Path) -> int:
    """The geth dump (shuffled) and the state export (sorted); returns the records."""
    from morphogen.chain.state import code_chunks

    n = len(state["addresses"])
    starts = np.concatenate([[0], np.cumsum(state["slots"])])
    addr_hex = state["addresses"].tobytes().hex()
    sh, wh = state["slot_hex"], state["word_hex"]

    def parts(i: int):
        code_id = int(state["code_of"][i])
        code = state["codes"][code_id] if code_id >= 0 else ""
        a, b = int(starts[i]), int(starts[i + 1])
        return (addr_hex[40 * i:40 * i + 40], int(state["nonces"][i]),
                int(state["balances"][i]) * 10**6, code,
                [(sh[64 * j:64 * j + 64], wh[64 * j:64 * j + 64]) for j in range(a, b)])

    with dump.open("w") as f:
        f.write('{"root":"0x' + "11" * 32 + '"}\n')
        for i in np.random.default_rng(2).permutation(n):
            address, nonce, balance, code, storage = parts(int(i))
            body = ",".join(f'"0x{s}":"{w.lstrip("0")}"' for s, w in storage)
            f.write(f'{{"balance":"{balance}","nonce":{nonce},"root":"0x{"00" * 32}",'
                    f'"codeHash":"0x{"00" * 32}"' + (f',"code":"0x{code}"' if code else "")
                    + (f',"storage":{{{body}}}' if storage else "")
                    + f',"address":"0x{address}"}}\n')
    with export.open("w") as f:
        f.write(json.dumps({"format": "morphogen-state/1", "chain_id": 1, "block": {
            "number": 5, "hash": "0x" + "ab" * 32, "parent_hash": "0x" + "cd" * 32,
            "state_root": "0x" + "11" * 32}}) + "\n")
        for i in range(n):
            address, nonce, balance, code, storage = parts(i)
            body = ",".join(f'"0x{s}":"0x{w}"' for s, w in storage)
            f.write(f'{{"address":"0x{address}","nonce":{nonce},"balance":"{hex(balance)}",'
                    f'"code":"0x{code}","storage":{{{body}}}}}\n')
    used = {int(c) for c in state["code_of"] if c >= 0}
    return n + len(state["slot_hex"]) // 64 + sum(code_chunks(len(state["codes"][c]) // 2)
                                                  for c in used)


def _spin(_: object = None) -> float:
    t, x = time.perf_counter(), 0
    for i in range(10_000_000):
        x += i
    return time.perf_counter() - t


def host_speedup() -> float:
    """What this host gives two processes at once now, over one: pure CPU work, no I/O (a
    shared machine gives less than 2)."""
    import multiprocessing

    one = _spin()
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(_spin, [0, 0])  # both started
        t = time.perf_counter()
        pool.map(_spin, [0, 0], chunksize=1)
        two = time.perf_counter() - t
    return round(2 * one / two, 2)


def _warm(dump: str) -> int:
    # a worker's first task imports the encoder and loads its compiled kernels (seconds, once
    # a worker), and so does its first key index: both done before the timed import, as on a
    # cluster that is already running
    from cluster.chain_import import _encode_to, _index_to
    from morphogen.chain import bulk, dumps

    info = dumps.info(dump)
    a, b = dumps.line_ranges(dump, info.body, 1)[0]
    with tempfile.TemporaryDirectory() as tmp:
        _encode_to(dump, a, b, bulk.plan(1), f"{tmp}/r0")
        _index_to([f"{tmp}/r0"], f"{tmp}/keys", 0)
    time.sleep(1.0)  # hold this worker, so that the others warm on workers of their own
    return os.getpid()


def single_process(export: Path, out: Path, key) -> tuple[float, float]:
    """The one-process build in a process of its own, as `chain build` runs (its millions of
    small objects are then none of the imports' heap)."""
    import multiprocessing

    from cryptography.hazmat.primitives import serialization

    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_single_build, (str(export), str(out), raw))


def _single_build(export: str, out: str, raw_key: bytes) -> tuple[float, float]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from morphogen.chain import read_header, state_records
    from morphogen.chain.tables import build_chain_tables
    from morphogen.keyword.descriptor import Anchor
    from morphogen.keyword.owner import create_owner_dir

    key = Ed25519PrivateKey.from_private_bytes(raw_key)
    t, cpu = time.perf_counter(), time.process_time()
    header = read_header(export)
    anchor = Anchor(header.chain_id, header.block.number, header.block.hash)
    table = build_chain_tables(state_records(export), key, anchor, room=ROOM, min_records=0,
                               seed=9, created=1000)
    create_owner_dir(table, out)
    return time.perf_counter() - t, time.process_time() - cpu


def imported(dump: Path, out: Path, key, workers: int) -> tuple[float, dict]:
    """One import's seconds and steps, with `peak_mib`: the most this process (the one
    that reads the ranges in and runs the funnel) held at once during it, above what it held
    before (its high-water mark reset first)."""
    from cluster.chain_import import _peak_reset, _status_mib, import_dump
    from morphogen.keyword.descriptor import Anchor

    timings: dict = {}
    gc.collect()
    # what the heap keeps of earlier imports goes back to the system, so that this import's
    # own arrays count (reusing the kept memory would hide them)
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    before = _peak_reset()  # the high-water mark := resident now
    t = time.perf_counter()
    import_dump(dump, out, signing_key=key, anchor=Anchor(1, 5, "0x" + "ab" * 32),
                workers=workers, room=ROOM, min_records=0, seed=9, created=1000,
                range_bytes=8 << 20, report=lambda line: None, timings=timings)
    seconds = time.perf_counter() - t
    timings["peak_mib"] = _status_mib("VmHWM") - before
    return seconds, timings


def funnels_alone(dump: Path, work: Path, out: Path, key, runs: int) -> dict:
    """Each of the two funnels timed alone on this host, from the same encoded ranges, as each
    runs on a node of its own on a cluster: the key index (`_index_to`, from its first read
    to its synced files), then the placing (`bulk.assemble` from the ranges read in, and the
    owner directory written with that index moved in, its pages placed in the file that
    becomes the snapshot's, as an import does). The baseline first, from the same
    ranges: the one-process funnel that imports ran before the index had a task of its own
    (placing, then the owner directory with the index built in the same process). The ranges
    are encoded once, and each funnel timed `runs` times in turn: each figure is the median
    (the projection rests on them, and one run on this host varies by a third). The ranges'
    encoding and the reads of them (the import overlaps those with encoding: `load_s`) are
    not timed. `out` holds the last run's owner directory."""
    from cluster import chain_import as ci
    from morphogen.chain import bulk, dumps
    from morphogen.keyword.descriptor import Anchor
    from morphogen.keyword.owner import create_owner_dir

    ranges = work / "alone.work"
    shutil.rmtree(ranges, ignore_errors=True)
    files, seed = ci.encode_ranges(dump, ranges, dumps.info(dump).body, seed=9,
                                   range_bytes=8 << 20, report=lambda line: None)
    # the disk the encoded ranges take in the work directory while an import runs
    ranges_bytes = dir_bytes(ranges)

    def read(fields) -> list[dict]:
        parts = ci.read_ranges(files, fields)
        gc.collect()
        return parts

    anchor = Anchor(1, 5, "0x" + "ab" * 32)
    timed: dict[str, list[float]] = {"one_process_s": [], "index_alone_s": [],
                                     "index_read_alone_s": [], "place_alone_s": []}
    for _ in range(runs):
        shutil.rmtree(out, ignore_errors=True)
        # the baseline: one process places and writes, the key index built after the pages
        # (as every import did before the index had a task of its own)
        whole = read((*bulk.PLACE_FIELDS, "sto_keys"))
        t = time.perf_counter()
        table = bulk.assemble(whole, seed=seed, signing_key=key, anchor=anchor, room=ROOM,
                              min_records=0, created=1000)
        del whole
        create_owner_dir(table, work / "one-process")
        timed["one_process_s"].append(time.perf_counter() - t)
        del table
        shutil.rmtree(work / "one-process")
        gc.collect()
        parts = read(bulk.PLACE_FIELDS)
        index = ci._index_to(files, str(ranges / "keys"), ci._capacity(parts, ROOM, 0))
        timed["index_alone_s"].append(index["index_s"])
        timed["index_read_alone_s"].append(index["index_read_s"])
        t = time.perf_counter()
        table = bulk.assemble(parts, seed=seed, signing_key=key, anchor=anchor, room=ROOM,
                              min_records=0, created=1000, keys_apart=ci._keys_from(files),
                              pages_at=ranges / "pages.staged")
        del parts
        create_owner_dir(table, out, keys_folder=ranges / "keys", adopt_pages=True)
        timed["place_alone_s"].append(time.perf_counter() - t)
        del table
        gc.collect()
    shutil.rmtree(ranges)
    return {name: float(np.median(values)) for name, values in timed.items()} \
        | {"runs": {name: [round(v, 2) for v in values] for name, values in timed.items()},
           "ranges_bytes": ranges_bytes}


def same_bytes(a: Path, b: Path) -> bool:
    for path in sorted(a.rglob("*")):
        if path.is_file() and path.name != "manifest.json":
            if path.read_bytes() != (b / path.relative_to(a)).read_bytes():
                return False
    return True


def run(sizes: list[int], runs: int, work: Path, big_rounds: int = 1) -> dict:
    import ray
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from cluster.local import quiet_ray_logs

    key = Ed25519PrivateKey.generate()
    cores = os.cpu_count() or 1
    workers_list = sorted({1, 2, cores})
    quiet_ray_logs()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    t = time.perf_counter()
    # one local Ray instance with every core; `workers` bounds the tasks in flight, as
    # `chain import --workers` does on a cluster
    ray.init(address="local", num_cpus=cores, include_dashboard=False, logging_level="WARNING",
             log_to_driver=False)
    ray_start_s = time.perf_counter() - t
    # this process's own kernels (the funnel's) loaded before any timed import, by an import
    # of a small dump: a first import would count their loading in its time and memory
    write_dumps(make_state(2_000), work / "warm.jsonl", work / "warm-export.jsonl")
    imported(work / "warm.jsonl", work / "warm-out", key, 1)
    shutil.rmtree(work / "warm-out")
    funnels_alone(work / "warm.jsonl", work, work / "warm-out", key, 1)
    shutil.rmtree(work / "warm-out")
    rows = []
    for size in sizes:
        _log(f"[bench] {size:,} records: writing the dumps")
        state = make_state(size)
        dump, export = work / "dump.jsonl", work / "export.jsonl"
        records = write_dumps(state, dump, export)
        del state
        gc.collect()
        warm = ray.remote(num_cpus=1)(_warm)
        pids = set(ray.get([warm.remote(str(dump)) for _ in range(cores)]))
        row: dict = {"records": records, "dump_mb": round(dump.stat().st_size / 2**20, 1),
                     "ray_start_s": round(ray_start_s, 2), "warm_workers": len(pids)}
        times: list = []
        hosts: list = []
        results: dict = {w: [] for w in workers_list}
        # the builds take turns, round after round, so that the host's changing load falls on
        # each alike; each figure is the median of its rounds
        small = size <= 1_000_000
        for round_ in range(runs if small else big_rounds):
            # above 1 M the one process's build (minutes) runs in the first round only: the
            # further rounds are of the imports, whose 1 -> 2 figure they settle
            if small or round_ == 0:
                shutil.rmtree(work / "single", ignore_errors=True)
                times.append(single_process(export, work / "single", key))
                gc.collect()
            hosts.append(host_speedup())
            for w in workers_list:
                out = work / f"import-{w}"
                shutil.rmtree(out, ignore_errors=True)
                results[w].append(imported(dump, out, key, w))
                gc.collect()
            _log(f"[bench] round {round_ + 1}: single {records / times[0][0]:,.0f}/s (round 1), "
                 + ", ".join(f"{w} workers {records / results[w][-1][0]:,.0f}/s"
                             for w in workers_list) + f", host 2-process {hosts[-1]}x")
        wall, cpu = sorted(times)[len(times) // 2]
        row["single_s"] = round(wall, 2)
        row["single_rps"] = round(records / wall)
        row["single_cpu_rps"] = round(records / cpu)
        row["host_speedup_2_processes"] = sorted(hosts)[len(hosts) // 2]
        for w in workers_list:
            seconds, steps = sorted(results[w], key=lambda x: x[0])[len(results[w]) // 2]
            placing = steps["place_s"] + steps["write_s"]
            funnel = placing + steps["index_wait_s"]
            row[f"w{w}"] = {
                "seconds": round(seconds, 2), "records_per_s": round(records / seconds),
                **{k: round(v, 2) for k, v in steps.items()},
                "encode_rps_per_worker": round(records / steps["encode_s"] / w),
                "encode_cpu_rps": round(records / steps["encode_cpu_s"]),
                "load_rps": round(records / steps["load_s"]),
                "funnel_rps": round(records / funnel),
                "place_rps": round(records / placing),
                "index_rps": round(records / steps["index_s"]),
                "index_read_rps": round(records / steps["index_put_s"]),
                "index_bytes_per_record": round(steps.get("index_peak_mib", 0) * 2**20
                                                / records),
                "funnel_cpu_rps": round(records / steps["funnel_cpu_s"]),
                "peak_bytes_per_record": round(steps["peak_mib"] * 2**20 / records),
                "identical_to_single": same_bytes(work / f"import-{w}", work / "single")}
            _log(f"[bench] {w} workers: {row[f'w{w}']}")
        # the funnels alone, after the rounds (the one-process build's directory from the
        # last round is there to compare with)
        alone = funnels_alone(dump, work, work / "alone", key, runs)
        row["funnels_alone"] = {
            **{k: round(v, 2) if isinstance(v, float) else v for k, v in alone.items()},
            "place_rps": round(records / alone["place_alone_s"]),
            "index_rps": round(records / alone["index_alone_s"]),
            "one_process_rps": round(records / alone["one_process_s"]),
            "identical_to_single": same_bytes(work / "alone", work / "single"),
            "ranges_bytes_per_record": round(alone["ranges_bytes"] / records),
            "owner_bytes_per_record": round(dir_bytes(work / "single") / records)}
        _log(f"[bench] funnels alone: {row['funnels_alone']}")
        shutil.rmtree(work / "alone")
        one, two = row["w1"], row.get("w2", row["w1"])
        row["per_core_vs_single"] = round(one["records_per_s"] / row["single_rps"], 2)
        row["per_core_cpu_vs_single"] = round(
            records / (one["encode_cpu_s"] + one["funnel_cpu_s"]) / row["single_cpu_rps"], 2)
        row["speedup_1_to_2"] = round(two["records_per_s"] / one["records_per_s"], 2)
        if 2 in results:
            # each round's own figure: its two imports ran minutes apart, under the same load
            row["speedup_1_to_2_rounds"] = [round(a[0] / b[0], 2)
                                            for a, b in zip(results[1], results[2], strict=True)]
        rows.append(row)
        for p in ("single", *[f"import-{w}" for w in workers_list]):
            shutil.rmtree(work / p, ignore_errors=True)
    ray.shutdown()
    biggest = rows[-1]
    # the workers' rate per CPU second (the wall rates on a shared 2-core host measure its
    # other tenants); the one process's rates per wall second (its kernels run on every
    # core), the slower of the imports
    r_worker = biggest["w1"]["encode_cpu_rps"]
    r_load = min(biggest[f"w{w}"]["load_rps"] for w in workers_list)
    r_read = min(biggest[f"w{w}"]["index_read_rps"] for w in workers_list)
    # the funnels alone (on a cluster each has a node; here, timed together, each is slowed
    # by the other on the same two cores: those rates are in the rows too)
    r_place = biggest["funnels_alone"]["place_rps"]
    r_index = biggest["funnels_alone"]["index_rps"]
    r_one = biggest["funnels_alone"]["one_process_rps"]
    # the disk an import holds at its end, beside the dump: the encoded ranges (its work
    # directory) and the owner directory it writes, a record's share of each times R
    ranges_disk = biggest["funnels_alone"]["ranges_bytes_per_record"]
    owner_disk = biggest["funnels_alone"]["owner_bytes_per_record"]
    # the process that places holds the records it places, the index task the keys: each
    # one's peak a record, at the largest size, times the projected records
    peak = max(biggest[f"w{w}"]["peak_bytes_per_record"] for w in workers_list)
    index_peak = max(biggest[f"w{w}"]["index_bytes_per_record"] for w in workers_list)
    projection = {str(n): round((max(PROJECT_RECORDS / (n * PROJECT_CORES * r_worker),
                                     PROJECT_RECORDS / r_load, PROJECT_RECORDS / r_read)
                                 + max(PROJECT_RECORDS / r_place, PROJECT_RECORDS / r_index))
                                / 60, 1)
                  for n in (1, 2, 4, 8, 16, 32, 64)}
    # the same projection with the one-process funnel of the same run (the baseline)
    baseline = {str(n): round((max(PROJECT_RECORDS / (n * PROJECT_CORES * r_worker),
                                   PROJECT_RECORDS / r_load) + PROJECT_RECORDS / r_one) / 60, 1)
                for n in (1, 2, 4, 8, 16, 32, 64)}
    return {"machine_cpus": cores, "room": ROOM, "sizes": rows,
            "projection": {"records": PROJECT_RECORDS, "cores_per_node": PROJECT_CORES,
                           "formula": FORMULA, "r_worker": r_worker, "r_load": r_load,
                           "r_index_read": r_read,
                           "r_place": r_place, "r_index": r_index,
                           "minutes_by_nodes": projection, "r_one_process": r_one,
                           "minutes_by_nodes_one_process_funnel": baseline,
                           "funnel_bytes_per_record": peak,
                           "funnel_gib": round(PROJECT_RECORDS * peak / 2**30),
                           "index_bytes_per_record": index_peak,
                           "index_gib": round(PROJECT_RECORDS * index_peak / 2**30),
                           "ranges_gib": round(PROJECT_RECORDS * ranges_disk / 2**30),
                           "owner_gib": round(PROJECT_RECORDS * owner_disk / 2**30)}}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    sizes = [r["records"] / 1e6 for r in result["sizes"]]
    left.plot(sizes, [r["single_rps"] / 1e3 for r in result["sizes"]], "o-",
              label="chain build (one process)")
    workers = sorted(int(k[1:]) for k in result["sizes"][0]
                     if k.startswith("w") and k[1:].isdigit())
    for w in workers:
        left.plot(sizes, [r[f"w{w}"]["records_per_s"] / 1e3 for r in result["sizes"]], "o-",
                  label=f"chain import, {w} Ray worker{'s' if w > 1 else ''}")
    left.set_xscale("log")
    left.set_xticks(sizes, [f"{s:.3g}" for s in sizes])
    left.minorticks_off()
    left.set_xlabel("records (millions)")
    left.set_ylabel("thousand records/s, end to end")
    left.set_title(f"this machine ({result['machine_cpus']} cores)")
    left.legend()
    proj = result["projection"]
    nodes = [int(n) for n in proj["minutes_by_nodes"]]
    right.plot(nodes, list(proj["minutes_by_nodes"].values()), "o-",
               label="two funnels (index apart)")
    if "minutes_by_nodes_one_process_funnel" in proj:
        right.plot(nodes, list(proj["minutes_by_nodes_one_process_funnel"].values()), "o--",
                   label="one funnel (before)")
    right.axhline(30, color="grey", linestyle=":", label="30 min")
    right.set_xscale("log", base=2)
    right.set_xlabel(f"nodes of {proj['cores_per_node']} cores")
    right.set_ylabel("minutes")
    right.set_title("2 B records, projected:\n" + FORMULA.split(" = ")[1], fontsize=8)
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000, 16_000_000])
    ap.add_argument("--runs", type=int, default=3,
                    help="runs of each build up to 1 M records (one above), and of the "
                    "funnels alone at every size: the medians")
    ap.add_argument("--big-rounds", type=int, default=1,
                    help="rounds of the imports above 1 M records (the one-process build "
                    "runs in the first only): the medians")
    ap.add_argument("--out", default=None, help="results file (default: chain_build.json)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="chain-build-") as tmp:
        result = run(args.sizes, args.runs, Path(tmp), args.big_rounds)
    RESULTS.mkdir(exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / "chain_build.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out.with_suffix(".png"))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
