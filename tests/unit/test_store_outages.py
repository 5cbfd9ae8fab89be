"""A store that is down, hung or out of room, as the operator meets it: every failure one line
naming what and where with the right hint, a hung store failing within a minute on the
defaults, an outage at start ridden out, a node starting from its own verified cache while
the store is down, and a full disk refused before anything is written. The store is the
loopback S3 server behind a TCP gate (`tests.s3.gate`) that can refuse or hang."""

from __future__ import annotations

import errno
import threading
import time
from pathlib import Path

import numpy as np
import obstore
import pytest

from morphogen.publication.log import EpochLog
from morphogen.publication.records import EpochLogError, EpochLogUnreachable
from morphogen.snapshot import chunk_cache
from morphogen.snapshot.chunk_cache import CacheFullError
from morphogen.snapshot.manifest import SnapshotError
from morphogen.snapshot.open import open_any
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic
from morphogen.storage import failures, open_location
from morphogen.storage.settings import StoreSettings, configure, current
from tests.s3.gate import DOWN, HUNG, OPEN, gate_to

PAGES, CHUNK = 100, 16  # 7 chunks


@pytest.fixture
def settings():
    """Short store settings for the test (restored after)."""
    before = current()

    def use(**kw) -> StoreSettings:
        configure(StoreSettings(**kw))
        return current()

    yield use
    configure(before)


@pytest.fixture
def snap(tmp_path: Path, s3_bucket: str, monkeypatch: pytest.MonkeyPatch, s3_env):
    """A snapshot uploaded to the bucket; the environment then points at a gate in front of
    the server, open."""
    local = tmp_path / "snap"
    build_synthetic(local, PAGES, seed=5, epoch_id=2, chunk_pages=CHUNK)
    uri = f"s3://{s3_bucket}/snapshots/epoch-2"
    loc = open_location(uri)
    for f in ("manifest.json", "pages.bin"):
        obstore.put(loc.store, loc.key(f), (local / f).read_bytes())
    with gate_to(s3_env.endpoint, OPEN) as gate:
        monkeypatch.setenv("AWS_ENDPOINT_URL", gate.endpoint)
        with Snapshot.open(local) as reference:
            yield uri, reference, gate


def test_an_unreachable_store_is_one_line_naming_the_uri_with_its_hint(snap, settings,
                                                                      tmp_path) -> None:
    uri, _, gate = snap
    settings(timeout_s=2, retry_s=1, outage_s=0)
    gate.set(DOWN)
    with pytest.raises(SnapshotError) as err:
        open_any(uri, cache_dir=tmp_path / "cache")
    text = str(err.value)
    assert "\n" not in text and "Debug source" not in text and len(text) < 600, text
    assert f"{uri}/manifest.json" in text
    assert "could not be reached" in text and "AWS_ENDPOINT_URL" in text
    assert "morphogen build" not in text  # the old, wrong hint


def test_a_missing_snapshot_says_where_and_how_to_put_one_there(s3_bucket, tmp_path) -> None:
    with pytest.raises(SnapshotError) as err:
        open_any(f"s3://{s3_bucket}/nothing", cache_dir=tmp_path / "cache")
    assert "no snapshot manifest" in str(err.value) and "snapshot push" in str(err.value)


def test_a_hung_store_fails_within_a_minute_on_the_defaults(snap, settings, tmp_path) -> None:
    uri, _, gate = snap
    settings()  # the defaults
    assert StoreSettings().hung_failure_s() <= 60
    gate.set(HUNG)
    started = time.monotonic()
    with pytest.raises(SnapshotError) as err:
        open_any(uri, cache_dir=tmp_path / "cache")
    took = time.monotonic() - started
    assert 20 <= took < 60, took  # one timeout at least, then given up
    assert "did not answer in time" in str(err.value) and "\n" not in str(err.value)


def test_an_outage_at_start_is_ridden_out(snap, settings, tmp_path) -> None:
    uri, reference, gate = snap
    settings(timeout_s=2, retry_s=1, outage_s=30)
    gate.set(DOWN)
    threading.Timer(4.0, gate.set, args=(OPEN,)).start()
    started = time.monotonic()
    with open_any(uri, cache_dir=tmp_path / "cache") as remote:
        assert time.monotonic() - started >= 3.5  # it waited for the store
        assert np.array_equal(remote.read_verified(0, PAGES), reference.pages(0, PAGES))


