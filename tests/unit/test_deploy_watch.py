"""What `morphogen serve` prints while a party deploys, from the start board its replicas post
to (Ray's key-value store, here an in-memory one with the same calls)."""

from __future__ import annotations

import pytest

from cluster import deploy_watch
from cluster.deploy_watch import DeployWatch
from deployments import start_board


class FakeKV:
    def __init__(self) -> None:
        self.data: dict[tuple[bytes, str], bytes] = {}

    def _internal_kv_put(self, key, value, overwrite=True, namespace=None):
        self.data[(key, namespace)] = value

    def _internal_kv_get(self, key, namespace=None):
        return self.data.get((key, namespace))

    def _internal_kv_list(self, prefix, namespace=None):
        return [k for k, ns in self.data if ns == namespace and k.startswith(prefix)]

    def _internal_kv_del(self, key, namespace=None):
        self.data.pop((key, namespace), None)


@pytest.fixture
def kv(monkeypatch):
    fake = FakeKV()
    monkeypatch.setattr(start_board, "_kv", lambda: fake)
    return fake


def test_fetches_and_failures_are_printed_once_each_as_they_change(kv, monkeypatch) -> None:
    lines: list[str] = []
    watch = DeployWatch("a", print_line=lines.append)
    monkeypatch.setattr(deploy_watch, "_failed_deployments", lambda app: {})
    fetch = {"state": "fetching", "node": "f" * 56,
             "line": "8.0 of 64.0 MiB of s3://b/s (4 chunk(s)) on node n, 4.0 MiB/s, 14 s left"}
    start_board.post("a", "shard_0", "r1", fetch)
    watch.poll()
    watch.poll()  # nothing new: nothing printed
    assert lines == ["[serve] party a: shard_0 on node ffffffffffffffff: fetching 8.0 of 64.0 "
                     "MiB of s3://b/s (4 chunk(s)) on node n, 4.0 MiB/s, 14 s left"]
    failure = {"state": "failed", "node": "e" * 56, "reason": "node n: s3://b/s chunk 1: bad"}
    start_board.post("a", "shard_1", "r2", failure)
    start_board.post("a", "shard_1", "r3", failure)  # Serve's next try, the same way
    watch.poll()
    assert lines[1:] == ["[serve] party a: shard_1 on node eeeeeeeeeeeeeeee: failed to start: "
                         "node n: s3://b/s chunk 1: bad"]
    assert watch.failures() == ["shard_1 on node eeeeeeeeeeeeeeee: failed to start: node n: "
                                "s3://b/s chunk 1: bad"]
    start_board.post("b", "shard_0", "r9", failure)  # another party's: not this one's
    assert len(watch.failures()) == 1


def test_a_replica_that_died_before_posting_is_named_from_serves_status(kv,
                                                                       monkeypatch) -> None:
    message = ("The deployment failed to start 3 times in a row. Error:\n\x1b[36mray::Serve"
               "Replica\x1b[39m\n  File \"x.py\", line 3\nMemoryError: cannot allocate 64 GiB")
    monkeypatch.setattr(deploy_watch, "_failed_deployments",
                        lambda app: {"shard_0": message})
    watch = DeployWatch("a", print_line=lambda line: None)
    assert watch.failures() == ["shard_0: MemoryError: cannot allocate 64 GiB"]


def test_unsettled_hides_failures_serve_recovered_from(kv) -> None:
    start_board.post("a", "shard_0", "r1", {"state": "failed", "reason": "x"})
    start_board.post("a", "shard_0", "r2", {"state": "ready", "seconds": 1.0})
    start_board.post("a", "shard_1", "r3", {"state": "fetching", "line": "..."})
    assert [d["replica"] for d in start_board.unsettled("a")] == ["r3"]
    start_board.clear("a")
    assert start_board.read("a") == []


def test_a_reason_is_one_line() -> None:
    assert start_board.reason_line(ValueError("a\n  b")) == "a b"
    assert start_board.reason_line(KeyError("k")) == "KeyError: 'k'"
    assert start_board.reason_line(MemoryError()) == "MemoryError"
