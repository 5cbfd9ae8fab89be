"""A party whose snapshot, rotations and epoch log all live in object storage (a loopback S3
server), with two replicas per shard: nothing shared on disk but each node's chunk cache."""

from __future__ import annotations

import httpx
import numpy as np
import obstore
import pytest

from morphogen.publication.log import EpochLog
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages
from morphogen.storage import open_location
from tests.integration.conftest import delete_apps, deploy, wait_until

pytestmark = [pytest.mark.ray]

TOKEN = "object-storage-token-0123456789"
PAGES, NEXT_PAGES = 300, 340


def upload(local, uri: str) -> None:
    loc = open_location(uri)
    for f in ("manifest.json", "pages.bin"):
        obstore.put(loc.store, loc.key(f), (local / f).read_bytes())


@pytest.fixture(scope="module")
def party(serve_instance, s3_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("s3party")
    bucket = s3_server.new_bucket("party")
    for name, pages, seed in (("base", PAGES, 21), ("next", NEXT_PAGES, 22)):
        build_synthetic(root / name, pages, seed=seed, epoch_id=1, progress=False,
                        chunk_pages=32)
        upload(root / name, f"s3://{bucket}/snapshots/{name}")
    (root / "token").write_text(TOKEN)
    deploy(serve_instance, "s3a", snapshot=f"s3://{bucket}/snapshots/base", num_shards=2,
           shard_replicas=2, admin_token_file=str(root / "token"),
           admin_snapshot_dir=f"s3://{bucket}/snapshots",
           epoch_log_dir=f"s3://{bucket}/logs/a",
           snapshot_cache_dir=str(root / "node-cache"))
    deploy(serve_instance, "s3b", snapshot=f"s3://{bucket}/snapshots/base", num_shards=1,
           admin_token_file=str(root / "token"), admin_snapshot_dir=f"s3://{bucket}/snapshots",
           epoch_log_dir=f"s3://{bucket}/logs/b",
           snapshot_cache_dir=str(root / "node-cache"))
    yield {"bucket": bucket, "root": root,
           "urls": [serve_instance.app_url("s3a"), serve_instance.app_url("s3b")]}
    delete_apps("s3a", "s3b")


def _check(urls, model: np.ndarray, wanted: list[int]) -> int:
    from morphogen.client import PirClient

    with PirClient(*urls, encoding="msgpack") as c:
        epoch, got = c.get_with_epoch(wanted)
    for p, page in zip(wanted, got, strict=True):
        assert page == model[p].tobytes(), p
    return epoch


def test_pages_updates_and_a_rotation_all_through_object_storage(party) -> None:
    from morphogen.client.admin import AdminClient, publish_to_parties

    urls, bucket = party["urls"], party["bucket"]
    model = synthetic_pages(21, 0, PAGES).copy()
    rng = np.random.default_rng(3)
    assert _check(urls, model, [0, 1, 150, 299, 33, 64]) == 1
    # the node's cache holds only what the shards' ranges needed: both replicas of each shard
    # found the chunks there, every one of them verified
    cached = sorted(p.name for p in (party["root"] / "node-cache").glob("*/chunk-*"))
    assert cached == [f"chunk-{i:06d}" for i in range(10)]

    admins = [AdminClient(u, TOKEN) for u in urls]
    try:
        changes = [(int(p), "data", rng.integers(0, 256, 4096, np.uint8).tobytes())
                   for p in rng.choice(PAGES, 5, replace=False)]
        out = publish_to_parties(admins, lambda c: c.updates(changes, "s3-upd-1"))
        assert [r["epoch_id"] for r in out] == [2, 2]
        for p, _, data in changes:
            model[p] = np.frombuffer(data, np.uint8)
        assert _check(urls, model, [p for p, _, _ in changes][:3]) == 2
        # rotation by URI, under the allowed prefix; one outside it is refused
        with pytest.raises(Exception, match="outside the allowed snapshot prefix"):
            admins[0].snapshot(f"s3://{bucket}/elsewhere/next", "s3-bad")
        out = publish_to_parties(admins, lambda c: c.snapshot("next", "s3-rot-1"))
        assert {r["epoch_id"] for r in out} == {3}
    finally:
        for a in admins:
            a.close()
    model = synthetic_pages(22, 0, NEXT_PAGES)
    wait_until(lambda: _check_quiet(urls, model), 30)
    assert _check(urls, model, [0, 200, 339, 5]) == 3
    # the log lives only in the bucket: the decided history, each publication once
    log = EpochLog(f"s3://{bucket}/logs/a", create=False)
    assert [e.pub for e in log.live()] == ["s3-rot-1"]
    assert log.compact() == 0  # the publisher compacted after the committed rotation


def _check_quiet(urls, model) -> bool:
    try:
        _check(urls, model, [0, 339])
        return True
    except (AssertionError, httpx.HTTPError, Exception):  # noqa: BLE001 - until it holds
        return False


def test_a_snapshot_that_cannot_be_fetched_fails_the_deployment_loudly(serve_instance,
                                                                       s3_server) -> None:
    from ray import serve

    from deployments.app import build_app
    from tests.integration.conftest import party_args

    bucket = s3_server.new_bucket("missing")
    with pytest.raises(Exception, match="no snapshot manifest"):
        serve.run(build_app(party_args(serve_instance.cache_dir,
                                       snapshot=f"s3://{bucket}/none")),
                  name="s3missing", route_prefix="/s3missing")


def test_every_replica_reports_its_start_and_admin_status_shows_what_is_unsettled(
        party) -> None:
    """Each shard replica posts its start to the board the operator reads (`serve` while it
    deploys, `/admin/status` afterwards): its node and time to ready; a replica that fails
    later is shown by the status with its reason, in one line."""
    from deployments import start_board
    from morphogen.client.admin import AdminClient

    board = start_board.read("s3a")
    ready = [d for d in board if d["state"] == "ready"]
    assert sorted(d["deployment"] for d in ready) == ["shard_0"] * 2 + ["shard_1"] * 2
    assert all(len(d["node"]) >= 16 and d["seconds"] > 0 for d in ready)
    admin = AdminClient(party["urls"][0], TOKEN)
    try:
        assert admin.status()["replica_starts"] == []
        start_board.post("s3a", "shard_1", "later-replica", {
            "state": "failed", "node": "n" * 56,
            "reason": f"node x: s3://{party['bucket']}/snapshots/base chunk 3: no space left"})
        starts = admin.status()["replica_starts"]
    finally:
        admin.close()
    assert [s["replica"] for s in starts] == ["later-replica"]
    assert starts[0]["line"] == (f"shard_1 on node {'n' * 16}: failed to start: node x: "
                                 f"s3://{party['bucket']}/snapshots/base chunk 3: no space left")


def test_a_replica_killed_while_the_store_is_down_restarts_from_the_node_cache(
        serve_instance, s3_server, tmp_path_factory) -> None:
    """The shards reach the store through a gate that then goes down; a shard replica SIGKILLed
    meanwhile is restarted by Serve from the node's verified cache (the manifest that URI named
    and the chunks it held), without its epoch log, and the party answers right throughout."""
    import os
    import signal
    import time

    from ray import serve

    from deployments import start_board
    from morphogen.client import PirClient
    from tests.s3.gate import DOWN, OPEN, gate_to

    root = tmp_path_factory.mktemp("s3gate")
    bucket = s3_server.new_bucket("gate")
    build_synthetic(root / "base", PAGES, seed=23, epoch_id=1, progress=False, chunk_pages=32)
    upload(root / "base", f"s3://{bucket}/snapshots/base")
    model = synthetic_pages(23, 0, PAGES)
    with gate_to(s3_server.endpoint, OPEN) as gate:
        deploy(serve_instance, "s3gate", snapshot=f"s3://{bucket}/snapshots/base",
               num_shards=1, shard_replicas=2, epoch_log_dir=f"s3://{bucket}/logs/g",
               snapshot_cache_dir=str(root / "node-cache"), scan_attempts=4,
               shard_runtime_env={"env_vars": {"AWS_ENDPOINT_URL": gate.endpoint,
                                               "MORPHOGEN_STORE_RETRY_S": "1",
                                               "MORPHOGEN_STORE_OUTAGE_S": "2"}})
        url = serve_instance.app_url("s3gate")
        try:
            with PirClient(url, url, encoding="msgpack") as c:
                assert c.get([0, 150, 299]) == [model[p].tobytes() for p in (0, 150, 299)]
            gate.set(DOWN)
            shard = serve.get_deployment_handle("shard_0", app_name="s3gate")
            killed_at = time.time()
            os.kill(shard.info.remote().result(timeout_s=30)["pid"], signal.SIGKILL)

            def restarted() -> bool:
                return any(d["state"] == "ready" and d["at"] > killed_at
                           for d in start_board.read("s3gate"))

            assert wait_until(restarted, 90), start_board.read("s3gate")
            assert not [d for d in start_board.read("s3gate", killed_at)
                        if d["state"] == "failed"]
            for _ in range(6):  # either replica may answer; never a wrong page
                with PirClient(url, url, encoding="msgpack") as c:
                    assert c.get([1, 100, 298]) == [model[p].tobytes() for p in (1, 100, 298)]
        finally:
            gate.set(OPEN)
            serve.delete("s3gate")
