"""Replica churn at length: reads and publications while router and shard replicas die.

The scenario of tests/integration/test_churn.py (`cluster.churn`), for minutes, on its own local
Ray Serve: two parties (2 shards, 2 router replicas and 2 replicas of every shard each, epoch
logs, an admin token), `--readers` client threads fetching random pages without pause (the
client's default retry policy), an update batch to A then B every `--update-interval` seconds
(re-sent to a party after an error under the same publication id, as `morphogen admin` does), a
snapshot rotation every `--rotation-interval` seconds, and one replica SIGKILLed every
`--kill-interval` seconds: routers and shards of both parties in turn, each party's routers
alternately while they serve a publication (stopped at a step by a failpoint file) and while
they hold reads; a replica is killed only once its deployment runs all its replicas again.

Printed: pages checked (each against the model of the epoch its answer names) and wrong, read
errors that reached a reader, the failures the clients retried, kills, publications and admin
re-sends, the longest time a reader went without a page, and whether both parties ended on the
last acknowledged identity with every replica at its party's log head. Exit status 1 if any of
those failed. Results: bench/results/churn.csv (one row per run).

    python bench/churn.py                                  # 5 minutes, a kill every 20 s
    python bench/churn.py --duration 480 --kill-interval 40 --update-interval 1.5 \\
        --rotation-interval 90 --readers 3                 # the run of issue 21

`--agreement-poll` compares the readers' retry policies in one run: each value (seconds between
/epoch reads while the parties disagree; 0: every backoff slept whole, the client before 0.25 s
polling) runs the same seeded scenario `--rounds` times, alternating, each on a fresh cluster;
printed per value: the median longest outage, pages checked and the queries the readers asked
of party A per page checked (each query is a scan of every page).

    python bench/churn.py --duration 90 --kill-interval 15 --agreement-poll 0 0.25 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import RESULTS, machine_label, write_csv  # noqa: E402
from cluster import local  # noqa: E402
from morphogen.client import RetryPolicy  # noqa: E402
from tests.integration.churn import ChurnPlan, ChurnReport, run  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of churn")
    ap.add_argument("--kill-interval", type=float, default=20.0, help="seconds between kills")
    ap.add_argument("--update-interval", type=float, default=1.5)
    ap.add_argument("--rotation-interval", type=float, default=60.0)
    ap.add_argument("--readers", type=int, default=3)
    ap.add_argument("--pages", type=int, default=512, help="pages of the first snapshot")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quiet", action="store_true", help="no timeline of kills and re-sends")
    ap.add_argument("--agreement-poll", type=float, nargs="+", default=None, metavar="S",
                    help="the readers' RetryPolicy.agreement_poll_s, one or more to compare "
                         "(default: the client's own)")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each --agreement-poll value")
    args = ap.parse_args()
    polls: list[float | None] = list(args.agreement_poll or [None])
    print(f"{machine_label()}; seed {args.seed}, {args.readers} readers, a kill every "
          f"{args.kill_interval:g} s, updates every {args.update_interval:g} s, a rotation "
          f"every {args.rotation_interval:g} s")
    rows, ok = [], True
    for r in range(args.rounds):
        for poll in polls if r % 2 == 0 else polls[::-1]:
            report = _run_once(args, poll)
            if len(polls) > 1 or args.rounds > 1:
                print(f"-- round {r + 1}, agreement poll {_label(poll)}")
            print(report.summary(verbose=not args.quiet))
            rows.append(_row(args, poll, report))
            ok = ok and (not report.read_errors and not report.wrong_pages
                         and not report.admin_failures and report.parties_agree
                         and report.replicas_at_head)
    write_csv(RESULTS / "churn.csv", rows)
    if len(rows) > 1:
        for poll in polls:
            mine = [x for x in rows if x["agreement_poll_s"] == _label(poll)]
            print(f"agreement poll {_label(poll)}: medians of {len(mine)} runs: longest outage "
                  + _median(mine, "longest_outage_s") + " s, pages checked "
                  + _median(mine, "pages_checked") + ", queries asked of A a page checked "
                  + _median(mine, "queries_a_per_page"))
    return 0 if ok else 1


def _run_once(args: argparse.Namespace, poll: float | None) -> ChurnReport:
    plan = ChurnPlan(
        seed=args.seed, duration_s=args.duration, kill_interval_s=args.kill_interval,
        update_interval_s=args.update_interval, rotation_interval_s=args.rotation_interval,
        readers=args.readers, pages=args.pages,
        rotation_pages=(args.pages * 3 // 4, args.pages * 5 // 4),
        retry=None if poll is None else RetryPolicy(agreement_poll_s=poll),
    )
    common = {
        "engine": "cpu", "engine_options": {"threads": 1}, "shard_num_cpus": 0.1,
        "router_num_cpus": 0.1, "graceful_shutdown_timeout_s": 0.5,
        "health_check_period_s": 1.0, "health_check_timeout_s": 10.0,
    }
    # a short path: Ray's unix sockets live under it (108-byte limit)
    with tempfile.TemporaryDirectory(prefix="mgchurn", dir="/tmp") as tmp:
        root = Path(tmp)
        with local.running(num_cpus=4, disable_auth=True, temp_dir=str(root / "ray")) as cluster:
            return run(cluster.url, root / "work", plan, common)


def _label(poll: float | None) -> str:
    return "default" if poll is None else f"{poll:g}"


def _row(args: argparse.Namespace, poll: float | None, report: ChurnReport) -> dict:
    routers = sum(k.deployment == "router" for k in report.kills)
    return {
        "machine": machine_label(), "seed": args.seed, "duration_s": round(report.elapsed_s),
        "kill_interval_s": args.kill_interval, "readers": args.readers,
        "agreement_poll_s": _label(poll),
        "pages_checked": report.pages_checked, "wrong_pages": len(report.wrong_pages),
        "read_errors": len(report.read_errors), "kills": len(report.kills),
        "router_kills": routers, "shard_kills": len(report.kills) - routers,
        "publications": report.publications, "rotations": report.rotations,
        "admin_resends": report.admin_resends, "admin_failures": len(report.admin_failures),
        "longest_outage_s": round(report.longest_outage_s, 2),
        "queries_a": report.queries_a, "epoch_reads_a": report.epoch_reads_a,
        "queries_a_per_page": round(report.queries_a / max(1, report.pages_checked), 3),
        "one_identity": report.parties_agree, "replicas_at_head": report.replicas_at_head,
    }


def _median(rows: list[dict], key: str) -> str:
    return f"{statistics.median(float(x[key]) for x in rows):g}"


if __name__ == "__main__":
    raise SystemExit(main())
