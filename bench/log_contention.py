"""A publication's latency through the epoch log, one writer against two, by the log's length.

Each writer is a process of its own (two routers of one party), publishing one-page batches in
a loop as a router does: `Publisher._propose` (the router's own code, its wait for another
publisher's lease included), then the commit decision. A publication's latency runs from the
proposal's start to the decision written; no shards are behind it (their prepare and commit
cost the same whatever the log does), unless `--hold-ms` and `--gap-ms` stand in for them
(without them a writer proposes again the moment its decision is written: the worst case for
another writer waiting to get in). With two writers each finds the other's proposal undecided
now and then and waits for it, as two routers serving two admins do.

Both backends in the same run: a directory on local disk, and write-once objects on an S3
protocol server on loopback (moto's server mode, started here; one bucket per log, as a
party's log has its prefix to itself). Each log is filled beforehand to `--lengths` records in
its live generation. The raw latency of the requests a publication makes (S3: four LISTs after
the newest key, two create-only PUTs and one PUT; directory: two fsynced appends and one
atomic batch file) is measured on the same store at the same length in the same run, and each
latency is also given as a multiple of it.

    python bench/log_contention.py                  # 100, 1000, 3000 records; 3 runs
    python bench/log_contention.py --quick          # 100 and 1000 records; 1 run
    python bench/log_contention.py --gap-ms 20 --name log_contention_gap20
Results: bench/results/log_contention.csv (one row per run) and .json (medians over runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import (  # noqa: E402
    RESULTS,
    build_updates,
    machine_label,
    percentile,
    write_csv,
)

LEASE_S = 5.0  # the routers' default admin_lease_s


def _batches(count: int, seed: int) -> list:
    from morphogen.protocol.changes import ChangeBatch

    rng = np.random.default_rng(seed)
    return [ChangeBatch(rng.integers(0, 1 << 20, 1, dtype=np.int64), np.array([True]),
                        rng.integers(0, 256, 4096, np.uint8).tobytes()) for _ in range(count)]


class _Party:
    """What `Publisher._propose` and `_in_log` use of a party."""

    def __init__(self, log) -> None:
        self.cfg = SimpleNamespace(admin_timeout_s=120.0, admin_failpoint_file=None)
        self.epoch_log = log

    def unavailable(self, message: str) -> Exception:
        return RuntimeError(message)


def _counting(counts: Counter, name: str, fn, exc: type[BaseException]):
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except exc:
            counts[name] += 1
            raise
    return call


class FixedWait:
    """The wait before the fix of issue 28's p99: the log read again every 250 ms."""

    async def sleep(self, busy) -> None:
        await asyncio.sleep(min(0.25, busy.remaining_s + 0.01))


def writer(uri: str, count: int, tag: str, seed: int, barrier, hold_s: float, gap_s: float,
           policy: str, filled: str) -> dict:
    """One router publishing `count` batches into the log at `uri` (in a process of its own),
    waiting for the other's lease as the publisher does (`policy` "fixed": as it did)."""
    from morphogen.party import publisher as publisher_module
    from morphogen.publication.lease import BusyWait
    from morphogen.publication.log import EpochLog, EpochLogBusy
    from morphogen.storage.log_objects import RaceLost, _record_key

    # a pool process runs one writer after another: set the policy every time
    publisher_module.BusyWait = FixedWait if policy == "fixed" else BusyWait
    log = EpochLog(uri)
    if log._objects is not None:  # a router that has been running has read the records
        records = frames((Path(filled) / "epochs.log").read_bytes())
        log._objects._cache.update({_record_key(0, i): r for i, r in enumerate(records)})
    log.state()
    counts: Counter[str] = Counter()
    log.propose = _counting(counts, "busy", log.propose, EpochLogBusy)
    if log._objects is not None:
        log._objects.append = _counting(counts, "race_lost", log._objects.append, RaceLost)
    publisher = publisher_module.Publisher(_Party(log), lease_s=LEASE_S)
    batches = _batches(count + 1, seed)

    async def publish(batches: list, tag: str) -> list[tuple[float, int, int]]:
        out = []
        for i, batch in enumerate(batches):
            t, before = time.perf_counter(), counts.copy()
            proposal = await publisher._propose(f"{tag}-{i}", f"req-{tag}-{i}",
                                                build_updates(batch))
            if hold_s:
                await asyncio.sleep(hold_s)
            await publisher.in_log(log.decide, proposal, "commit")
            out.append((time.perf_counter() - t, counts["busy"] - before["busy"],
                        counts["race_lost"] - before["race_lost"]))
            if gap_s:
                await asyncio.sleep(gap_s)
        return out

    asyncio.run(publish(batches[:1], f"{tag}-warm"))  # the first one starts the worker threads
    barrier.wait()
    start = time.monotonic()
    counts.clear()
    each = asyncio.run(publish(batches[1:], tag))
    return {"latencies": [e[0] for e in each], "waited": [e[1] for e in each],
            "raced": [e[2] for e in each], "start": start, "end": time.monotonic(), **counts}


