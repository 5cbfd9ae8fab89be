"""Snapshots in object storage, through a real S3 protocol server on loopback: each replica
fetches only its chunks, once per node, verified before use; a corrupted object or cache file
is refused, naming node, URI and chunk."""

from __future__ import annotations

import socket
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import obstore
import pytest

from morphogen.party.admin import resolve_snapshot_path, verify_snapshot
from morphogen.protocol.codec import ErrorCode, WireError
from morphogen.snapshot.chunk_cache import ChunkCache, chunk_file
from morphogen.snapshot.manifest import SnapshotError
from morphogen.snapshot.open import open_any
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic
from morphogen.storage import open_location

PAGES, CHUNK = 100, 16  # 7 chunks, the last one short


def upload(local: Path, uri: str) -> None:
    loc = open_location(uri)
    for f in ("manifest.json", "pages.bin"):
        obstore.put(loc.store, loc.key(f), (local / f).read_bytes())


@pytest.fixture
def remote(tmp_path: Path, s3_bucket: str) -> tuple[str, Snapshot]:
    local = tmp_path / "snap"
    build_synthetic(local, PAGES, seed=3, epoch_id=4, chunk_pages=CHUNK)
    uri = f"s3://{s3_bucket}/snapshots/epoch-4"
    upload(local, uri)
    snap = Snapshot.open(local)
    yield uri, snap
    snap.close()


def test_a_replica_fetches_only_the_chunks_of_its_range(remote, tmp_path: Path) -> None:
    uri, local = remote
    with open_any(uri, cache_dir=tmp_path / "cache") as snap:
        assert snap.num_pages == PAGES and snap.fingerprint() == local.fingerprint()
        assert snap._cache.fetched_bytes == 0  # opening reads the manifest only
        pages = snap.read_verified(20, 50)  # chunks 1, 2, 3
        assert np.array_equal(pages, local.pages(20, 50))
        assert snap._cache.fetched_bytes == 3 * CHUNK * 4096
        assert not pages.flags.writeable
        root = tmp_path / "cache" / local.manifest.root
        assert sorted(p.name for p in root.glob("chunk-*")) == [
            "chunk-000001", "chunk-000002", "chunk-000003"]


def test_a_second_replica_on_the_node_downloads_nothing(remote, tmp_path: Path) -> None:
    uri, local = remote
    with open_any(uri, cache_dir=tmp_path / "cache") as first:
        first.read_verified(0, 60)
    with open_any(uri, cache_dir=tmp_path / "cache") as second:
        assert np.array_equal(second.read_verified(10, 40), local.pages(10, 40))
        assert second._cache.fetched_bytes == 0


def test_a_killed_download_resumes_with_the_chunks_it_had(remote, tmp_path: Path) -> None:
    uri, local = remote
    with open_any(uri, cache_dir=tmp_path / "cache") as snap:
        snap.read_verified(0, PAGES)
    root = tmp_path / "cache" / local.manifest.root
    chunk_file(root, 5).unlink()
    chunk_file(root, 6).unlink()
    torn = root / ".chunk-000005.tmp-dead"
    torn.write_bytes(b"half a chunk")  # what a kill in the middle of a write leaves
    with open_any(uri, cache_dir=tmp_path / "cache") as snap:
        assert np.array_equal(snap.read_verified(0, PAGES), local.pages(0, PAGES))
        assert snap._cache.fetched_bytes == (CHUNK + (PAGES - 6 * CHUNK)) * 4096
    assert not torn.exists()


def test_a_corrupted_object_is_refused_naming_node_uri_and_chunk(remote, tmp_path: Path) -> None:
    uri, local = remote
    data = bytearray((Path(local.data_path)).read_bytes())
    data[2 * CHUNK * 4096 + 777] ^= 1  # one bit in chunk 2
    loc = open_location(uri)
    obstore.put(loc.store, loc.key("pages.bin"), bytes(data))
    with open_any(uri, cache_dir=tmp_path / "cache") as snap:
        assert np.array_equal(snap.read_verified(0, 30), local.pages(0, 30))  # chunks 0, 1
        with pytest.raises(SnapshotError) as exc:
            snap.read_verified(30, 40)
    msg = str(exc.value)
    assert f"node {socket.gethostname()}" in msg and uri in msg and "chunk 2" in msg
    assert not chunk_file(tmp_path / "cache" / local.manifest.root, 2).exists()


