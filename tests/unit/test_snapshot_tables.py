"""Named tables in a snapshot's manifest: checked, written, read back, and part of the name an
epoch identity gives the snapshot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from morphogen.protocol.identity import EpochIdentity
from morphogen.snapshot.manifest import Manifest, SnapshotError
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic
from morphogen.snapshot.tables import Table
from morphogen.snapshot.writer import write_snapshot

PAGES = np.arange(20 * 4096, dtype=np.uint32).astype(np.uint8).reshape(20, 4096)
TABLES = [{"name": "accounts", "first_page": 0, "num_pages": 5},
          {"name": "code.v2", "first_page": 5, "num_pages": 15}]


def _write(path: Path, tables=None) -> Manifest:
    return write_snapshot(path, PAGES, epoch_id=3, source="test", tables=tables)


def test_tables_round_trip_through_the_manifest_file(tmp_path):
    written = _write(tmp_path / "s", TABLES)
    assert written.tables == (Table("accounts", 0, 5), Table("code.v2", 5, 15))
    on_disk = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert on_disk["tables"] == TABLES
    loaded = Manifest.load(tmp_path / "s" / "manifest.json")
    assert loaded == written
    assert loaded.table("code.v2") == Table("code.v2", 5, 15) and loaded.table("x") is None
    assert loaded.table("code.v2").domain_bits == 4  # 15 pages need 2^4
    with Snapshot.open(tmp_path / "s") as snap:
        assert snap.manifest.tables == written.tables


def test_a_manifest_without_tables_reads_and_writes_as_before(tmp_path):
    written = _write(tmp_path / "s")
    on_disk = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert "tables" not in on_disk
    assert written.tables is None and written.fingerprint == written.root
    assert Manifest.from_dict(on_disk).tables is None


@pytest.mark.parametrize(("tables", "message"), [
    ([{"name": "A", "first_page": 0, "num_pages": 1}], "must match"),
    ([{"name": "_x", "first_page": 0, "num_pages": 1}], "must match"),
    ([{"name": "x" * 33, "first_page": 0, "num_pages": 1}], "must match"),
    ([{"name": "x", "first_page": 0, "num_pages": 0}], "is empty"),
    ([{"name": "x", "first_page": 15, "num_pages": 6}], "outside the matrix of 20 pages"),
    ([{"name": "x", "first_page": -1, "num_pages": 2}], "outside the matrix"),
    ([{"name": "x", "first_page": True, "num_pages": 2}], "must be integers"),
    ([{"name": "x", "first_page": 0, "num_pages": 2, "domain": 3}], "unknown field"),
    ([{"name": "x", "first_page": 0, "num_pages": 2}] * 2, "used twice"),
    (["x"], "must be an object"),
])
def test_bad_tables_are_refused_by_name(tmp_path, tables, message):
    with pytest.raises(SnapshotError, match=message):
        _write(tmp_path / "s", tables)
    assert not (tmp_path / "s" / "manifest.json").exists()  # refused before any write
    good = json.loads(_write(tmp_path / "ok").to_json())
    good["tables"] = tables
    with pytest.raises(SnapshotError, match=message):
        Manifest.from_dict(good, where="m.json")
    good["tables"] = {"x": 1}
    with pytest.raises(SnapshotError, match="'tables' must be a list"):
        Manifest.from_dict(good, where="m.json")


def test_tables_are_part_of_the_snapshots_identity(tmp_path):
    plain = _write(tmp_path / "plain")
    one = _write(tmp_path / "one", TABLES)
    other = _write(tmp_path / "other", [TABLES[0]])
    assert plain.root == one.root == other.root  # the same bytes
    names = {plain.fingerprint, one.fingerprint, other.fingerprint}
    assert len(names) == 3
    digests = {EpochIdentity.of_snapshot(3, n).digest for n in names}
    assert len(digests) == 3
    with Snapshot.open(tmp_path / "one") as snap:
        assert snap.fingerprint() == one.fingerprint
    with Snapshot.open(tmp_path / "plain") as snap:
        assert snap.fingerprint() == plain.root  # unchanged for snapshots without tables


def test_the_build_command_takes_tables_as_name_first_count():
    import argparse

    from cluster.inputs import table_spec

    assert table_spec("users=10:45") == {"name": "users", "first_page": 10, "num_pages": 45}
    for bad in ("users", "users=10", "users=a:3"):
        with pytest.raises(argparse.ArgumentTypeError, match="NAME=FIRST:COUNT"):
            table_spec(bad)


def test_a_node_cache_restores_only_the_manifest_its_uri_named(tmp_path) -> None:
    """Chunks are named by the data root alone: two snapshots of the same bytes with other
    tables share a cache directory, and a start while the store is down must not take the
    other's manifest (its tables) for this URI's."""
    from morphogen.snapshot.chunk_cache import ChunkCache

    tables = [{"name": "t", "first_page": 0, "num_pages": 4}]
    build_synthetic(tmp_path / "plain", 8, seed=1, epoch_id=1, progress=False)
    build_synthetic(tmp_path / "named", 8, seed=1, epoch_id=1, progress=False, tables=tables)
    plain = Snapshot.open(tmp_path / "plain").manifest
    named = Snapshot.open(tmp_path / "named").manifest
    assert plain.root == named.root and plain.fingerprint != named.fingerprint
    cache = ChunkCache(tmp_path / "cache")
    (cache.dir / plain.root).mkdir(parents=True)
    cache.remember("s3://b/named", named)
    cache.remember("s3://b/plain", plain)
    (cache.dir / plain.root / "manifest.json").write_text(plain.to_json())
    assert cache.manifest_for("s3://b/named") is None  # the other's manifest lies there
    assert cache.manifest_for("s3://b/plain").fingerprint == plain.fingerprint
    (cache.dir / plain.root / "manifest.json").write_text(named.to_json())
    assert cache.manifest_for("s3://b/named").tables == named.tables
    assert cache.manifest_for("s3://b/plain") is None