# -- logs of a given length

def template(work: Path, length: int) -> Path:
    """A directory log of `length` records (committed publications, two records each)."""
    from morphogen.publication.log import EpochLog

    path = work / f"template-{length}"
    log = EpochLog(path)
    for i, batch in enumerate(_batches(length // 2, length)):
        p = log.propose(f"fill-{i}", f"req-fill-{i}", "fill", 60.0, build_updates(batch))
        log.decide(p, "commit")
    assert len(log.entries()) == length
    return path


def frames(raw: bytes) -> list[bytes]:
    from morphogen.publication.records import FRAME

    out, pos = [], 0
    while pos < len(raw):
        end = pos + FRAME.size + FRAME.unpack_from(raw, pos)[1]
        out.append(raw[pos:end])
        pos = end
    return out


def s3_copy(src: Path, uri: str) -> None:
    """The records of the directory log `src` as an object log at `uri`."""
    import obstore

    from morphogen.publication.records import MARKER_FILE
    from morphogen.storage import open_location
    from morphogen.storage.log_objects import _record_key

    loc = open_location(uri)
    obstore.put(loc.store, loc.key(MARKER_FILE), (src / MARKER_FILE).read_bytes())
    records = frames((src / "epochs.log").read_bytes())
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: obstore.put(loc.store, loc.key(_record_key(0, i)), records[i]),
                      range(len(records))))


# -- the raw requests

def raw_s3(uri: str, runs: int = 40) -> dict[str, float]:
    """Median seconds of a create-only PUT, a LIST after the log's newest key, and a GET."""
    import obstore

    from morphogen.storage import open_location

    loc = open_location(uri)
    last_key = max(m["path"] for m in obstore.list(loc.store, prefix=loc.key("records"))
                   .collect())
    out: dict[str, list[float]] = {"create": [], "list": [], "get": []}
    stamp = time.time_ns()
    for i in range(runs):
        t = time.perf_counter()
        obstore.put(loc.store, loc.key(f"raw/{stamp}-{i:04d}"), b"x" * 300, mode="create")
        out["create"].append(time.perf_counter() - t)
        t = time.perf_counter()
        obstore.list(loc.store, prefix=loc.key("records"), offset=last_key).collect()
        out["list"].append(time.perf_counter() - t)
        t = time.perf_counter()
        obstore.get(loc.store, last_key).bytes()
        out["get"].append(time.perf_counter() - t)
    raw = {k: statistics.median(v) for k, v in out.items()}
    raw["publication"] = 4 * raw["list"] + 3 * raw["create"]
    return raw


