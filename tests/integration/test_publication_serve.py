"""Publication through a real Serve when a router replica is SIGKILLed mid-publication.

Party A runs two router replicas over a shared epoch log; a one-shot failpoint stops the router
that serves the publication at a chosen step, and the test SIGKILLs that process there:
* after the log append (case 3b): the admin re-sends the same publication id, which is applied
  once on A, and B gets it too: both parties end on one identity;
* after every prepare (case 5): reads go on at once, and the next update and a rotation go
  through within the bound, not after a stale-stage timeout.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from morphogen.client import PirClient, PirError
from morphogen.client.admin import AdminClient, common_digest_version
from morphogen.protocol.changes import ChangeBatch
from morphogen.snapshot.synthetic import synthetic_pages

from .churn import random_changes
from .conftest import apply_changes, deploy, rotation_snapshots, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TOKEN = "publication-test-admin-token-0123456789abcdef"
PAGES = 160
BOUND_S = 15.0


def _resend(adm: AdminClient, send, timeout_s: float = 60.0) -> tuple[dict, float]:
    """What the admin does after an error: send the same publication again until it is
    answered (a killed replica's in-flight requests fail until Serve routes around it)."""
    started = time.monotonic()
    while True:
        try:
            return send(adm), time.monotonic() - started
        except (PirError, OSError) as exc:
            if time.monotonic() - started > timeout_s:
                raise AssertionError(f"publication not answered in {timeout_s}s: {exc}") from exc
            time.sleep(0.2)


def _kill_at(adm: AdminClient, failpoint: Path, step: str, send) -> threading.Thread:
    """Arm the failpoint, send the publication from a thread, SIGKILL the router replica that
    stopped at `step`; returns the thread (its request fails)."""
    failpoint.write_text(step)
    fired = Path(str(failpoint) + ".fired")

    def doomed() -> None:
        try:
            send(adm)
        except Exception:  # noqa: BLE001 - its router is killed under it
            pass

    thread = threading.Thread(target=doomed, daemon=True)
    thread.start()
    assert wait_until(fired.exists, 60, 0.05), "no router reached the failpoint"
    time.sleep(0.1)  # the pid is written whole
    os.kill(int(fired.read_text()), signal.SIGKILL)
    fired.unlink()
    return thread


def _read_until_ok(url_a: str, url_b: str, model, pages: list[int]) -> float:
    started = time.monotonic()
    with PirClient(url_a, url_b, timeout_s=20) as client:
        while True:
            try:
                got = client.get(pages)
                assert got == [model[p].tobytes() for p in pages]
                return time.monotonic() - started
            except PirError:
                assert time.monotonic() - started < BOUND_S, "reads not served again"
                time.sleep(0.1)


def test_a_router_killed_mid_publication_loses_nothing_and_blocks_nothing(
        parties, tmp_path: Path) -> None:
    from ray import serve

    snaps, token = rotation_snapshots(tmp_path, PAGES, 120, seed=31, token=TOKEN)
    failpoint = tmp_path / "failpoint"
    for name in ("pa", "pb"):
        deploy(parties, name, snapshot=str(snaps / "base"), num_shards=2,
               router_replicas=2 if name == "pa" else 1, admin_token_file=str(token),
               admin_snapshot_dir=str(snaps), epoch_log_dir=str(tmp_path / f"log-{name}"),
               admin_failpoint_file=str(failpoint) if name == "pa" else None,
               admin_lease_s=1.0, retry_backoff_ms=30.0, scan_attempts=5)
    url_a, url_b = parties.app_url("pa"), parties.app_url("pb")
    rng = random.Random(3)
    model = synthetic_pages(31, 0, PAGES)
    with AdminClient(url_a, TOKEN, timeout_s=30) as adm_a, \
            AdminClient(url_b, TOKEN, timeout_s=30) as adm_b:
        # case 3b: killed right after the log append; the admin re-sends
        x = random_changes(rng, PAGES)
        _kill_at(adm_a, failpoint, "proposed", lambda c: c.updates(x, "pub-x"))
        out_a, took = _resend(adm_a, lambda c: c.updates(x, "pub-x"))
        out_b, _ = _resend(adm_b, lambda c: c.updates(x, "pub-x"))
        assert out_a["identity"] == out_b["identity"] and out_a["epoch_id"] == 2
        assert took < BOUND_S
        again, _ = _resend(adm_a, lambda c: c.updates(x, "pub-x"))
        assert again["duplicate"] and again["identity"] == out_a["identity"]
        model = apply_changes(model, x)
        touched = sorted({p for p, _, _ in x})
        _read_until_ok(url_a, url_b, model, touched)

        # case 5: killed after every prepare: reads at once, the next publications in bound
        y = random_changes(rng, PAGES)
        _kill_at(adm_a, failpoint, "prepared", lambda c: c.updates(y, "pub-y"))
        killed = time.monotonic()
        read_s = _read_until_ok(url_a, url_b, model, [0, 77, 159])
        z = random_changes(rng, PAGES)
        out_z, _ = _resend(adm_a, lambda c: c.updates(z, "pub-z"))
        publish_s = time.monotonic() - killed
        _resend(adm_b, lambda c: c.updates(z, "pub-z"))
        model = apply_changes(model, z)
        rot, _ = _resend(adm_a, lambda c: c.snapshot("next", "pub-rot"))
        _resend(adm_b, lambda c: c.snapshot("next", "pub-rot"))
        assert rot["epoch_id"] == out_z["epoch_id"] + 1
        model = synthetic_pages(32, 0, 120)
        _read_until_ok(url_a, url_b, model, [0, 60, 119])
        status = adm_a.status()
    print(f"case 3b: re-send answered in {took:.2f}s; case 5: reads back in {read_s:.2f}s, "
          f"next publication {publish_s:.2f}s after the kill")
    assert read_s < BOUND_S and publish_s < BOUND_S
    assert status["epoch_log_pending"] is None
    assert [p for p in status["recent_publications"]] == ["pub-x", "pub-z", "pub-rot"][-len(
        status["recent_publications"]):]
    serve.delete("pa")
    serve.delete("pb")


def test_a_publication_larger_than_a_request_goes_in_parts_through_any_router(
        parties, tmp_path: Path) -> None:
    """Parties taking 8 updates a request, A behind two router replicas: a 40-change
    publication goes in 5 requests (Serve spreads them over both replicas, which meet in the
    shared log store), is served whole after the last, and re-sent answers from the log."""
    from ray import serve

    snaps, token = rotation_snapshots(tmp_path, PAGES, 120, seed=33, token=TOKEN)
    for name in ("qa", "qb"):
        deploy(parties, name, snapshot=str(snaps / "base"), num_shards=2,
               router_replicas=2 if name == "qa" else 1, admin_token_file=str(token),
               epoch_log_dir=str(tmp_path / f"log-{name}"), admin_max_updates=8)
    url_a, url_b = parties.app_url("qa"), parties.app_url("qb")
    rng = random.Random(5)
    model = synthetic_pages(33, 0, PAGES)
    big = [c for _ in range(40) for c in random_changes(rng, PAGES)][:40]
    try:
        with AdminClient(url_a, TOKEN, timeout_s=30) as adm_a, \
                AdminClient(url_b, TOKEN, timeout_s=30) as adm_b:
            assert adm_a.max_updates() == adm_b.max_updates() == 8
            with pytest.raises(PirError) as err:  # in one request: over the party's cap
                adm_a.updates(big, "pub-one-request")
            assert err.value.status == 413  # the body is over what 8 updates take
            outs = [adm.updates(big, "pub-big", max_per_request=adm.max_updates())
                    for adm in (adm_a, adm_b)]
            assert [o["applied"] for o in outs] == [40, 40] and outs[0]["parts"] == 5
            assert outs[0]["identity"] == outs[1]["identity"]
            model = apply_changes(model, big)
            touched = sorted({p for p, _, _ in big})
            _read_until_ok(url_a, url_b, model, touched[:12] + [0, 159])
            again = adm_a.updates(big, "pub-big", max_per_request=8)
            assert again["duplicate"] and again["identity"] == outs[0]["identity"]
            assert adm_a.status()["recent_publications"][-1] == "pub-big"
            # in parts under digest version 2: the parts name that version's digest
            assert common_digest_version([adm_a, adm_b]) == 2
            more = ChangeBatch.from_triples(
                [c for _ in range(40) for c in random_changes(rng, PAGES)][:40]).with_digest(2)
            outs = [adm.updates(more, "pub-big-2", max_per_request=8) for adm in (adm_a, adm_b)]
            assert outs[0]["parts"] == 5 and outs[0]["identity"] == outs[1]["identity"]
            model = apply_changes(model, more.triples())
            _read_until_ok(url_a, url_b, model, sorted(set(more.pages.tolist()))[:12])
        left = [p.name for p in (tmp_path / "log-qa").iterdir() if p.name.startswith("part-")]
        assert left == []
    finally:
        serve.delete("qa")
        serve.delete("qb")


def test_a_batch_sent_as_its_changed_bytes_is_the_batch_sent_whole(
        parties, tmp_path: Path) -> None:
    """A block's XOR diffs (a few dozen bytes of each page) sent to A as runs of changed
    bytes and to B as whole pages: one identity on both, the same pages served, and each
    party's log file of the batch (which a party writes as runs, however it came) a small
    fraction of its pages."""
    import numpy as np
    from ray import serve

    snaps, token = rotation_snapshots(tmp_path, PAGES, 120, seed=35, token=TOKEN)
    for name in ("sa", "sb"):
        deploy(parties, name, snapshot=str(snaps / "base"), num_shards=2,
               admin_token_file=str(token), epoch_log_dir=str(tmp_path / f"log-{name}"))
    url_a, url_b = parties.app_url("sa"), parties.app_url("sb")
    rng = np.random.default_rng(6)
    changes = []
    for page in rng.choice(PAGES, 60, replace=False).tolist():
        diff = np.zeros(4096, np.uint8)
        at = int(rng.integers(0, 4096 - 48))
        diff[at:at + 48] = rng.integers(1, 256, 48)  # a slot's tag and value
        changes.append((page, "diff", diff.tobytes()))
    try:
        with AdminClient(url_a, TOKEN, timeout_s=30) as adm_a, \
                AdminClient(url_b, TOKEN, timeout_s=30, sparse=False) as adm_b:
            assert adm_a.sparse() and adm_a.status()["admin_sparse_updates"] is True
            outs = [adm.updates(changes, "pub-runs") for adm in (adm_a, adm_b)]
            assert outs[0]["identity"] == outs[1]["identity"] and outs[0]["applied"] == 60
            model = apply_changes(synthetic_pages(35, 0, PAGES), changes)
            _read_until_ok(url_a, url_b, model, sorted(p for p, _, _ in changes)[:20])
            # the same form of changes under digest version 2, as publishers name it where
            # both parties list it: one identity again, whichever form each party was sent
            assert adm_a.status()["admin_batch_digests"] == [1, 2]
            assert common_digest_version([adm_a, adm_b]) == 2
            second = ChangeBatch.from_triples([(p, "diff", bytes(reversed(d)))
                                               for p, _, d in changes]).with_digest(2)
            outs = [adm.updates(second, "pub-runs-2") for adm in (adm_a, adm_b)]
            assert outs[0]["identity"] == outs[1]["identity"]
            head = outs[0]["identity"]
            model = apply_changes(model, second.triples())
            _read_until_ok(url_a, url_b, model, sorted(p for p, _, _ in changes)[:20])
        for name in ("sa", "sb"):
            files = list((tmp_path / f"log-{name}").rglob("updates-*.bin"))
            assert len(files) == 2 and all(f.read_bytes()[:4] == b"MGB2" for f in files)
            # each batch named by the digest of the version it was sent under
            names = {f.name.split("-")[2][:16] for f in files}
            assert names == {ChangeBatch.from_triples(changes).digest[:16],
                             second.digest[:16]}
            assert all(f.stat().st_size < 60 * 4096 / 20 for f in files)
        # a party started again replays its log, records of both versions, to the same data
        serve.delete("sa")
        deploy(parties, "sa", snapshot=str(snaps / "base"), num_shards=2,
               admin_token_file=str(token), epoch_log_dir=str(tmp_path / "log-sa"))
        with AdminClient(url_a, TOKEN, timeout_s=30) as adm_a:
            assert adm_a.head()[0] == head
            assert wait_until(lambda: all(
                sh["identity"] == head for sh in adm_a.status()["shards"]), 60, 0.1)
        _read_until_ok(url_a, url_b, model, sorted(p for p, _, _ in changes)[20:40])
    finally:
        serve.delete("sa")
        serve.delete("sb")