def test_an_outage_longer_than_the_window_fails_with_the_reason(snap, settings,
                                                                tmp_path) -> None:
    uri, _, gate = snap
    settings(timeout_s=2, retry_s=0.5, outage_s=2)
    gate.set(DOWN)
    started = time.monotonic()
    with pytest.raises(SnapshotError, match="could not be reached"):
        open_any(uri, cache_dir=tmp_path / "cache")
    assert time.monotonic() - started < 15


def test_a_node_with_the_whole_snapshot_cached_starts_while_the_store_is_down(
        snap, settings, tmp_path) -> None:
    uri, reference, gate = snap
    cache = tmp_path / "cache"
    with open_any(uri, cache_dir=cache) as remote:
        remote.read_verified(0, PAGES)
    settings(timeout_s=2, retry_s=0.5, outage_s=600)  # it must not wait out the outage
    gate.set(DOWN)
    started = time.monotonic()
    with open_any(uri, cache_dir=cache) as again:
        assert time.monotonic() - started < 10
        assert again.manifest.root == reference.manifest.root
        assert np.array_equal(again.read_verified(0, PAGES), reference.pages(0, PAGES))
        assert again._cache.fetched_bytes == 0


def test_a_partial_cache_while_the_store_is_down_fails_on_the_missing_chunk(
        snap, settings, tmp_path) -> None:
    uri, _, gate = snap
    cache = tmp_path / "cache"
    with open_any(uri, cache_dir=cache) as remote:
        remote.read_verified(0, 20)  # chunks 0 and 1 only
    settings(timeout_s=2, retry_s=0.5, outage_s=1)
    gate.set(DOWN)
    with open_any(uri, cache_dir=cache) as again:
        assert again.read_verified(0, 20).shape == (20, 4096)
        with pytest.raises(SnapshotError) as err:
            again.read_verified(0, PAGES)
    text = str(err.value)
    assert "chunk 2" in text and uri in text and "could not be reached" in text, text


def test_a_cached_copy_is_never_used_for_a_snapshot_the_store_says_is_gone(
        snap, tmp_path) -> None:
    uri, _, _ = snap
    cache = tmp_path / "cache"
    with open_any(uri, cache_dir=cache) as remote:
        remote.read_verified(0, PAGES)
    loc = open_location(uri)
    obstore.delete(loc.store, loc.key("manifest.json"))
    with pytest.raises(SnapshotError, match="no snapshot manifest"):
        open_any(uri, cache_dir=cache)


def test_a_full_disk_is_refused_before_a_byte_is_written(snap, tmp_path, monkeypatch) -> None:
    uri, reference, _ = snap
    cache = tmp_path / "cache"
    real = chunk_cache.shutil.disk_usage

    def small(path):
        return real(path)._replace(free=3 * CHUNK * 4096)

    monkeypatch.setattr(chunk_cache.shutil, "disk_usage", small)
    with open_any(uri, cache_dir=cache) as remote:
        with pytest.raises(CacheFullError) as err:
            remote.read_verified(0, PAGES)
        assert remote._cache.fetched_bytes == 0
    text = str(err.value)
    root = cache / reference.manifest.root
    assert "7 chunk(s)" in text and uri in text and str(root) in text
    assert "need 0.4 MiB" in text and "0.2 MiB free" in text, text
    assert "node " in text and "snapshot_cache_dir" in text
    assert not list(root.glob("chunk-*")) and not list(root.glob(".chunk-*.tmp-*"))


