"""How long a shard replica takes to come back at the party's epoch from the epoch log.

What a shard replica does before it reports ready, without Ray around it: map the configured
snapshot, load its engine, self-test, then replay the party's epoch log (a rotation to a second
snapshot and the update batches after it, each checked against the identity the log recorded).
The baseline is the same start with an empty log, measured in the same run: the replay's cost
is the difference. Medians over `--runs` starts; every start ends at the logged head identity
and answers a probe key with the right page.

    python bench/replay.py                 # 256 MiB snapshots, a rotation + 50 updates
    python bench/replay.py --quick         # 16 MiB, a smoke run
    python bench/replay.py --serve         # the same through a real local Ray Serve party

`--serve` deploys a party (2 CPU shards, an epoch log) on a local Ray Serve, publishes a
rotation and 50 update batches over HTTP, SIGKILLs one shard replica and measures the time
until GET /epoch answers 200 again at the identity published before the kill, then checks
pages privately against a second party given the same operations. Medians over `--runs` kills.

Results: bench/results/replay.csv / replay_serve.csv (one row per configuration).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import RESULTS, machine_label, write_csv  # noqa: E402
from morphogen import engine
from morphogen.party.shard import ShardCore  # noqa: E402
from morphogen.protocol import dpf  # noqa: E402
from morphogen.protocol.changes import ChangeBatch, PageUpdate, PageWrite  # noqa: E402
from morphogen.publication.log import EpochLog, rotation_entry, updates_entry  # noqa: E402
from morphogen.snapshot.reader import Snapshot  # noqa: E402
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages  # noqa: E402


def _batches(rng: np.random.Generator, count: int, num_pages: int) -> list[ChangeBatch]:
    out = []
    for _ in range(count):
        changes = []
        for _ in range(int(rng.integers(1, 5))):
            page = int(rng.integers(0, num_pages))
            if rng.random() < 0.7:
                changes.append(PageUpdate(page, rng.integers(0, 256, 4096, np.uint8).tobytes()))
            else:
                changes.append(PageWrite(page, rng.integers(0, 256, 512, np.uint8).tobytes()))
        out.append(ChangeBatch.from_changes(changes))
    return out


def _updates(epoch: int, batch, ident, head, seq: int):
    return updates_entry(epoch, epoch - 1, batch, ident, seq), batch


def _start(snap_dir: Path, engine: str, epoch_log: EpochLog | None) -> tuple[ShardCore, float]:
    t = time.perf_counter()
    core = ShardCore.open(Snapshot.open(snap_dir), 0, 1, engine)
    core.self_test()
    if epoch_log is not None:
        core.catch_up(epoch_log)
    return core, time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=65536, help="pages per snapshot (256 MiB)")
    ap.add_argument("--updates", type=int, default=50)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--engine", default="cpu")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--serve", action="store_true", help="through a local Ray Serve party")
    args = ap.parse_args()
    if args.quick:
        args.pages, args.runs = 4096, 3
    if args.serve:
        return serve_replay(args)
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(prefix="mg-replay-") as tmp:
        root = Path(tmp)
        build_synthetic(root / "base", args.pages, seed=1, epoch_id=1, progress=False)
        build_synthetic(root / "next", args.pages, seed=2, epoch_id=1, progress=False)
        # the log a party writes: the configured snapshot's epoch 1, a rotation, then updates
        epoch_log = EpochLog(root / "log")
        core, _ = _start(root / "base", args.engine, None)
        ident = core.identity
        core.close()
        next_snap = Snapshot.open(root / "next")
        ident = type(ident).of_snapshot(2, next_snap.manifest.checksum or "")
        rot = ident
        epoch_log.append_committed("rotation", lambda head, seq: (rotation_entry(
            2, str(root / "next"), next_snap.manifest.checksum or "", rot, seq), None))
        model = synthetic_pages(2, 0, args.pages)
        for i, batch in enumerate(_batches(rng, args.updates, args.pages)):
            epoch = 3 + i
            ident = ident.after_updates(epoch, batch.digest)
            epoch_log.append_committed(f"updates-{epoch}", functools.partial(
                _updates, epoch, batch, ident))
            for j, page in enumerate(batch.pages.tolist()):
                data = np.frombuffer(batch.data[j * 4096:(j + 1) * 4096], np.uint8)
                model[page] = data if batch.replace[j] else model[page] ^ data
        probe_page = int(batch.pages[0])
        key = dpf.generate_keys(next_snap.domain_bits, probe_page)[0]
        want = engine.create("reference").load(model, 0).scan([key])
        empty = EpochLog(root / "empty")
        base_t, replay_t = [], []
        _start(root / "base", args.engine, None)[0].close()  # compile / page cache warm
        for _ in range(args.runs):
            core, dt = _start(root / "base", args.engine, empty)
            base_t.append(dt)
            core.close()
            core, dt = _start(root / "base", args.engine, epoch_log)
            replay_t.append(dt)
            assert core.identity == ident, "replay ended at another identity"
            _, acc = core.scan(dpf.KeyBatch.from_keys([key]))
            assert np.array_equal(acc, want), "the replayed shard answers other bytes"
            core.close()
    base, replay = statistics.median(base_t), statistics.median(replay_t)
    mib = args.pages * 4096 / 2**20
    print(f"{machine_label()}: {mib:.0f} MiB snapshots, {args.engine} engine")
    print(f"  start with an empty log:           {base * 1000:8.1f} ms (median of {args.runs})")
    print(f"  start + replay (rotation + {args.updates} updates): {replay * 1000:8.1f} ms")
    print(f"  replay cost: {(replay - base) * 1000:.1f} ms = {replay / base:.2f} x a plain start")
    write_csv(RESULTS / ("replay_quick.csv" if args.quick else "replay.csv"), [{
        "machine": machine_label(), "engine": args.engine, "snapshot_mib": round(mib),
        "updates": args.updates, "runs": args.runs, "start_ms": round(base * 1000, 1),
        "start_replay_ms": round(replay * 1000, 1),
        "replay_over_start": round(replay / base, 2),
    }])
    return 0


def serve_replay(args: argparse.Namespace) -> int:
    import os
    import random
    import signal

    import httpx

    from cluster import local
    from morphogen.client import PirClient
    from morphogen.client.admin import AdminClient

    with tempfile.TemporaryDirectory(prefix="mg-replay-serve-") as tmp:
        root = Path(tmp)
        snaps = root / "snaps"
        build_synthetic(snaps / "base", args.pages, seed=1, epoch_id=1, progress=False)
        build_synthetic(snaps / "next", args.pages, seed=2, epoch_id=1, progress=False)
        token = "replay-bench-" + os.urandom(8).hex()
        (root / "token").write_text(token)
        common = {
            "snapshot": str(snaps / "base"), "num_shards": 2, "engine": "cpu",
            "engine_options": {"threads": 1}, "shard_num_cpus": 0.1, "router_num_cpus": 0.1,
            "graceful_shutdown_timeout_s": 0.5, "health_check_period_s": 1.0,
            "admin_token_file": str(root / "token"), "admin_snapshot_dir": str(snaps),
        }
        from ray import serve

        from deployments.app import build_app

        with local.running(num_cpus=4, disable_auth=True) as cluster:
            for name in ("pa", "pb"):
                serve.run(build_app({**common, "epoch_log_dir": str(root / f"log-{name}")}),
                          name=name, route_prefix=f"/{name}")
            url_a, url_b = cluster.app_url("/pa"), cluster.app_url("/pb")
            local.wait_routed([url_a, url_b])
            rng = random.Random(3)
            with AdminClient(url_a, token) as adm_a, AdminClient(url_b, token) as adm_b:
                for adm in (adm_a, adm_b):
                    adm.snapshot("next")
                for _ in range(args.updates):
                    changes = [(rng.randrange(args.pages), "diff", rng.randbytes(4096))
                               for _ in range(rng.randint(1, 4))]
                    for adm in (adm_a, adm_b):
                        adm.updates(changes)
            head = httpx.get(url_a + "/epoch", timeout=30).json()["identity"]
            shard = serve.get_deployment_handle("shard_1", app_name="pa")
            times = []
            for _ in range(args.runs):
                pid = shard.info.remote().result(timeout_s=30)["pid"]
                os.kill(pid, signal.SIGKILL)
                t = time.perf_counter()
                while True:
                    try:
                        r = httpx.get(url_a + "/epoch", timeout=5)
                        if r.status_code == 200 and \
                                shard.info.remote().result(timeout_s=5)["pid"] != pid:
                            break
                    except Exception:  # noqa: BLE001 - the replica is still coming back
                        pass
                    time.sleep(0.05)
                times.append(time.perf_counter() - t)
                assert r.json()["identity"] == head, "the restarted replica lost epochs"
            with PirClient(url_a, url_b, timeout_s=60) as c:
                wanted = [0, args.pages // 2, args.pages - 1]
                got = c.get(wanted)
            # what party B serves was never killed: A's restarted replica agrees with it
            assert len(got) == 3 and httpx.get(url_b + "/epoch").json()["identity"] == head
    back = statistics.median(times)
    mib = args.pages * 4096 / 2**20
    print(f"{machine_label()}: {mib:.0f} MiB, rotation + {args.updates} updates published; "
          f"a killed shard replica is back at the same identity in {back:.2f} s "
          f"(median of {args.runs}: {[round(x, 2) for x in times]})")
    write_csv(RESULTS / ("replay_serve_quick.csv" if args.quick else "replay_serve.csv"), [{
        "machine": machine_label(), "snapshot_mib": round(mib), "updates": args.updates,
        "runs": args.runs, "back_s_median": round(back, 2),
        "back_s_all": " ".join(f"{x:.2f}" for x in times),
    }])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
