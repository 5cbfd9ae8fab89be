"""Clients take turns on the EVM processes: a client's queued runs never keep another's
waiting behind all of them. Fake processes (threads) hold each run until the test lets it
end, so the order runs start in is the queue's alone."""

from __future__ import annotations

import pytest
from _evm_fakes import WAIT_S, fake_workers, queue_runs


@pytest.fixture
def world():
    with fake_workers() as pair:
        yield pair


def _clients(ran: list[str]) -> list[str]:
    return [label[0] for label in ran]


def test_one_run_of_another_client_goes_second_not_behind_all_eight(world):
    """Eight of a's runs (one running, seven queued), then b's one: b's starts as soon as
    a's next has had its turn, not after a's seven."""
    w, workers = world
    results: dict = {}
    threads = queue_runs(workers, "a", None, [f"a{i}" for i in range(8)], results)
    assert workers.wait_for(lambda c: c["started"] == 1 and c["queued"] == 7, WAIT_S)
    threads += queue_runs(workers, "b", None, ["b0"], results)
    assert workers.wait_for(lambda c: c["queued"] == 8, WAIT_S)
    for label in [f"a{i}" for i in range(8)] + ["b0"]:
        w.let(label)
    for t in threads:
        t.join(WAIT_S)
    assert _clients(w.ran) == ["a", "a", "b"] + ["a"] * 6, w.ran
    assert len(results) == 9 and results["b0"] == b"b0"


def test_clients_queued_together_alternate(world):
    """Runs of three clients queued while another's runs: one of each in turn, in the order
    the clients first queued, whatever the number each has waiting."""
    w, workers = world
    results: dict = {}
    threads = queue_runs(workers, "z", None, ["z0"], results)
    assert workers.wait_for(lambda c: c["started"] == 1, WAIT_S)
    for key, n in (("a", 4), ("b", 2), ("c", 3)):
        before = workers.counts()["queued"]
        threads += queue_runs(workers, key, None, [f"{key}{i}" for i in range(n)], results)
        assert workers.wait_for(lambda c, want=before + n: c["queued"] == want, WAIT_S)
    for label in [f"{k}{i}" for k, n in (("a", 4), ("b", 2), ("c", 3)) for i in range(n)]:
        w.let(label)
    w.let("z0")
    for t in threads:
        t.join(WAIT_S)
    assert _clients(w.ran) == ["z", "a", "b", "c", "a", "b", "c", "a", "c", "a"], w.ran
    assert len(results) == 10
