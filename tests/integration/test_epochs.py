"""Epochs that never mix: live page updates and snapshot rotations under continuous private
queries, checked page by page against a model of every epoch; refused snapshots; admin auth.

Two fresh parties (3 and 2 shards) get the same 100 update batches and 3 rotations (one to
another page count, one to another key domain) in the same order while client threads fetch
pages through `PirClient`. Every answer a client accepts must equal the model's page in the
epoch the answer names; a request may only fail with a retryable status.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from morphogen.client import (
    PageOutOfRange,
    PirClient,
    PirError,
    PirUnavailable,
    RetryPolicy,
)
from morphogen.client.admin import AdminClient
from morphogen.snapshot.layout import domain_bits_for
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages

from .conftest import NUM_PAGES, deploy, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

TOKEN = "epoch-test-admin-token-0123456789abcdef"
BASE_SEED = 11  # conftest's synthetic snapshot
# (name, seed, pages, manifest epoch): 600 pages change the page count, 1100 the domain
ROTATIONS = [("rot1", 31, NUM_PAGES, 0), ("rot2", 32, 600, 200), ("rot3", 33, 1100, 0)]
ASK_BELOW = 600  # pages every epoch has
TAIL = (600, NUM_PAGES)  # pages the 600-page epochs lack: one client asks only these
UPDATE_BATCHES = 100
ROTATE_AT = {25: 0, 50: 1, 75: 2}
CLIENT_THREADS = 4


class Model:
    """Every epoch's matrix: a base page array and the pages changed since it."""

    def __init__(self, epoch: int, base: np.ndarray) -> None:
        self.versions: dict[int, tuple[np.ndarray, dict[int, bytes]]] = {epoch: (base, {})}
        self.current = epoch

    def page(self, epoch: int, page: int) -> bytes:
        base, changed = self.versions[epoch]
        got = changed.get(page)
        return got if got is not None else base[page].tobytes()

    def num_pages(self) -> int:
        return int(self.versions[self.current][0].shape[0])

    def apply(self, epoch: int, changes: list[tuple[int, str, bytes]]) -> None:
        base, changed = self.versions[self.current]
        changed = dict(changed)
        for page, kind, raw in changes:
            now = np.frombuffer(changed.get(page, base[page].tobytes()), np.uint8)
            if kind == "diff":
                new = now ^ np.frombuffer(raw, np.uint8)
            else:
                new = np.zeros(4096, np.uint8)
                new[: len(raw)] = np.frombuffer(raw, np.uint8)
            changed[page] = new.tobytes()
        self.versions[epoch] = (base, changed)
        self.current = epoch

    def rotate(self, epoch: int, base: np.ndarray) -> None:
        self.versions[epoch] = (base, {})
        self.current = epoch


@pytest.fixture(scope="module")
def epoch_parties(serve_instance):
    from ray import serve

    root = Path(serve_instance.tmp) / "epochs"
    snaps = root / "snaps"
    snaps.mkdir(parents=True)
    token_file = root / "token"
    token_file.write_text(TOKEN + "\n")
    for name, seed, pages, epoch in ROTATIONS:
        build_synthetic(snaps / name, pages, seed=seed, epoch_id=epoch, progress=False)
    build_synthetic(snaps / "truncated", NUM_PAGES, seed=41, progress=False)
    with open(snaps / "truncated" / "pages.bin", "r+b") as fh:
        fh.truncate(4096 * (NUM_PAGES - 1))
    build_synthetic(snaps / "corrupt", NUM_PAGES, seed=42, progress=False)
    with open(snaps / "corrupt" / "pages.bin", "r+b") as fh:
        fh.seek(4096 * 300 + 17)
        fh.write(b"\xff\x00\xff")
    build_synthetic(root / "outside", NUM_PAGES, seed=43, progress=False)
    admin = {
        "admin_token_file": str(token_file),
        "admin_snapshot_dir": str(snaps),
        "fold_interval_s": 0.2,
        "fold_threshold": 8,
        "fold_chunk_pages": 64,
        "retry_backoff_ms": 20.0,
    }
    deploy(serve_instance, "ea", num_shards=3, epoch_log_dir=str(root / "log-ea"), **admin)
    deploy(serve_instance, "eb", num_shards=2, epoch_log_dir=str(root / "log-eb"), **admin)
    yield serve_instance, snaps
    serve.delete("ea")
    serve.delete("eb")


def _random_changes(rng: random.Random, num_pages: int) -> list[tuple[int, str, bytes]]:
    out = []
    for _ in range(rng.randint(1, 6)):
        page = rng.randrange(num_pages)
        if rng.random() < 0.6:
            out.append((page, "diff", rng.randbytes(4096)))
        else:
            out.append((page, "data", rng.randbytes(rng.choice([0, 1, 100, 4096]))))
    return out


