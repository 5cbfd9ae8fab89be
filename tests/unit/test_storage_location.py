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


def test_a_location_lies_under_a_prefix_as_its_client_requests_it() -> None:
    from morphogen.storage.location import lies_under, requested_location

    assert requested_location("http://H/snaps/a/%2E%2e/..\\x\t/./y/") == (
        "http", "h", ("x", "y"), "")
    assert requested_location("s3://b/snaps/%2e%2e/x") == ("s3", "b", ("snaps", "%2e%2e", "x"),
                                                           "")  # an object key is literal
    assert lies_under("http://h/snaps/a", "http://h/snaps/")
    # the client requests %2F as written (a server decoding it is the admin check's concern)
    assert lies_under("http://h/snaps/a/..%2F..", "http://h/snaps")
    for uri in ("http://h/snaps2/a", "http://h/snaps", "http://h/snaps/", "http://h/x/snaps/a",
                "http://h/snaps/%2e%2e/x", "http://g/snaps/a", "https://h/snaps/a",
                "http://h/snaps/a?x", "http://u@h/snaps/a"):
        assert not lies_under(uri, "http://h/snaps"), uri
