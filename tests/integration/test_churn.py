"""Reads and publications through replica deaths, end to end on a real local Ray Serve.

Two parties (2 shards, 2 router replicas and 2 replicas of every shard each, epoch logs, an
admin token) serve two readers the whole time, take an update batch to A then B every 1.5 s
(re-sent to a party after an error under the same id) and two snapshot rotations, while six
router and shard replicas of both parties are SIGKILLed (`cluster.churn`, seeded): each party's
router once while it serves a publication (stopped after the proposal or the prepares by the
party's failpoint file) and a router once while it holds reads. Afterwards: no read error
reached a reader (they use the client's default retry policy), no page differs from the model
of the epoch its answer names, no publication failed or was applied twice, both parties serve
and have logged the last acknowledged publication, every replica is back at its party's head,
and no reader went longer than OUTAGE_BOUND_S without a successful read.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .churn import ChurnPlan, run
from .conftest import party_args

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# The longest a reader may go without a page. A read rides out a replica's death by retrying
# (the default policy sleeps 10.5 to 21 s before it gives up); the worst case here is a router
# of B killed mid-publication (after the prepares): A serves the next epoch until B's re-send
# takes over after the dead router's lease (admin_lease_s, 5 s) and publishes.
OUTAGE_BOUND_S = 15.0


def test_reads_and_publications_survive_killed_routers_and_shards_of_both_parties(
        serve_instance, tmp_path: Path) -> None:
    plan = ChurnPlan(seed=7, duration_s=36.0, kill_interval_s=6.0, min_kills=6,
                     update_interval_s=1.5, rotation_interval_s=12.0, readers=2, pages=200,
                     settle_s=60.0, min_publications=10, min_rotations=2)
    common = party_args(serve_instance.cache_dir, retry_backoff_ms=30.0, scan_attempts=5,
                        fold_interval_s=0.3, fold_threshold=4)
    report = run(serve_instance.url, tmp_path, plan, common)
    print(report.summary())
    kills = {(k.app, k.deployment == "router", k.when) for k in report.kills}
    assert {(app, when.startswith("at ")) for app, router, when in kills if router} >= {
        ("churn-a", True), ("churn-b", True)}, report.kills
    assert any(when == "holding reads" for _, _, when in kills), report.kills
    assert {app for app, router, _ in kills if not router} == {"churn-a", "churn-b"}
    assert report.rotations >= 2 and report.publications >= 10
    assert report.admin_resends >= 2  # the two publications whose router died under them
    assert report.pages_checked > 200
    assert report.read_errors == []
    assert report.wrong_pages == []
    assert report.admin_failures == []
    assert report.parties_agree and report.replicas_at_head
    assert report.longest_outage_s < OUTAGE_BOUND_S, report.summary()
