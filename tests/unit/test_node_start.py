"""A local Ray node that times out during start-up (Ray's fixed 30-s wait for its raylet,
which a loaded machine can pass) is ended and started again (`cluster.local.init_local`);
any other failure is raised at once, and nothing that was running before is touched."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cluster import local

TIMEOUT = Exception("The current node timed out during startup. This could happen because "
                    "some of the raylet failed to startup or the GCS has become overloaded.")


class FakeRay:
    """`ray.init` failing as told, each failed start leaving a real process behind, as a
    half-started node leaves its GCS and raylet."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls: list[dict] = []
        self.left: list[subprocess.Popen] = []
        self.shutdowns = 0

    def init(self, **kwargs) -> None:
        self.calls.append(kwargs)
        if self.failures:
            self.left.append(subprocess.Popen([sys.executable, "-c",
                                               "import time; time.sleep(120)"]))
            raise self.failures.pop(0)

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.fixture
def bystander():
    """A child process started before the node: never the retry's to end."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_node_that_timed_out_is_ended_and_started_again(bystander) -> None:
    ray = FakeRay([TIMEOUT, TIMEOUT])
    local.init_local(ray, num_cpus=2)
    assert len(ray.calls) == 3 and all(c == {"address": "local", "num_cpus": 2}
                                       for c in ray.calls)
    assert ray.shutdowns == 2
    for proc in ray.left:  # what each failed start left is gone
        assert proc.wait(timeout=10) is not None
    assert bystander.poll() is None


def test_other_failures_and_the_last_timeout_are_raised(bystander) -> None:
    ray = FakeRay([ValueError("bad num_cpus")])
    with pytest.raises(ValueError, match="bad num_cpus"):
        local.init_local(ray, num_cpus=-1)
    assert len(ray.calls) == 1 and ray.shutdowns == 0
    ray.left[0].kill()
    ray.left[0].wait()
    ray = FakeRay([TIMEOUT] * local.NODE_START_TRIES)
    with pytest.raises(Exception, match="timed out during startup"):
        local.init_local(ray)
    assert len(ray.calls) == local.NODE_START_TRIES
    for proc in ray.left[:-1]:
        assert proc.wait(timeout=10) is not None
    ray.left[-1].kill()
    ray.left[-1].wait()
    assert bystander.poll() is None


def test_chain_import_starts_its_local_node_again_too(monkeypatch) -> None:
    """`chain import` without --address starts a local node of its own: through the same
    retry (a loaded machine is where an import runs)."""
    from cluster import chain_import

    class ImportRay(FakeRay):
        def is_initialized(self) -> bool:
            return False

        def cluster_resources(self) -> dict:
            return {"CPU": 2.0}

        def remote(self, **options):
            return lambda fn: (options, fn)

    ray = ImportRay([TIMEOUT])
    monkeypatch.setitem(sys.modules, "ray", ray)
    # what it sets for its own node, undone after the test (later tests' Ray is not its)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    _, task, workers = chain_import._ray_encode(None, None)
    assert len(ray.calls) == 2 and ray.shutdowns == 1
    assert all(c["address"] == "local" and c["include_dashboard"] is False for c in ray.calls)
    assert workers == 2 and task[1] is chain_import._encode_to
    for proc in ray.left:
        assert proc.wait(timeout=10) is not None