def test_a_cache_file_changed_on_disk_is_refused_and_fetched_again(remote, tmp_path) -> None:
    uri, local = remote
    with open_any(uri, cache_dir=tmp_path / "cache") as snap:
        snap.read_verified(0, 16)
    path = chunk_file(tmp_path / "cache" / local.manifest.root, 0)
    raw = bytearray(path.read_bytes())
    raw[5] ^= 0x80
    path.write_bytes(bytes(raw))
    with open_any(uri, cache_dir=tmp_path / "cache") as snap:
        with pytest.raises(SnapshotError, match="chunk 0: the cached copy"):
            snap.read_verified(0, 16)
        assert np.array_equal(snap.read_verified(0, 16), local.pages(0, 16))


def test_missing_objects_and_buckets_are_named(s3_bucket: str, tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match=f"s3://{s3_bucket}/nothing: no snapshot manifest"):
        open_any(f"s3://{s3_bucket}/nothing", cache_dir=tmp_path)
    with pytest.raises(SnapshotError, match="s3://no-such-bucket-here/x: no snapshot manifest"):
        open_any("s3://no-such-bucket-here/x", cache_dir=tmp_path)


def test_a_manifest_without_chunk_hashes_cannot_be_remote(s3_bucket, tmp_path) -> None:
    import json

    local = tmp_path / "s"
    build_synthetic(local, 8, seed=1)
    doc = json.loads((local / "manifest.json").read_text())
    doc.update(format=1)
    doc.pop("chunk_hashes", None)
    doc.pop("chunk_pages", None)
    doc["checksum"] = None
    loc = open_location(f"s3://{s3_bucket}/old")
    obstore.put(loc.store, loc.key("manifest.json"), json.dumps(doc).encode())
    with pytest.raises(SnapshotError, match="needs a manifest with chunk hashes"):
        open_any(f"s3://{s3_bucket}/old", cache_dir=tmp_path / "c")


def test_snapshots_no_process_holds_are_evicted(remote, tmp_path: Path, s3_bucket) -> None:
    uri, local = remote
    other_local = tmp_path / "other"
    build_synthetic(other_local, 40, seed=9, chunk_pages=CHUNK)
    other_uri = f"s3://{s3_bucket}/snapshots/other"
    upload(other_local, other_uri)
    cache = tmp_path / "cache"
    held = open_any(uri, cache_dir=cache)
    held.read_verified(0, 10)
    with open_any(other_uri, cache_dir=cache) as o:
        o.read_verified(0, 10)
        assert ChunkCache(cache).evict_unused() == []  # both in use
    other_root = Snapshot.open(other_local).manifest.root
    assert ChunkCache(cache).evict_unused() == [other_root]
    assert (cache / local.manifest.root).is_dir()
    held.close()
    with open_any(other_uri, cache_dir=cache):  # opening another evicts what nobody holds
        assert not (cache / local.manifest.root).exists()


def test_a_snapshot_evicted_while_another_process_opens_it_is_held_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process on the node evicts what nobody holds between this one's creating the
    snapshot's cache directory and its marking it in use: the open goes on, and holds it."""
    import os
    import types

    from morphogen.snapshot import chunk_cache

    opener, evicter = ChunkCache(tmp_path / "c"), ChunkCache(tmp_path / "c")
    manifest = types.SimpleNamespace(root="ab" * 32)
    real_open, evicted, once = os.open, [], []

    def open_after_an_eviction(path, *args, **kwargs):
        if str(path).endswith(".in-use") and not once:
            once.append(path)  # the eviction opens the marker too
            evicted.append(evicter.evict_unused())
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(chunk_cache.os, "open", open_after_an_eviction)
    with opener.holding(manifest):
        assert evicted == [["ab" * 32]]  # the directory went, and came back
        assert evicter.evict_unused() == []  # held now
        assert (tmp_path / "c" / ("ab" * 32)).is_dir()


