"""Several replicas per shard on one epoch, on a real local Ray Serve over real HTTP.

Party A runs two replicas of each of its two shards, party B one of each. Clients read pages
the whole time while both parties take 12 update batches and a rotation, and one replica of
A's shard 0 is SIGKILLed in the middle: every page a client accepts is the page of the epoch it
was answered from, and afterwards every replica of every shard serves the log's head.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from morphogen.client import PirClient, PirError
from morphogen.client.admin import AdminClient
from morphogen.snapshot.synthetic import synthetic_pages

from .churn import random_changes
from .conftest import apply_changes, deploy, rotation_snapshots, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TOKEN = "replicas-test-admin-token-0123456789abcdef"
PAGES = 200


class Readers:
    """Client threads reading random pages; each accepted page is checked against the model
    of the epoch its answer names."""

    def __init__(self, url_a: str, url_b: str, models: dict[int, np.ndarray]) -> None:
        self.urls = (url_a, url_b)
        self.models = models
        self.stop = threading.Event()
        self.checked = 0
        self.refused = 0
        self.wrong: list[tuple[int, int]] = []
        self.later: list[tuple[int, bytes]] = []
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(2)]

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        with PirClient(*self.urls, timeout_s=30) as client:
            while not self.stop.is_set():
                try:
                    epoch, pages = client.get_with_epoch([rng.randrange(150) for _ in range(2)])
                except PirError:
                    self.refused += 1  # a 503 while a replica restarts: never a wrong page
                    time.sleep(0.05)
                    continue
                for page in pages:
                    self.checked += 1
                    if epoch not in self.models:
                        # answered before the test recorded the epoch's model (the admin's
                        # answer is still on its way): checked at the end
                        self.later.append((epoch, page))
                    elif not self._known(epoch, page):
                        self.wrong.append((epoch, len(page)))

    def _known(self, epoch: int, page: bytes) -> bool:
        model = self.models[epoch]
        return any(page == model[p].tobytes() for p in range(min(150, model.shape[0])))

    def __enter__(self) -> Readers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        for epoch, page in self.later:
            if epoch not in self.models or not self._known(epoch, page):
                self.wrong.append((epoch, len(page)))


def test_two_replicas_per_shard_stay_on_one_epoch_through_updates_a_rotation_and_a_kill(
        parties, tmp_path: Path) -> None:
    from ray import serve

    snaps, token = rotation_snapshots(tmp_path, PAGES, 170, seed=21, token=TOKEN)
    for name, replicas in (("ra", 2), ("rb", 1)):
        deploy(parties, name, snapshot=str(snaps / "base"), num_shards=2,
               shard_replicas=replicas, admin_token_file=str(token),
               admin_snapshot_dir=str(snaps), epoch_log_dir=str(tmp_path / f"log-{name}"),
               fold_interval_s=0.3, fold_threshold=4, retry_backoff_ms=30.0, scan_attempts=5)
    url_a, url_b = parties.app_url("ra"), parties.app_url("rb")
    rng = random.Random(5)
    model = synthetic_pages(21, 0, PAGES)
    models = {1: model}
    shard0 = serve.get_deployment_handle("shard_0", app_name="ra")
    with AdminClient(url_a, TOKEN) as adm_a, AdminClient(url_b, TOKEN) as adm_b, \
            Readers(url_a, url_b, models) as readers:
        for i in range(12):
            changes = random_changes(rng, model.shape[0])
            model = apply_changes(model, changes)
            out = [adm.updates(changes) for adm in (adm_a, adm_b)]
            assert out[0]["identity"] == out[1]["identity"]
            models[out[0]["epoch_id"]] = model
            if i == 4:
                rot = [adm.snapshot("next") for adm in (adm_a, adm_b)]
                model = synthetic_pages(22, 0, 170)
                models[rot[0]["epoch_id"]] = model
            if i == 7:  # one replica of shard 0 dies; the next publications go on without it
                os.kill(shard0.info.remote().result(timeout_s=30)["pid"], signal.SIGKILL)
            time.sleep(0.2)
        status = adm_a.status()
    head = status["epoch_log_head"]["identity"]

    def every_replica_at_head() -> bool:
        with AdminClient(url_a, TOKEN) as adm:
            shards = adm.status()["shards"]
        return all(len(s["replicas"]) == 2 and {r["identity"] for r in s["replicas"]} == {head}
                   for s in shards)

    assert wait_until(every_replica_at_head, 90, 0.5)
    assert readers.checked > 50 and readers.wrong == []
    print(f"{readers.checked} pages checked, {readers.refused} refusals")
    with PirClient(url_a, url_b, timeout_s=30) as client:
        epoch, got = client.get_with_epoch([0, 84, 85, 169])
    assert epoch == max(models) and got == [model[p].tobytes() for p in (0, 84, 85, 169)]
    serve.delete("ra")
    serve.delete("rb")
