"""How long a new router and a new shard replica take to start on an object-store epoch log
that has taken many publications, with a fixed latency added to every request the log sends.

A router reads the log before its first answer (the marker, the last seal, the records after
it); a replica reads it too and replays the batches since the last rotation before it reports
ready. Compaction folds all but the newest updates into one batch and a publication of
updates starts one once enough records piled up (docs/publication.md, "What changed", hole 5),
so both read a bounded number of objects however many publications the log has taken.

The log after N publications (one-page batches, a compaction whenever the publisher would
start one) is written in process through the log's own code (`EpochLog.in_memory()`, the same
records and compactions) and laid out on the S3 server as the object backend lays it out: the
last seal, the records since, the batches they name. Writing 50,000 publications through moto
one request at a time would take hours; the reader's side, measured here, is the real one.
`--uncompacted N` adds a log of N publications and no compaction (what a log of updates only
looked like before), read by the same code and by it one request at a time (the reader before:
`PARALLEL_GETS` and `BATCH_READS` set to 1).

The S3 server (moto) runs in a process of its own, so that its request handling does not
compete with the reader's threads for one interpreter.

    python bench/log_startup.py              # 800, 5,000, 50,000 publications, 20 ms a request
    python bench/log_startup.py --quick      # 800 and 5,000
Results: bench/results/log_startup.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGES = 4096  # the matrix: 16 MiB, one shard


def generate(n: int, base, compact: bool, seed: int):
    """(the in-memory log after `n` publications, how many of its frames the last compaction
    wrote, the seq its seal would have had)."""
    from morphogen.protocol.changes import ChangeBatch
    from morphogen.publication.log import EpochLog, updates_entry

    log = EpochLog.in_memory()
    store = log._store
    sealed = {"frames": 0, "seq": 0}
    real_rewrite = store.rewrite

    def rewrite(state, plan):
        real_rewrite(state, plan)
        sealed.update(frames=len(plan.frames), seq=len(state.entries))

    store.rewrite = rewrite
    rng = np.random.default_rng(seed)
    for i in range(n):
        batch = ChangeBatch(rng.integers(0, PAGES, 1, dtype=np.int64), np.array([True]),
                            rng.integers(0, 256, 4096, np.uint8).tobytes())

        def build(head, seq, batch=batch):
            at = head.epoch_identity() if head is not None else base
            epoch = at.epoch_id + 1
            return updates_entry(epoch, at.epoch_id, batch,
                                 at.after_updates(epoch, batch.digest), seq), batch

        pub = f"p-{i:024x}"  # an admin id's length
        p = log.propose(pub, "updates:" + batch.digest, "bench-publisher", 60.0, build)
        log.decide(p, "commit")
        if compact and log.worth_compacting(read=False):
            log.compact()
    return store, sealed


def lay_out(uri: str, store, sealed: dict) -> int:
    """Write the memory log as the object backend lays it out; returns the objects written."""
    import obstore

    from morphogen.publication.records import new_marker
    from morphogen.storage import open_location
    from morphogen.storage.log_objects import SEAL_MAGIC, _record_key

    loc = open_location(uri)
    frames, k = store._frames, sealed["frames"]
    objects = {"log.json": new_marker()}
    if k:
        objects[_record_key(0, sealed["seq"])] = SEAL_MAGIC + b"".join(frames[:k])
    gen = 1 if k else 0
    for i, f in enumerate(frames[k:]):
        objects[_record_key(gen, k + i)] = f
    for name, data in store._blobs.items():
        objects[f"blobs/{name}"] = data
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: obstore.put(loc.store, loc.key(kv[0]), kv[1]),
                      objects.items()))
    return len(objects)


class Latency:
    """`delay_s` added to every GET and LIST the log sends (obstore's module functions)."""

    def __init__(self, delay_s: float) -> None:
        import obstore

        self.ob, self.delay, self.gets, self.lists = obstore, delay_s, 0, 0
        self.real_get, self.real_list = obstore.get, obstore.list
        self._mutex = threading.Lock()

    def __enter__(self) -> Latency:
        def get(*a, **k):
            time.sleep(self.delay)
            with self._mutex:
                self.gets += 1
            return self.real_get(*a, **k)

        def list_(*a, **k):
            time.sleep(self.delay)
            with self._mutex:
                self.lists += 1
            return self.real_list(*a, **k)

        self.ob.get, self.ob.list = get, list_
        return self

    def __exit__(self, *exc: object) -> None:
        self.ob.get, self.ob.list = self.real_get, self.real_list


def start_router(uri: str, delay_s: float) -> dict:
    from morphogen.publication.log import EpochLog

    with Latency(delay_s) as lat:
        t = time.perf_counter()
        log = EpochLog(uri, create=False)
        state = log.state()
        took = time.perf_counter() - t
    return {"s": took, "gets": lat.gets, "lists": lat.lists, "records": len(state.entries)}


def start_replica(uri: str, snap: Path, delay_s: float) -> dict:
    from morphogen.party.replica import ShardReplica
    from morphogen.party.shard import ShardCore
    from morphogen.publication.log import EpochLog
    from morphogen.snapshot.reader import Snapshot

    with Latency(delay_s) as lat:
        t = time.perf_counter()
        core = ShardCore.open(Snapshot.open(snap), 0, 1, "cpu")
        opened = time.perf_counter() - t
        replica = ShardReplica.start(core, EpochLog(uri, create=False))
        took = time.perf_counter() - t
    replica.close()
    return {"s": took, "open_s": opened, "log_s": took - opened, "gets": lat.gets,
            "lists": lat.lists, "replayed": replica.replayed}


@contextlib.contextmanager
def moto_process():
    """An S3 server on loopback in its own process: its environment for the clients."""
    import boto3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ALLOW_HTTP": "true"}
    try:
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                              aws_access_key_id="bench", aws_secret_access_key="bench")
        for _ in range(100):
            try:
                client.create_bucket(Bucket="startup")
                break
            except Exception:  # noqa: BLE001 - not listening yet
                time.sleep(0.1)
        yield env
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def sequential(on: bool):
    """The reader one request at a time, as it was before (no parallel reads)."""
    from morphogen.publication import log as log_module
    from morphogen.storage import log_objects

    saved = log_objects.PARALLEL_GETS, log_module.BATCH_READS
    if on:
        log_objects.PARALLEL_GETS = log_module.BATCH_READS = 1
    try:
        yield
    finally:
        log_objects.PARALLEL_GETS, log_module.BATCH_READS = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", default="800,5000,50000", help="publications, comma-separated")
    ap.add_argument("--uncompacted", type=int, default=800,
                    help="also a log of this many publications never compacted (0: none)")
    ap.add_argument("--delay-ms", type=float, default=20.0, help="added to every request")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="800 and 5,000 publications")
    ap.add_argument("--out", default=str(RESULTS / "log_startup.json"))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from morphogen.party.shard import ShardCore
    from morphogen.snapshot.reader import Snapshot
    from morphogen.snapshot.synthetic import build_synthetic

    counts = [800, 5000] if args.quick else [int(c) for c in args.counts.split(",")]
    delay = args.delay_ms / 1000
    work = Path(tempfile.mkdtemp(prefix="log-startup-"))
    snap = work / "snap"
    build_synthetic(snap, PAGES, seed=1, epoch_id=1, progress=False)
    warm = ShardCore.open(Snapshot.open(snap), 0, 1, "cpu")  # the kernels compiled once
    base = warm.identity
    warm.close()
    cases = [(n, True, False) for n in counts]
    if args.uncompacted:
        cases[:0] = [(args.uncompacted, False, True), (args.uncompacted, False, False)]
    rows = []
    with moto_process() as env:
        os.environ.update(env)
        bucket = "startup"
        for n, compact, one_by_one in cases:
            t = time.perf_counter()
            store, sealed = generate(n, base, compact, seed=n)
            made = time.perf_counter() - t
            uri = f"s3://{bucket}/{'c' if compact else 'u'}{n}{'s' if one_by_one else ''}/log"
            objects = lay_out(uri, store, sealed)
            with sequential(one_by_one):
                router = [start_router(uri, delay) for _ in range(args.runs)]
                replica = [start_replica(uri, snap, delay) for _ in range(args.runs)]
            row = {
                "publications": n, "compacted": compact, "one_request_at_a_time": one_by_one,
                "delay_ms": args.delay_ms,
                "objects": objects, "generated_s": round(made, 1),
                "seal_bytes": sum(len(f) for f in store._frames[: sealed["frames"]]),
                "router_s": round(statistics.median(r["s"] for r in router), 3),
                "router_gets": router[0]["gets"], "router_lists": router[0]["lists"],
                "router_records": router[0]["records"],
                "replica_s": round(statistics.median(r["s"] for r in replica), 3),
                "replica_open_s": round(statistics.median(r["open_s"] for r in replica), 3),
                "replica_log_s": round(statistics.median(r["log_s"] for r in replica), 3),
                "replica_gets": replica[0]["gets"], "replica_lists": replica[0]["lists"],
                "replayed": replica[0]["replayed"],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": args.runs, "pages": PAGES, "rows": rows}, indent=1)
                   + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
