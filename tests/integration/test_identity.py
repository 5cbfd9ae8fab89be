"""Never a wrong page, on a real local Ray Serve over real HTTP:

* a snapshot rebuilt in place under the same epoch id, then a shard replica restarted: the
  restarted replica's partials name other data, so the party refuses (503), never XORs them;
* a shard replica killed after 50 updates and a rotation: it replays the party's epoch log
  before it reports ready and comes back at the same identity; every page right.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import httpx
import pytest

from morphogen.client import PirClient, PirError
from morphogen.client.admin import AdminClient
from morphogen.protocol.dpf import generate_keys
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages

from .churn import random_changes
from .conftest import apply_changes, deploy, rotation_snapshots, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TOKEN = "identity-test-admin-token-0123456789abcdef"
PAGES = 300


def _kill_and_wait(app: str, shard: str) -> float:
    """SIGKILL the shard's replica; seconds until a new one answers."""
    from ray import serve

    handle = serve.get_deployment_handle(shard, app_name=app)
    old = handle.info.remote().result(timeout_s=30)["pid"]
    os.kill(old, signal.SIGKILL)
    killed = time.monotonic()

    def replaced() -> bool:
        return handle.info.remote().result(timeout_s=5)["pid"] != old

    assert wait_until(replaced, 120, 0.2)
    return time.monotonic() - killed


def _epoch(url: str) -> httpx.Response:
    return httpx.get(url + "/epoch", timeout=30)


def test_rebuilt_snapshot_under_the_same_epoch_is_refused_not_served(parties, tmp_path) -> None:
    from ray import serve

    snap = tmp_path / "inplace"
    build_synthetic(snap, PAGES, seed=5, epoch_id=1, progress=False)
    deploy(parties, "same", snapshot=str(snap), num_shards=2, scan_attempts=2,
           retry_backoff_ms=10.0)
    url = parties.app_url("same")
    before = _epoch(url).json()
    assert before["epoch_id"] == 1 and before["identity"].startswith("0x")
    # `morphogen build --epoch 1` over the same directory (only with --force now)
    build_synthetic(snap, PAGES, seed=6, epoch_id=1, progress=False, overwrite=True)
    _kill_and_wait("same", "shard_1")
    # shard 0 serves the old mapping, shard 1 the new file, both "epoch 1": never combined
    r = _epoch(url)
    assert r.status_code == 503, r.text
    body = {"keys": ["0x" + generate_keys(9, p)[0].to_bytes().hex() for p in (1, 2, 3)]}
    r = httpx.post(url + "/query/page/gpu", json=body, timeout=30)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "unavailable" and "retry-after" in r.headers
    serve.delete("same")


def test_restarted_shard_replays_50_updates_and_a_rotation(parties, tmp_path: Path) -> None:
    from ray import serve

    snaps, token = rotation_snapshots(tmp_path, PAGES, 260, seed=7, token=TOKEN)
    for name, shards in (("la", 3), ("lb", 2)):
        deploy(parties, name, snapshot=str(snaps / "base"), num_shards=shards,
               admin_token_file=str(token), admin_snapshot_dir=str(snaps),
               epoch_log_dir=str(tmp_path / f"log-{name}"), fold_interval_s=0.2,
               fold_threshold=8, fold_chunk_pages=32, retry_backoff_ms=20.0)
    url_a, url_b = parties.app_url("la"), parties.app_url("lb")
    rng = random.Random(4)
    model = synthetic_pages(7, 0, PAGES)
    with AdminClient(url_a, TOKEN) as adm_a, AdminClient(url_b, TOKEN) as adm_b:
        for i in range(50):
            changes = random_changes(rng, model.shape[0])
            out = [adm.updates(changes) for adm in (adm_a, adm_b)]
            assert out[0]["identity"] == out[1]["identity"]  # same operations, same data
            model = apply_changes(model, changes)
            if i == 29:
                rot = [adm.snapshot("next") for adm in (adm_a, adm_b)]
                assert rot[0]["identity"] == rot[1]["identity"]
                model = synthetic_pages(8, 0, 260)
    head = _epoch(url_a).json()
    assert head["epoch_id"] == 52 and head["identity"] == _epoch(url_b).json()["identity"]

    seconds = _kill_and_wait("la", "shard_1")
    after = _epoch(url_a)
    assert after.status_code == 200 and after.json()["identity"] == head["identity"]
    print(f"shard replica back after 50 updates and a rotation in {seconds:.1f}s")
    wanted = [0, 86, 87, 172, 173, 259]
    with PirClient(url_a, url_b, timeout_s=30) as c:
        assert c.get(wanted) == [model[p].tobytes() for p in wanted]
    with pytest.raises(PirError):  # the rotation shrank the matrix: 260 pages now
        with PirClient(url_a, url_b, timeout_s=30) as c:
            c.get([270])
    serve.delete("la")
    serve.delete("lb")