def test_rotation_uris_must_lie_under_the_allowed_prefix(remote) -> None:
    uri, _ = remote
    base = uri.rsplit("/", 1)[0]
    assert resolve_snapshot_path("epoch-4", base) == uri
    assert resolve_snapshot_path(uri + "/", base) == uri
    for bad in ("../elsewhere", "s3://other-bucket/snapshots/epoch-4", base + "x/epoch-4",
                "epoch-4/../../x", "/tmp/local"):
        with pytest.raises(WireError) as exc:
            resolve_snapshot_path(bad, base)
        assert exc.value.status == 403, bad
    with pytest.raises(WireError) as exc:
        resolve_snapshot_path(uri, "/srv/snapshots")  # a URI against a local directory
    assert exc.value.status == 403
    assert verify_snapshot(uri).num_pages == PAGES
    with pytest.raises(WireError) as exc:
        verify_snapshot(base + "/none")
    assert exc.value.status == 422


def test_a_download_killed_in_its_process_resumes_where_it_stopped(remote, tmp_path) -> None:
    import os
    import subprocess
    import sys
    import time

    uri, local = remote
    cache = tmp_path / "cache"
    root = cache / local.manifest.root
    # the child fetches everything, a chunk at a time, slowly enough to be killed halfway
    code = (
        "import time\n"
        "from morphogen.snapshot import chunk_cache\n"
        "finish = chunk_cache.ChunkCache._finish\n"
        "def slow(self, *a, **k):\n"
        "    out = finish(self, *a, **k)\n"
        "    time.sleep(0.5)\n"
        "    return out\n"
        "chunk_cache.ChunkCache._finish = slow\n"
        "from morphogen.snapshot.open import open_any\n"
        f"with open_any({uri!r}, cache_dir={str(cache)!r}) as s:\n"
        f"    s.read_verified(0, {PAGES})\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    child = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 60
    while len(list(root.glob("chunk-*"))) < 2:
        assert child.poll() is None and time.monotonic() < deadline, "the child ended early"
        time.sleep(0.01)
    child.kill()  # SIGKILL: no cleanup, its download lock dies with it
    child.wait()
    had = sorted(root.glob("chunk-*"))
    assert 2 <= len(had) < 7
    with open_any(uri, cache_dir=cache) as snap:
        assert np.array_equal(snap.read_verified(0, PAGES), local.pages(0, PAGES))
        left = 7 - len(had)
        assert snap._cache.fetched_bytes == (left - 1) * CHUNK * 4096 + (PAGES - 6 * CHUNK) * 4096


def test_a_snapshot_behind_a_web_server_is_fetched_by_ranges_and_verified(tmp_path: Path
                                                                         ) -> None:
    """http(s):// (a CDN or a web server in front of a bucket): the same ranged, verified fetch
    through a real HTTP server on loopback; a changed file is refused naming URI and chunk."""
    from tests.web.server import serving

    served = tmp_path / "www"
    build_synthetic(served / "epoch-4", PAGES, seed=3, epoch_id=4, chunk_pages=CHUNK)
    with Snapshot.open(served / "epoch-4") as local, serving(served) as base:
        uri = f"{base}/epoch-4"
        with open_any(uri, cache_dir=tmp_path / "cache") as snap:
            assert snap.fingerprint() == local.fingerprint()
            assert np.array_equal(snap.read_verified(20, 50), local.pages(20, 50))
            assert snap._cache.fetched_bytes == 3 * CHUNK * 4096  # chunks 1, 2, 3 only
        data = bytearray(local.data_path.read_bytes())
        data[5 * CHUNK * 4096 + 9] ^= 4  # one bit in chunk 5, changed under the server
        (served / "epoch-4" / "pages.bin").write_bytes(bytes(data))
        with open_any(uri, cache_dir=tmp_path / "cache2") as snap:
            with pytest.raises(SnapshotError) as exc:
                snap.read_verified(70, 90)
    msg = str(exc.value)
    assert f"node {socket.gethostname()}" in msg and uri in msg and "chunk 5" in msg


@pytest.mark.parametrize("uri", ["https://cdn.example/log", "http://10.0.0.1/log"])
def test_a_web_server_cannot_hold_an_epoch_log(uri: str) -> None:
    from pydantic import ValidationError

    from morphogen.config import PartyConfig
    from morphogen.publication.log import EpochLog, EpochLogError

    expected = "an epoch log needs write-once objects \\(s3://, gs://\\) or a shared directory"
    with pytest.raises(ValidationError, match=expected):
        PartyConfig(epoch_log_dir=uri)
    with pytest.raises(EpochLogError, match=expected):
        EpochLog(uri)


# what an admin may name under admin_snapshot_dir=http://host/snaps, and where the HTTP client
# (obstore, WHATWG URL parsing) would take it: %2e is a dot, `\` a slash, tabs vanish
ESCAPES = ["%2e%2e/private/secret", ".%2e/private/secret", "%2E%2E/private/secret",
           "%2e./private/secret", "..\\private\\secret", "epoch-4\\..\\..\\private\\secret",
           ".\t./private/secret", "epoch-4/%2e%2e/%2e%2e/private/secret"]
# left as written by the client, but a server or proxy that decodes once more reads them as
# another place
DECODED_LATER = ["%252e%252e/private/secret", "..%2fprivate%2fsecret", "%2e%2e%5cprivate",
                 "epoch-4%2f..%2f..%2fprivate%2fsecret", "x//y", "x?y"]


@contextmanager
def recording_web_server(root: Path):
    """`tests.web.server.serving`, recording the path of every request it answers."""
    from tests.web import server as web

    seen: list[str] = []
    real = web._handler

    def handler(served: Path):
        cls = real(served)

        class Recording(cls):  # type: ignore[misc, valid-type]
            def _answer(self, body: bool) -> None:
                seen.append(self.path)
                super()._answer(body)

        return Recording

    web._handler = handler
    try:
        with web.serving(root) as base:
            yield base, seen
    finally:
        web._handler = real


def test_an_http_snapshot_prefix_is_compared_as_the_client_resolves_it(tmp_path: Path) -> None:
    """admin_snapshot_dir=http://host/snaps: every spelling of `..` the URL parser resolves
    is refused before anything is fetched, so a rotation never reaches /private."""
    www = tmp_path / "www"
    build_synthetic(www / "snaps" / "epoch-4", 40, seed=3, epoch_id=4, chunk_pages=CHUNK)
    build_synthetic(www / "private" / "secret", 40, seed=9, epoch_id=9, chunk_pages=CHUNK)
    with recording_web_server(www) as (base, seen):
        allowed = f"{base}/snaps"
        # the escapes are real: the client itself asks for /private
        for name in ESCAPES:
            seen.clear()
            loc = open_location(f"{allowed}/{name}")
            assert obstore.get(loc.store, loc.key("manifest.json")).bytes()
            assert seen == ["/private/secret/manifest.json"], name
        seen.clear()
        for name in ESCAPES + DECODED_LATER:
            for requested in (name, f"{allowed}/{name}"):
                with pytest.raises(WireError) as exc:
                    resolve_snapshot_path(requested, allowed)
                assert (exc.value.status, exc.value.code) == (403, ErrorCode.FORBIDDEN), name
                assert "allowed snapshot prefix" in exc.value.message
        assert seen == []  # refused before a byte was asked for
        for bad in (f"{base}/snaps2/epoch-4", f"{base}/private/secret", base):
            with pytest.raises(WireError) as exc:
                resolve_snapshot_path(bad, allowed)
            assert exc.value.status == 403
        uri = resolve_snapshot_path("epoch-4", allowed)
        assert uri == f"{allowed}/epoch-4" and resolve_snapshot_path(uri, allowed + "/") == uri
        assert verify_snapshot(uri).epoch_id == 4
        assert seen == ["/snaps/epoch-4/manifest.json"]


def test_a_rotation_through_the_admin_api_cannot_leave_the_http_prefix(tmp_path: Path) -> None:
    """The admin API answers 403 naming where the URI leads, and the secret snapshot is never
    fetched, let alone served."""
    import asyncio

    from morphogen.party.router import Party
    from tests.unit._party_world import make_party, make_world

    _, snaps = make_world(tmp_path)
    www = tmp_path / "www"
    build_synthetic(www / "private" / "secret", 96, seed=9, epoch_id=9, chunk_pages=CHUNK)
    (www / "snaps").mkdir()
    party, links = make_party(snaps, tmp_path / "log")
    with recording_web_server(www) as (base, seen):
        cfg = party.cfg.model_copy(update={"admin_snapshot_dir": f"{base}/snaps"})
        party = Party(cfg, links, party.epoch_log)
        for name in ("%2e%2e/private/secret", "..\\private\\secret"):
            with pytest.raises(WireError) as exc:
                asyncio.run(party.admin.snapshot(name))
            assert (exc.value.status, exc.value.code) == (403, ErrorCode.FORBIDDEN)
            assert f"resolves to '{base}/private/secret'" in exc.value.message
        assert seen == []
    assert party.epoch_log.head() is None
