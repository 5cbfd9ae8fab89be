"""A fake multi-node autoscaling Ray cluster on this machine (the multi-node test and
`bench/autoscale.py`).

Ray's `fake_multinode` node provider runs the real autoscaler: when tasks or replicas ask for
resources no node has, it starts another raylet on this machine as a new node of a worker type
(here `{"CPU": 1, "GPU": 4}` logical GPUs), and stops it once idle. Everything is started with
`ray start --head` in a session of its own and stopped by that session id: never `ray stop
--force`, which would take down every Ray on the machine (a test session's included).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from cluster.local import listener_port

WORKER_TYPE = "gpu_worker"


@dataclass
class FakeCluster:
    address: str  # GCS address to `ray.init(address=...)`
    session: int  # process session id of every process of the cluster
    temp_dir: str
    config: dict = field(repr=False)

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop every process of the cluster (SIGTERM, then SIGKILL what is left)."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
            pids = session_pids(self.session)
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while session_pids(self.session) and time.monotonic() < deadline:
                time.sleep(0.1)


def session_pids(session: int) -> list[int]:
    """Live processes of a process session (from /proc; this process excluded)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if os.getsid(int(entry.name)) == session:
                stat = (entry / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":  # zombies are dead already
                    pids.append(int(entry.name))
        except (ProcessLookupError, PermissionError, FileNotFoundError):
            continue
    return pids


def cluster_config(port: int, *, head_cpus: float, worker_cpus: float, worker_gpus: int,
                   max_workers: int, idle_timeout_minutes: float) -> dict:
    """The autoscaler's cluster config: a head with no GPU, one worker type with GPUs."""
    return {
        "cluster_name": "morphogen-fake",
        "max_workers": max_workers,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_minutes,
        "provider": {
            "type": "fake_multinode",
            "gcs_address": f"127.0.0.1:{port}",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
        },
        "auth": {"ssh_user": "ubuntu"},
        "docker": {},
        "head_node_type": "ray.head.default",
        "available_node_types": {
            "ray.head.default": {
                "resources": {"CPU": head_cpus},
                "node_config": {},
                "max_workers": 0,
            },
            WORKER_TYPE: {
                "resources": {"CPU": worker_cpus, "GPU": worker_gpus},
                "node_config": {},
                "min_workers": 0,
                "max_workers": max_workers,
            },
        },
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


def start(*, head_cpus: float = 1, worker_cpus: float = 1, worker_gpus: int = 4,
          max_workers: int = 2, idle_timeout_minutes: float = 0.25,
          env: dict[str, str] | None = None) -> FakeCluster:
    """Start the head (no GPU) with the autoscaler; worker nodes come when asked for."""
    temp_dir = tempfile.mkdtemp(prefix="mg-fake-")  # short: Ray's socket paths are limited
    port = listener_port()
    config = cluster_config(port, head_cpus=head_cpus, worker_cpus=worker_cpus,
                            worker_gpus=worker_gpus, max_workers=max_workers,
                            idle_timeout_minutes=idle_timeout_minutes)
    config_path = Path(temp_dir) / "autoscaling.json"
    config_path.write_text(json.dumps(config))
    full_env = dict(os.environ)
    full_env.update({
        "RAY_FAKE_CLUSTER": "1",
        "AUTOSCALER_UPDATE_INTERVAL_S": "1",
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
    })
    full_env.update(env or {})
    ray_cli = str(Path(sys.executable).with_name("ray"))
    cmd = [ray_cli, "start", "--head", f"--port={port}", f"--num-cpus={head_cpus}",
           "--num-gpus=0", f"--autoscaling-config={config_path}", f"--temp-dir={temp_dir}",
           "--include-dashboard=false", "--disable-usage-stats",
           # free ports below the ephemeral range, not Ray's defaults: another Ray may run here
           *(f"--{name}={listener_port()}" for name in (
               "ray-client-server-port", "dashboard-agent-listen-port",
               "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port"))]
    proc = subprocess.Popen(cmd, env=full_env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=180)
    cluster = FakeCluster(f"127.0.0.1:{port}", proc.pid, temp_dir, config)
    if proc.returncode != 0:
        cluster.stop()
        raise RuntimeError(f"ray start failed ({proc.returncode}):\n{out[-4000:]}")
    return cluster
