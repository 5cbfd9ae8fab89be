"""open_location: one seam for local paths and object stores."""

from __future__ import annotations

import obstore as obs
import pytest

from morphogen.storage import is_remote, open_location


def test_an_s3_uri_reads_and_writes_under_its_prefix(s3_bucket, s3_env):
    loc = open_location(f"s3://{s3_bucket}/p/q/")
    assert loc.prefix == "p/q"
    obs.put(loc.store, loc.key("x"), b"abc", mode="create")
    listed = [m["path"] for m in obs.list(loc.store, prefix="p/").collect()]
    assert listed == ["p/q/x"]
    with pytest.raises(Exception, match="already exists"):
        obs.put(loc.store, loc.key("x"), b"other", mode="create")  # write-once holds
    assert bytes(obs.get(loc.store, "p/q/x").bytes()) == b"abc"


def test_a_path_and_a_file_uri_are_local(tmp_path):
    for uri in (tmp_path / "d", f"file://{tmp_path}/e"):
        assert not is_remote(uri)
        loc = open_location(uri)
        obs.put(loc.store, "y", b"1")
    assert (tmp_path / "d" / "y").read_bytes() == b"1"
    assert (tmp_path / "e" / "y").read_bytes() == b"1"


def test_unknown_schemes_and_bucketless_uris_are_refused():
    assert is_remote("s3://b/k") and is_remote("gs://b/k") and is_remote("https://h/x")
    with pytest.raises(ValueError, match="unsupported scheme"):
        open_location("ftp://host/x")
    with pytest.raises(ValueError, match="no bucket"):
        open_location("s3:///x")