def test_running_out_of_room_mid_fetch_names_the_file_and_leaves_no_partial_chunk(
        snap, tmp_path, monkeypatch) -> None:
    uri, reference, _ = snap
    cache = tmp_path / "cache"
    real = chunk_cache.write_atomic
    written = []

    def fills_up(path, data, **kw):
        if not Path(path).name.startswith("chunk-"):
            return real(path, data, **kw)
        if len(written) == 2:  # the third chunk finds the disk full, half written
            def parts():
                yield bytes(data[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(path, parts(), **kw)
        written.append(path)
        return real(path, data, **kw)

    monkeypatch.setattr(chunk_cache, "write_atomic", fills_up)
    with open_any(uri, cache_dir=cache) as remote:
        with pytest.raises(CacheFullError) as err:
            remote.read_verified(0, PAGES)
    text = str(err.value)
    root = cache / reference.manifest.root
    assert "no space left writing" in text and str(root / "chunk-000002") in text, text
    assert "free" in text and "needed" in text
    assert sorted(p.name for p in root.glob("chunk-*")) == ["chunk-000000", "chunk-000001"]
    assert not list(root.glob(".chunk-*.tmp-*"))  # no partial chunk left behind


def test_replicas_of_one_node_fetch_different_ranges_at_once(snap, tmp_path) -> None:
    uri, reference, _ = snap
    cache = tmp_path / "cache"
    with open_any(uri, cache_dir=cache) as a, open_any(uri, cache_dir=cache) as b:
        inflight, peak, lock = [0], [0], threading.Lock()

        def slowed(snapshot):
            real = snapshot._read_range

            def read(start, end):
                with lock:
                    inflight[0] += 1
                    peak[0] = max(peak[0], inflight[0])
                time.sleep(0.3)
                try:
                    return real(start, end)
                finally:
                    with lock:
                        inflight[0] -= 1
            snapshot._read_range = read

        slowed(a)
        slowed(b)
        # a: chunks 0-3; b: chunks 3-6 (chunk 3 is wanted by both)
        results = {}
        threads = [threading.Thread(target=lambda s=s, r=r, k=k: results.__setitem__(
            k, s.read_verified(*r))) for s, r, k in ((a, (0, 60), "a"), (b, (50, PAGES), "b"))]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - started
        assert np.array_equal(results["a"], reference.pages(0, 60))
        assert np.array_equal(results["b"], reference.pages(50, PAGES))
        # each chunk once on the node, and both fetches ran at the same time
        assert sorted(a._cache.fetched_chunks + b._cache.fetched_chunks) == list(range(7))
        assert peak[0] >= 2, peak
        assert took < 7 * 0.3 + 0.5, took  # in turn it took at least 2.1 s + the rest


def test_a_replica_starts_at_its_epoch_when_the_log_store_is_down_and_says_so(
        s3_bucket, s3_env, settings, monkeypatch) -> None:
    settings(timeout_s=2, retry_s=0.5, outage_s=1)
    uri = f"s3://{s3_bucket}/log"
    log_id = EpochLog(uri, create=True).log_id
    other = f"s3://{s3_bucket}/other-log"
    EpochLog(other, create=True)
    with gate_to(s3_env.endpoint, DOWN) as gate:
        monkeypatch.setenv("AWS_ENDPOINT_URL", gate.endpoint)
        with pytest.raises(EpochLogUnreachable) as err:
            EpochLog(uri, create=False, log_id=log_id)
        assert err.value.transient and "\n" not in str(err.value)
        later = EpochLog(uri, create=False, log_id=log_id, marker_later=True)
        with pytest.raises(EpochLogUnreachable):
            later.state()
        gate.set(DOWN)
        wrong = EpochLog(other, create=False, log_id=log_id, marker_later=True)
        gate.set(OPEN)
        assert later.state().head is None  # the marker is checked, then the records read
        with pytest.raises(EpochLogError, match="log"):
            wrong.state()  # another log's marker is refused at the first read


def test_ride_out_retries_only_what_may_pass(monkeypatch) -> None:
    calls = []
    sleeps = []

    class Flaky(Exception):
        transient = True

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise Flaky("store down")
        return "ok"

    assert failures.ride_out(flaky, "x", outage_s=60, sleep=sleeps.append) == "ok"
    assert len(calls) == 3 and len(sleeps) == 2

    def broken():
        raise ValueError("corrupt")  # no store failure: not retried

    calls.clear()
    with pytest.raises(ValueError):
        failures.ride_out(lambda: (calls.append(1), broken()), "x", outage_s=60,
                          sleep=sleeps.append)
    assert len(calls) == 1


def test_store_settings_come_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("MORPHOGEN_STORE_TIMEOUT_S", "7")
    monkeypatch.setenv("MORPHOGEN_STORE_CONCURRENCY", "3")
    s = StoreSettings.from_env()
    assert s.timeout_s == 7.0 and s.concurrency == 3
    monkeypatch.setenv("MORPHOGEN_STORE_OUTAGE_S", "soon")
    with pytest.raises(ValueError, match="MORPHOGEN_STORE_OUTAGE_S"):
        StoreSettings.from_env()
    with pytest.raises(ValueError):
        StoreSettings(timeout_s=0)
