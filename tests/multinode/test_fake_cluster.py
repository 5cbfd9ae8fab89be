"""A party on a real multi-node Ray cluster: Ray's fake multi-node provider on this machine.

The head has no GPU; the real Ray autoscaler adds worker nodes of 4 logical GPUs (0..2) when
shard replicas (`placement: gpu`, one GPU each, CPU engine) wait for one. `bench/autoscale.py
--quick` runs the scenario in a process of its own (this test session may hold another Ray):
load rises, the router and the shards scale up, nodes are added, update batches and a rotation
are published meanwhile, then the load stops and everything scales back down. Every page a
client accepted was checked against the matrix of the epoch its answer named.

No node sees the snapshots or the epoch logs on a disk: they live only in an S3 bucket (a
protocol server on loopback), each node fetches its shards' chunks into a cache directory of
its own, and the admin token comes from the environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("autoscale") / "result.json"
    # none of this session's Ray settings (another Ray may run in this process: its address,
    # temp dir and Serve flags must not leak into the fake cluster)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=str(ROOT), RAY_AUTH_MODE="disabled")
    # a hang guard, not a time limit: on a 2-core CI machine, beside the suite's other
    # workers, the scenario has taken 438 s
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "autoscale.py"), "--quick", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_load_adds_nodes_and_replicas_that_land_on_them(scenario) -> None:
    s = scenario["summary"]
    assert s["worker_nodes_max"] > s["worker_nodes_start"] >= 1
    # from 1 and 2; the high step was held until a shard scaled (or for at most 3 minutes)
    assert s["router_replicas_max"] >= 2 and s["shard_replicas_max"] >= 3, s
    assert s["seconds_to_new_shard_replica"] is not None
    assert s["replicas_on_head_node"] == 0  # the head has no GPU: shards only on workers
    assert s["replica_nodes"]
    # every node a shard replica served from fetched into a cache of its own (nothing
    # shared on disk), and exactly the chunks of the shards that ran there
    assert set(s["replica_nodes"]) <= set(s["node_caches"]), s
    assert len(s["node_caches"]) >= 2  # a worker added by the autoscaler has its own
    per_node = s["node_chunks"]
    assert set(s["node_caches"]) <= set(per_node)
    for node, roots in per_node.items():
        for root, chunks in roots.items():
            # a chunk no replica of the node needed would be another node's fetch
            assert set(chunks["has"]) <= set(chunks["expected"]), (node, root, chunks)
            # what the node's replicas fetched as they started was of their own shards (not
            # "still in the cache": a snapshot no process holds is evicted, and fetched again)
            assert set(chunks["fetched"]) <= set(chunks["expected"]), (node, root, chunks)
        # and every node that ran a shard replica fetched for itself: with one directory
        # for all nodes, a node added later would find every chunk there and fetch none
        if node in s["replica_nodes"]:
            assert any(c["fetched"] for c in roots.values()), (node, roots)


def test_publications_during_the_load_reach_every_replica_and_no_page_is_wrong(scenario) -> None:
    s = scenario["summary"]
    assert "error" not in s["published"], s["published"]
    assert s["published"]["rotation_epoch"] and s["published"]["head"]
    assert s["every_replica_at_head"] is True
    assert max(s["replicas_when_published"].values()) >= 1
    assert s["checked_pages"] > 100 and s["wrong_pages"] == 0


def test_it_scales_back_down_after_the_load(scenario) -> None:
    s = scenario["summary"]
    assert s["seconds_to_scale_down"] is not None
    last = scenario["rows"][-1]
    assert last["threads"] == 0
