"""A shard replica killed under load: clean errors or right pages, never a wrong page; then
recovery once Serve has replaced the replica."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time

import httpx
import pytest

from morphogen.client import PirClient, PirError, RetryPolicy
from morphogen.protocol.codec import to_hex
from morphogen.protocol.dpf import generate_keys

from .conftest import NUM_PAGES, deploy, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_killed_shard_gives_errors_never_wrong_pages(parties, pages) -> None:
    from ray import serve

    # Short shard timeout and no retry: requests caught in the outage fail (503) instead of
    # waiting for the replacement replica.
    deploy(parties, "k", num_shards=2, shard_timeout_s=1.0, scan_attempts=1)
    shard = serve.get_deployment_handle("shard_1", app_name="k")
    old_pid = shard.info.remote().result()["pid"]

    stop = threading.Event()
    stats = {"ok": 0, "errors": 0, "wrong": 0}
    bad_bodies: list[str] = []
    lock = threading.Lock()

    def load(seed: int) -> None:
        rng = random.Random(seed)
        with PirClient(parties.app_url("k"), parties.app_url("b"), retry=RetryPolicy(attempts=1),
                       timeout_s=30) as c:
            while not stop.is_set():
                wanted = [rng.randrange(NUM_PAGES) for _ in range(3)]
                try:
                    got = c.get(wanted)
                except PirError:
                    outcome = "errors"
                else:
                    outcome = "ok" if got == [pages[p].tobytes() for p in wanted] else "wrong"
                with lock:
                    stats[outcome] += 1

    def raw() -> None:
        body = json.dumps({"keys": [to_hex(generate_keys(10, i)[0].to_bytes())
                                    for i in range(3)]}).encode()
        while not stop.is_set():
            r = httpx.post(parties.app_url("k") + "/query/page/gpu", content=body,
                           headers={"content-type": "application/json"}, timeout=30)
            if r.status_code != 200:
                ok = (r.status_code == 503 and "retry-after" in r.headers
                      and r.json()["error"]["code"] == "unavailable")
                if not ok:
                    bad_bodies.append(f"{r.status_code} {r.text[:200]}")

    threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(3)]
    threads.append(threading.Thread(target=raw, daemon=True))
    for t in threads:
        t.start()
    assert wait_until(lambda: stats["ok"] >= 5, 60), stats
    os.kill(old_pid, signal.SIGKILL)
    time.sleep(4.0)
    stop.set()
    for t in threads:
        t.join(60)
    print("load during the kill:", stats)
    assert stats["wrong"] == 0, stats
    assert stats["ok"] > 0
    assert not bad_bodies, bad_bodies

    # Recovery: a new replica of shard_1 serves, and pages are right again.
    def recovered() -> bool:
        info = shard.info.remote().result(timeout_s=5)
        if info["pid"] == old_pid:
            return False
        with PirClient(parties.app_url("k"), parties.app_url("b")) as c:
            return c.get([3, 333]) == [pages[3].tobytes(), pages[333].tobytes()]

    assert wait_until(recovered, 120, 1.0)
    serve.delete("k")