def raw_directory(path: Path, runs: int = 40) -> dict[str, float]:
    """Median seconds of an fsynced 300-byte append and of an atomic 4 KiB batch file."""
    from morphogen.storage.durable import write_atomic

    out: dict[str, list[float]] = {"append": [], "file": []}
    fd = os.open(path / "raw.bin", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for i in range(runs):
            t = time.perf_counter()
            os.write(fd, b"x" * 300)
            os.fsync(fd)
            out["append"].append(time.perf_counter() - t)
            t = time.perf_counter()
            write_atomic(path / f"raw-{i}.bin", [b"y" * 4096])
            out["file"].append(time.perf_counter() - t)
    finally:
        os.close(fd)
    raw = {k: statistics.median(v) for k, v in out.items()}
    raw["publication"] = 2 * raw["append"] + raw["file"]
    return raw


# -- one measurement

def measure(pool, manager, uri: str, writers: int, tag: str, *args) -> dict:
    barrier = manager.Barrier(writers)
    jobs = [pool.apply_async(writer, (uri, args[0], f"{tag}-w{w}", zlib.crc32(tag.encode()) + w,
                                      barrier, *args[1:])) for w in range(writers)]
    done = [j.get(timeout=600) for j in jobs]
    lat, waited, raced = (np.array([x for d in done for x in d[k]])
                          for k in ("latencies", "waited", "raced"))
    wall = max(d["end"] for d in done) - min(d["start"] for d in done)
    tail = lat >= percentile(lat, 98)  # what the slowest publications went through
    return {"median_ms": float(np.median(lat)) * 1e3,
            "p99_ms": percentile(lat, 99) * 1e3, "max_ms": float(lat.max()) * 1e3,
            "publications_per_s": len(lat) / wall,
            "waited_share": float((waited > 0).mean()),
            "tail_reads_busy": float(waited[tail].mean()),
            "tail_races_lost": float(raced[tail].mean()),
            "busy": sum(d.get("busy", 0) for d in done),
            "race_lost": sum(d.get("race_lost", 0) for d in done), "latencies": lat}


KEY = ("length", "backend", "writers", "wait")


def one(pool, manager, s3, work: Path, filled: Path, tag: str, backend: str, writers: int,
        args, wait: str) -> tuple[dict, np.ndarray]:
    """A fresh log filled from `filled`, `writers` writers on it, the raw requests after."""
    if backend == "s3":
        uri = f"s3://{s3.new_bucket('bench')}/log"
        s3_copy(filled, uri)
    else:
        uri = str(work / tag)
        shutil.copytree(filled, uri)
    got = measure(pool, manager, uri, writers, tag, args.count, args.hold_ms / 1e3,
                  args.gap_ms / 1e3, wait, str(filled))
    raw = raw_s3(uri) if backend == "s3" else raw_directory(Path(uri))
    lat = got.pop("latencies")
    raw_ms = raw["publication"] * 1e3
    row = {"backend": backend, "writers": writers, "wait": wait, **got,
           "raw_publication_ms": raw_ms, "median_over_raw": got["median_ms"] / raw_ms,
           "p99_over_raw": got["p99_ms"] / raw_ms,
           **{f"raw_{k}_ms": v * 1e3 for k, v in raw.items() if k != "publication"}}
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, lat


def summarize(rows: list[dict], pooled: dict) -> list[dict]:
    out = []
    for key in sorted({tuple(r[k] for k in KEY) for r in rows}):
        mine = [r for r in rows if tuple(r[k] for k in KEY) == key]

        def med(k: str, mine: list[dict] = mine) -> float:
            return round(statistics.median(r[k] for r in mine), 2)

        lat = np.concatenate(pooled[key])
        out.append({**dict(zip(KEY, key, strict=True)), "runs": len(mine),
                    "median_ms": med("median_ms"), "p99_ms": med("p99_ms"),
                    "p99_pooled_ms": round(percentile(lat, 99) * 1e3, 2),
                    "max_ms": round(float(lat.max()) * 1e3, 2),
                    "publications_per_s": med("publications_per_s"),
                    "raw_publication_ms": med("raw_publication_ms"),
                    "median_over_raw": med("median_over_raw"),
                    "p99_over_raw": med("p99_over_raw"),
                    "waited_share": med("waited_share"),
                    "tail_reads_busy": med("tail_reads_busy"),
                    "tail_races_lost": med("tail_races_lost"),
                    "busy_per_publication": round(sum(r["busy"] for r in mine) / len(lat), 3),
                    "race_lost_per_publication": round(sum(r["race_lost"] for r in mine)
                                                       / len(lat), 3)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="100,1000,3000",
                    help="records in the live generation before a run")
    ap.add_argument("--count", type=int, default=40, help="publications per writer and run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hold-ms", type=float, default=0.0,
                    help="between proposal and decision (the shards' prepare)")
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="after a decision, before the writer's next proposal (the shards' "
                         "commit, the answer, the admin's next request)")
    ap.add_argument("--backends", default="directory,s3")
    ap.add_argument("--waits", default="backoff,fixed",
                    help="two writers' wait for a busy log: the publisher's (backoff), and "
                         "its 250 ms poll before issue 28's fix (fixed)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--name", default="log_contention", help="results file stem")
    args = ap.parse_args(argv)
    if args.quick:
        args.lengths, args.runs = "100,1000", 1
    lengths = [int(x) for x in args.lengths.split(",")]
    # one writer never waits: its wait policy does not matter
    configs = [(1, "backoff"), *((2, w) for w in args.waits.split(","))]
    from tests.s3.server import running_s3_server

    work = Path(tempfile.mkdtemp(prefix="morphogen-logcontention-"))
    rows: list[dict] = []
    pooled: dict[tuple, list] = {}
    ctx = mp.get_context("spawn")  # the S3 server runs in a thread of this process
    try:
        with running_s3_server() as s3:
            os.environ.update(s3.env())  # before the writers start: they inherit it
            manager, pool = ctx.Manager(), ctx.Pool(2)
            filled = {n: template(work, n) for n in lengths}
            # interleaved: the drift of a shared machine hits every configuration alike
            for run in range(args.runs):
                for length in lengths:
                    for writers, wait in configs:
                        for backend in args.backends.split(","):
                            tag = f"r{run}-n{length}-w{writers}-{wait}-{backend}"
                            row, lat = one(pool, manager, s3, work, filled[length], tag,
                                           backend, writers, args, wait)
                            row = {"run": run, "length": length, **row}
                            rows.append(row)
                            pooled.setdefault(tuple(row[k] for k in KEY), []).append(lat)
                            print(json.dumps(row), flush=True)
                save(args, argv, rows, pooled, run + 1)  # each run: a long one may be cut
            pool.terminate()
            manager.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def save(args, argv, rows: list[dict], pooled: dict, runs: int) -> None:
    fields = {k: None for r in rows for k in r}  # the raw requests differ by backend
    write_csv(RESULTS / f"{args.name}.csv", [{**fields, **r} for r in rows])
    result = {"machine": machine_label(), "server": "moto S3 server on loopback",
              "publications_per_writer_and_run": args.count, "runs": runs,
              "hold_ms": args.hold_ms, "gap_ms": args.gap_ms, "lease_s": LEASE_S,
              "command": "python bench/log_contention.py " + " ".join(argv or sys.argv[1:]),
              "summary": summarize(rows, pooled)}
    path = RESULTS / f"{args.name}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
