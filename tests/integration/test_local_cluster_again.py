"""A process that starts a local cluster, stops it and starts another (a benchmark comparing
settings, a driver script that runs twice) gets a working Serve each time: Serve's cached
handle on the first cluster's controller was kept and called on the second ("Can't find
actor")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .cli_process import REPO, cli_env, short_tmp

pytestmark = pytest.mark.slow

SCRIPT = """
import httpx
from cluster import local
from deployments.app import build_app
from ray import serve

for run in range(2):
    with local.running(num_cpus=2, disable_auth=True) as cluster:
        serve.run(build_app({"synthetic_pages": 16, "engine": "cpu", "num_shards": 1,
                             "shard_num_cpus": 0.1, "router_num_cpus": 0.1,
                             "engine_options": {"threads": 1}}),
                  name=f"again{run}", route_prefix=f"/again{run}")
        local.wait_routed([f"{cluster.url}/again{run}"])
        doc = httpx.get(f"{cluster.url}/again{run}/epoch", timeout=30).json()
        print(f"cluster {run}: {sorted(serve.status().applications)} "
              f"{doc['page_pir']['num_pages']} pages", flush=True)
"""


def test_a_second_local_cluster_in_one_process_serves(tmp_path: Path) -> None:
    env = cli_env(tmp_path, RAY_TMPDIR=short_tmp())
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.splitlines() == ["cluster 0: ['again0'] 16 pages",
                                        "cluster 1: ['again1'] 16 pages"]