def test_updates_and_rotations_under_load(epoch_parties) -> None:
    serve_instance, snaps = epoch_parties
    url_a, url_b = serve_instance.app_url("ea"), serve_instance.app_url("eb")
    model = Model(1, synthetic_pages(BASE_SEED, 0, NUM_PAGES))
    stop = threading.Event()
    lock = threading.Lock()
    stats = {"ok": 0, "unavailable": 0, "past_the_end": 0}
    wrong: list[str] = []
    failures: list[str] = []
    seen_epochs: set[int] = set()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        retry = RetryPolicy(attempts=8, backoff_s=0.05, max_backoff_s=0.5)
        with PirClient(url_a, url_b, retry=retry, timeout_s=30,
                       encoding="msgpack" if seed % 2 else "json") as c:
            while not stop.is_set():
                # every client asks across the whole first range, one only past 600 (a
                # rotation shrinks the matrix under them): zeros would be a wrong page
                lo, hi = TAIL if seed == 0 else (0, NUM_PAGES)
                wanted = [rng.randrange(lo, hi) for _ in range(rng.choice([1, 3, 5]))]
                try:
                    epoch, got = c.get_with_epoch(wanted)
                except PirUnavailable:
                    with lock:
                        stats["unavailable"] += 1
                    continue
                except PageOutOfRange as exc:
                    if exc.num_pages != 600 or max(wanted) < 600:
                        failures.append(f"PageOutOfRange: {exc}")
                    with lock:
                        stats["past_the_end"] += 1
                    continue
                except PirError as exc:  # a non-retryable refusal: never expected here
                    failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                except Exception as exc:  # noqa: BLE001
                    failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                with lock:
                    stats["ok"] += 1
                    seen_epochs.add(epoch)
                for p, data in zip(wanted, got, strict=True):
                    if data != model.page(epoch, p):
                        wrong.append(f"page {p} at epoch {epoch}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True)
               for i in range(CLIENT_THREADS)]
    for t in threads:
        t.start()
    rng = random.Random(5)
    started = time.monotonic()
    rotation_s = []
    try:
        assert wait_until(lambda: stats["ok"] >= 4, 60), (stats, failures)
        with AdminClient(url_a, TOKEN) as admin_a, AdminClient(url_b, TOKEN, encoding="json") \
                as admin_b, ThreadPoolExecutor(2) as pool:

            def both(op):  # the same operation on both parties at once; in order per party
                return list(pool.map(op, (admin_a, admin_b)))

            def timed_rotation(adm: AdminClient, name: str) -> dict:
                t0 = time.monotonic()
                res = adm.snapshot(name)
                rotation_s.append(time.monotonic() - t0)
                return res

            for i in range(UPDATE_BATCHES):
                if i in ROTATE_AT:
                    name, seed, pages, manifest_epoch = ROTATIONS[ROTATE_AT[i]]
                    epoch = max(model.current + 1, manifest_epoch)
                    model.rotate(epoch, synthetic_pages(seed, 0, pages))  # before anyone can
                    for res in both(lambda adm, name=name: timed_rotation(adm, name)):
                        assert res["epoch_id"] == epoch and res["num_pages"] == pages
                        assert res["domain_bits"] == domain_bits_for(pages)
                    if pages < TAIL[1]:
                        # the shrunken matrix stays until the client asking past its end has
                        # been told so: on a busy machine the next rotation could come first
                        assert wait_until(lambda: stats["past_the_end"] >= 1, 60), stats
                changes = _random_changes(rng, model.num_pages())
                epoch = model.current + 1
                model.apply(epoch, changes)
                results = both(lambda adm, changes=changes: adm.updates(changes))
                for res in results:
                    assert (res["epoch_id"], res["applied"]) == (epoch, len(changes))
                assert results[0]["identity"] == results[1]["identity"]  # same data
        admin_s = time.monotonic() - started
        # let clients see the final epoch too
        ok_before = stats["ok"]
        assert wait_until(lambda: stats["ok"] >= ok_before + CLIENT_THREADS, 60), stats
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    print(f"\nadmin work {admin_s:.1f}s, rotations {[round(x, 2) for x in rotation_s]}s, "
          f"clients {stats}, {len(seen_epochs)} epochs seen")
    assert not wrong, wrong[:10]
    assert not failures, failures[:10]
    assert stats["ok"] >= 20, stats
    assert stats["past_the_end"] >= 1, stats  # the shrunken epochs were asked past their end
    assert len(seen_epochs) >= 5, sorted(seen_epochs)

    final = model.current
    for url in (url_a, url_b):
        doc = httpx.get(url + "/epoch", timeout=30).json()
        assert doc["epoch_id"] == final
        assert doc["page_pir"]["num_pages"] == 1100 and doc["page_pir"]["domain_bits"] == 11
        assert doc["rotation_in_progress"] is False
        assert doc["snapshot"]["checksum"].startswith("blake3-chunks:")

    # the background fold writes pending updates into pages without changing any answer
    def folded() -> bool:
        return all(httpx.get(u + "/health", timeout=30).json()["pending_updates"] == 0
                   for u in (url_a, url_b))

    assert wait_until(folded, 30)
    status = httpx.get(url_a + "/admin/status", headers={"Authorization": f"Bearer {TOKEN}"},
                       timeout=30).json()
    assert status["consistent"] and status["epoch_id"] == final
    assert sum(s["folded_chunks"] for s in status["shards"]) > 0
    changed = sorted(model.versions[final][1])
    with PirClient(url_a, url_b) as c:
        for i in range(0, len(changed), 30):
            wanted = changed[i : i + 30]
            epoch, got = c.get_with_epoch(wanted)
            assert epoch == final
            assert got == [model.page(final, p) for p in wanted]
        assert c.get([1099, 0]) == [model.page(final, 1099), model.page(final, 0)]


def _admin_post(url: str, path: str, body: dict | None = None, token: str | None = TOKEN,
                **headers: str) -> httpx.Response:
    h = {"content-type": "application/json", **headers}
    if token is not None:
        h["authorization"] = f"Bearer {token}"
    return httpx.post(url + path, json=body or {}, headers=h, timeout=60)


def test_bad_snapshots_and_updates_are_refused_and_the_old_epoch_serves(epoch_parties) -> None:
    serve_instance, snaps = epoch_parties
    url_a, url_b = serve_instance.app_url("ea"), serve_instance.app_url("eb")
    before = httpx.get(url_a + "/epoch", timeout=30).json()
    with PirClient(url_a, url_b) as c:
        epoch0, pages0 = c.get_with_epoch([0, 17, 599])

    cases = [
        ("truncated", 422, "bad_snapshot", "truncated"),
        ("corrupt", 422, "bad_snapshot", "checksum mismatch"),
        ("missing", 422, "bad_snapshot", "no snapshot"),
        ("../outside", 403, "forbidden", "outside"),
        (str(snaps.parent / "outside"), 403, "forbidden", "outside"),
    ]
    for path, status, code, words in cases:
        r = _admin_post(url_a, "/admin/snapshot", {"path": path})
        assert r.status_code == status, (path, r.text)
        assert r.json()["error"]["code"] == code and words in r.json()["error"]["message"]

    num_pages = before["page_pir"]["num_pages"]
    bad_updates = [
        ({"updates": [{"page": num_pages, "diff": "0x" + "00" * 4096}]}, 400, "bad_update"),
        ({"updates": [{"page": 1, "diff": "0x00"}]}, 400, "bad_update"),
        ({"updates": []}, 400, "bad_update"),
        ({"updates": [{"page": 1, "diff": "0xZZ"}]}, 422, "invalid_field"),
    ]
    for body, status, code in bad_updates:
        r = _admin_post(url_a, "/admin/updates", body)
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text

    after = httpx.get(url_a + "/epoch", timeout=30).json()
    assert after == before  # nothing moved: same epoch, same snapshot, same shape
    with PirClient(url_a, url_b) as c:
        assert c.get_with_epoch([0, 17, 599]) == (epoch0, pages0)


def test_admin_auth(epoch_parties, parties) -> None:
    serve_instance, _ = epoch_parties
    url = serve_instance.app_url("ea")
    cases = [
        ({}, 401),
        ({"authorization": "Bearer wrong-token-wrong-token-wrong"}, 401),
        ({"authorization": f"Basic {TOKEN}"}, 401),
        ({"authorization": f"Bearer {TOKEN}x"}, 401),
        ({"authorization": f"Bearer {TOKEN}"}, 200),
    ]
    for headers, status in cases:
        r = httpx.get(url + "/admin/status", headers=headers, timeout=30)
        assert r.status_code == status, (headers, r.text)
        assert TOKEN not in r.text
        if status == 401:
            assert r.json()["error"]["code"] == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"
    # refused before the body is looked at
    r = _admin_post(url, "/admin/updates", {"updates": "junk"}, token="nope-nope-nope-nope")
    assert r.status_code == 401
    r = httpx.get(url + "/admin/updates", headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 405
    r = httpx.post(url + "/admin/updates", content=b"x",
                   headers={"authorization": f"Bearer {TOKEN}", "content-type": "text/plain"})
    assert r.status_code == 415
    # a party without a configured token has no admin routes; its query routes stay open
    r = _admin_post(parties.app_url("a"), "/admin/updates", {"updates": []})
    assert (r.status_code, r.json()["error"]["code"]) == (403, "forbidden")
    assert TOKEN not in r.text
    assert httpx.get(parties.app_url("a") + "/health", timeout=30).status_code == 200
