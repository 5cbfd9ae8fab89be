"""Publication decided in the log (docs/publication.md), case by case: racing publishers, a
publisher that dies at each step, replicas that start, miss a prepare or sit on a log that is
not the party's. In-process replicas and routers over a real epoch log on disk."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from _party_world import (
    ReplicaSet,
    apply_batch,
    ask_async,
    cfg_for,
    make_party,
    make_world,
    random_batch,
    start_replica,
)

from morphogen.party import publisher as publisher_module
from morphogen.party.router import Party
from morphogen.protocol.codec import WireError
from morphogen.publication import lease as lease_module
from morphogen.publication import log as epoch_log_module
from morphogen.publication.lease import FIRST_POLL_S, MAX_POLL_S
from morphogen.publication.log import EpochLog, EpochLogBusy, EpochLogError
from morphogen.snapshot.synthetic import synthetic_pages

NUM_PAGES = 96
LEASE_S = 0.3


@pytest.fixture
def world(tmp_path: Path):
    return make_world(tmp_path)


@pytest.fixture(params=["dir", "s3"])
def logs(request: pytest.FixtureRequest, tmp_path: Path):
    """Where a party's epoch log lives: a shared directory, or an S3 prefix (loopback)."""
    if request.param == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        return lambda name: f"s3://{bucket}/{name}"
    return lambda name: tmp_path / name


class Freeze:
    """A publisher that stops for good at step `at` (a crashed router): it renews no lease and
    takes no further step. `reached` is set when it got there."""

    def __init__(self, party: Party, at: str) -> None:
        self.party, self.at = party, at
        self.reached = asyncio.Event()
        party.admin.pause = self

    async def __call__(self, step: str) -> None:
        if step == self.at:
            self.party.admin.halt()
            self.reached.set()
            await asyncio.Event().wait()


def second_router(snaps: Path, log_dir: Path, links: list[ReplicaSet]) -> Party:
    """Another router replica of the same party (same shards, same log)."""
    return Party(cfg_for(snaps, log_dir, admin_lease_s=LEASE_S), links, EpochLog(log_dir))


def served(links: list[ReplicaSet]) -> set[str]:
    return {m.core.identity.digest for link in links for m in link.members}


async def _read(party: Party, model: np.ndarray, pages: list[int]) -> str:
    answer, got = await ask_async(party, model, pages)
    assert got == [model[p].tobytes() for p in pages]
    return answer["identity"]


def test_case3a_two_routers_publishing_at_once_apply_each_batch_once(world, logs):
    root, snaps = world
    r1, links = make_party(snaps, logs("log"), replicas=2, admin_lease_s=LEASE_S)
    r2 = second_router(snaps, logs("log"), links)
    rng = np.random.default_rng(1)
    x, y = random_batch(rng, 3, NUM_PAGES), random_batch(rng, 3, NUM_PAGES)
    go = asyncio.Event()

    async def hold(step: str) -> None:
        if step == "proposed":
            await go.wait()  # r2 proposes while x is undecided

    r1.admin.pause = hold

    async def run():
        first = asyncio.ensure_future(r1.admin.updates(x, "pub-x"))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(r2.admin.updates(y, "pub-y"))
        await asyncio.sleep(0.2)
        assert not second.done()  # waits for x's decision instead of racing it
        go.set()
        out_x, out_y = await first, await second
        # x re-sent (the admin saw an error and re-ran the command): nothing applied twice
        again = await r2.admin.updates(x, "pub-x")
        model = apply_batch(apply_batch(synthetic_pages(3, 0, NUM_PAGES), x), y)
        ident = await _read(r2, model, sorted({*x.pages.tolist(), *y.pages.tolist()}))
        return out_x, out_y, again, ident

    out_x, out_y, again, ident = asyncio.run(run())
    assert (out_x["epoch_id"], out_y["epoch_id"]) == (2, 3)
    assert again["duplicate"] and again["identity"] == out_x["identity"]
    assert again["applied"] == 0
    assert ident == out_y["identity"] and served(links) == {out_y["identity"]}
    assert [e.pub for e in EpochLog(logs("log")).live()] == ["pub-x", "pub-y"]


def test_case3b_a_router_dead_after_the_append_and_the_admin_resending(world, logs):
    """Router 1 dies right after logging x; the admin re-sends x (same id) to router 2 of A,
    and sends it to B: both parties end on one identity with x applied once."""
    root, snaps = world
    a1, links_a = make_party(snaps, logs("log-a"), admin_lease_s=LEASE_S)
    a2 = second_router(snaps, logs("log-a"), links_a)
    b, links_b = make_party(snaps, logs("log-b"), admin_lease_s=LEASE_S)
    x = random_batch(np.random.default_rng(2), 4, NUM_PAGES)
    freeze = Freeze(a1, "proposed")

    async def run():
        dead = asyncio.ensure_future(a1.admin.updates(x, "pub-x"))
        await freeze.reached.wait()
        started = time.monotonic()
        out_a = await a2.admin.updates(x, "pub-x")
        took = time.monotonic() - started
        out_b = await b.admin.updates(x, "pub-x")
        model = apply_batch(synthetic_pages(3, 0, NUM_PAGES), x)
        ids = {await _read(p, model, x.pages.tolist()) for p in (a1, a2, b)}
        dead.cancel()
        return out_a, out_b, took, ids

    out_a, out_b, took, ids = asyncio.run(run())
    assert out_a["identity"] == out_b["identity"] and out_a["epoch_id"] == 2
    assert ids == {out_a["identity"]}
    assert took < LEASE_S + 2  # the dead router's proposal is aborted once its lease ends
    kinds = [(e.kind, e.pub) for e in EpochLog(logs("log-a")).entries() if e.kind != "renew"]
    assert kinds == [("updates", "pub-x"), ("abort", None), ("updates", "pub-x"),
                     ("commit", None)]


def test_a_dead_publisher_whose_clock_runs_fast_blocks_only_for_its_lease(world, logs,
                                                                          monkeypatch):
    """Router 1's wall clock runs 600 s fast and it dies mid-publication: router 2, on its own
    clock, aborts the orphan after about the lease, not after the ten minutes router 1's
    clock promised itself (issue 28, hole 6)."""
    root, snaps = world
    skew_ms = [600_000]
    real_now = epoch_log_module.now_ms
    monkeypatch.setattr(epoch_log_module, "now_ms", lambda: real_now() + skew_ms[0])
    r1, links = make_party(snaps, logs("log"), admin_lease_s=LEASE_S)
    r2 = Party(cfg_for(snaps, logs("log"), admin_lease_s=LEASE_S, admin_timeout_s=20),
               links, EpochLog(logs("log")))
    rng = np.random.default_rng(7)
    x, y = random_batch(rng, 2, NUM_PAGES), random_batch(rng, 3, NUM_PAGES)
    freeze = Freeze(r1, "prepared")

    async def run():
        dead = asyncio.ensure_future(r1.admin.updates(x, "pub-x"))
        await freeze.reached.wait()
        skew_ms[0] = 0  # router 2's clock is right
        started = time.monotonic()
        out = await r2.admin.updates(y, "pub-y")
        took = time.monotonic() - started
        model = apply_batch(synthetic_pages(3, 0, NUM_PAGES), y)
        ident = await _read(r2, model, sorted({*x.pages.tolist(), *y.pages.tolist()}))
        dead.cancel()
        return out, took, ident

    out, took, ident = asyncio.run(run())
    assert out["epoch_id"] == 2 and ident == out["identity"]
    assert took < LEASE_S + 2
    kinds = [(e.kind, e.pub) for e in EpochLog(logs("log")).entries() if e.kind != "renew"]
    assert kinds == [("updates", "pub-x"), ("abort", None), ("updates", "pub-y"),
                     ("commit", None)]


def test_case4_a_replica_started_mid_publication_never_serves_what_is_then_aborted(world):
    root, snaps = world
    party, links = make_party(snaps, root / "log", admin_lease_s=LEASE_S)
    x = random_batch(np.random.default_rng(3), 2, NUM_PAGES)
    model = synthetic_pages(3, 0, NUM_PAGES)
    gate = asyncio.Event()
    started: list = []

    async def prepare_then_fail(*args):
        # a replica of shard 0 starts while x is proposed, then shard 1's prepare fails
        started.append(start_replica(snaps / "base", 0, EpochLog(root / "log")))
        gate.set()
        raise TimeoutError

    links[1].prepare_updates = prepare_then_fail

    async def run():
        with pytest.raises(WireError) as err:
            await party.admin.updates(x, "pub-x")
        assert err.value.status == 503
        links[0].members.append(started[0])
        return {await _read(party, model, [1, 50]) for _ in range(4)}, await party.health()

    ids, health = asyncio.run(run())
    assert started[0].core.epoch_id == 1 and started[0].replayed == 0
    assert ids == {links[0].core.identity.digest} and health["epoch_id"] == 1
    # the next publication works, and party B that got the same operations agrees
    del links[1].prepare_updates
    b, _ = make_party(snaps, root / "log-b", admin_lease_s=LEASE_S)
    y = random_batch(np.random.default_rng(4), 2, NUM_PAGES)
    out_a = asyncio.run(party.admin.updates(y, "pub-y"))
    out_b = asyncio.run(b.admin.updates(y, "pub-y"))
    assert out_a["identity"] == out_b["identity"] and out_a["epoch_id"] == 2


@pytest.mark.parametrize("op", ["updates", "rotation"])
def test_case5_a_staged_orphan_blocks_nothing(world, op):
    """A router killed after every prepare: reads go on at once, the next update or rotation
    goes through within the lease, and the orphan is dropped by the health check."""
    root, snaps = world
    r1, links = make_party(snaps, root / "log", replicas=2, admin_lease_s=LEASE_S)
    r2 = second_router(snaps, root / "log", links)
    x = random_batch(np.random.default_rng(5), 2, NUM_PAGES)
    freeze = Freeze(r1, "prepared")
    model = synthetic_pages(3, 0, NUM_PAGES)

    async def run():
        dead = asyncio.ensure_future(
            r1.admin.updates(x, "pub-x") if op == "updates" else r1.admin.snapshot("next"))
        await freeze.reached.wait()
        assert all(m.core.state.staged is not None for link in links for m in link.members)
        started = time.monotonic()
        ident = await _read(r2, model, [3, 60])  # reads: no wait at all
        read_s = time.monotonic() - started
        await asyncio.sleep(LEASE_S)
        for link in links:
            for m in link.members:
                await m.check_health()
        orphans = [m.core.state.staged for link in links for m in link.members]
        y = random_batch(np.random.default_rng(6), 2, NUM_PAGES)
        out = await (r2.admin.updates(y, "pub-y") if op == "updates"
                     else r2.admin.snapshot("next", "pub-rot"))
        pub_s = time.monotonic() - started
        dead.cancel()
        return ident, read_s, orphans, out, pub_s

    ident, read_s, orphans, out, pub_s = asyncio.run(run())
    assert ident == links[0].core.identity.digest or out["epoch_id"] == 2
    assert read_s < 1.0 and pub_s < 5.0
    assert orphans == [None] * 4
    assert out["epoch_id"] == 2 and served(links) == {out["identity"]}


def test_case5_an_admin_request_cancelled_mid_commit_still_commits_everywhere(world):
    root, snaps = world
    party, links = make_party(snaps, root / "log", replicas=2, admin_lease_s=LEASE_S)
    x = random_batch(np.random.default_rng(7), 2, NUM_PAGES)

    async def run():
        request = asyncio.ensure_future(party.admin.updates(x, "pub-x"))
        while not any(m.core.epoch_id == 2 for m in links[0].members):
            await asyncio.sleep(0)
        request.cancel()  # the admin client went away between two shard commits
        while party.admin._tasks:
            await asyncio.sleep(0.01)

    asyncio.run(run())
    assert {m.core.epoch_id for link in links for m in link.members} == {2}
    assert len(served(links)) == 1


def test_case6_a_replica_that_missed_the_prepare_commits_from_the_log(world):
    root, snaps = world
    party, links = make_party(snaps, root / "log", replicas=2, admin_lease_s=LEASE_S)
    x = random_batch(np.random.default_rng(8), 3, NUM_PAGES)
    links[1].unreachable = {1}  # became routable only after the prepare

    async def reachable_again(step: str) -> None:
        if step == "prepared":
            links[1].unreachable = set()

    party.admin.pause = reachable_again
    out = asyncio.run(party.admin.updates(x, "pub-x"))
    assert "replicas_catching_up" not in out  # a 200 with every replica there, never a 500
    assert served(links) == {out["identity"]}
    again = asyncio.run(party.admin.updates(x, "pub-x"))
    assert again["duplicate"] and served(links) == {out["identity"]}
    model = apply_batch(synthetic_pages(3, 0, NUM_PAGES), x)
    for _ in range(3):
        assert asyncio.run(ask_async(party, model, x.pages.tolist()))[1] == [
            model[p].tobytes() for p in x.pages.tolist()]


def test_case7_a_log_directory_that_is_not_the_partys_refuses_the_start(world, tmp_path):
    root, snaps = world
    shared = EpochLog(root / "log")
    node_local = root / "elsewhere"
    with pytest.raises(EpochLogError, match=f"node .*{node_local}: no epoch log directory"):
        EpochLog(node_local, create=False, log_id=shared.log_id)
    node_local.mkdir()
    with pytest.raises(EpochLogError, match=f"{node_local}: not an epoch log"):
        EpochLog(node_local, create=False, log_id=shared.log_id)
    other = EpochLog(root / "other")  # another party's, or made by mkdir on this node
    with pytest.raises(EpochLogError, match=f"{root / 'other'}: the epoch log here is "
                                            f"{other.log_id}, the party's is {shared.log_id}"):
        EpochLog(root / "other", create=False, log_id=shared.log_id)
    # a replica whose log goes away reports unhealthy (Serve replaces it)
    replica = start_replica(snaps / "base", 0, EpochLog(root / "log", log_id=shared.log_id))
    asyncio.run(replica.check_health())
    shutil.move(root / "log", root / "log-moved")
    with pytest.raises(EpochLogError):
        asyncio.run(replica.check_health())


def test_a_replica_stuck_behind_the_log_reports_unhealthy(world):
    root, snaps = world
    party, links = make_party(snaps, root / "log")
    replica = start_replica(snaps / "base", 0, EpochLog(root / "log"), behind_unhealthy_s=0.0)
    asyncio.run(party.admin.updates(random_batch(np.random.default_rng(9), 2, NUM_PAGES)))

    def cannot(*args, **kwargs):
        raise EpochLogError("blob unreadable")

    replica.core.catch_up = cannot
    asyncio.run(replica.check_health())  # the first look notes it
    time.sleep(0.01)
    with pytest.raises(RuntimeError, match="behind the epoch log"):
        asyncio.run(replica.check_health())


def test_a_committed_rotation_compacts_the_log_and_ids_stay_answered(world):
    root, snaps = world
    party, links = make_party(snaps, root / "log")
    rng = np.random.default_rng(10)
    batches = [random_batch(rng, 2, NUM_PAGES) for _ in range(5)]
    for i, batch in enumerate(batches):
        asyncio.run(party.admin.updates(batch, f"pub-{i}"))
    before = len(EpochLog(root / "log").entries())
    rot = asyncio.run(party.admin.snapshot("next", "pub-rot"))
    entries = EpochLog(root / "log").entries()
    assert before == 10 and [e.kind for e in entries] == ["history", "rotation", "commit"]
    assert {p[0] for p in entries[0].pubs} == {f"pub-{i}" for i in range(5)}
    assert not list((root / "log").glob("updates-*.bin"))  # replay reads the rotation only
    again = asyncio.run(party.admin.updates(batches[1], "pub-1"))
    assert again["duplicate"] and again["epoch_id"] == 3
    assert served(links) == {rot["identity"]}
    # a replica started now replays one entry
    assert start_replica(snaps / "base", 1, EpochLog(root / "log")).replayed == 1


class _HeldLog:
    """A log another publisher holds: `holders` names its undecided proposal at each read."""

    durable = True

    def __init__(self, holders: list[tuple[int, str, str]], left_s: float = 5.0) -> None:
        self.holders, self.left_s, self.reads = list(holders), left_s, 0

    def propose(self, *args: object) -> str:
        self.reads += 1
        if self.holders:
            raise EpochLogBusy("busy", self.left_s, self.holders.pop(0))
        return "proposed"


def _waits(log: _HeldLog, monkeypatch: pytest.MonkeyPatch, read_s: float = 0.0
           ) -> list[float]:
    """What a publisher sleeps between its reads of `log` until its proposal is appended,
    each read taking `read_s` by the clock that times them."""
    slept: list[float] = []
    ticks = iter(range(1000))
    monkeypatch.setattr(lease_module, "poll_clock", lambda: read_s * next(ticks))
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(publisher_module.asyncio, "sleep", sleep)
    party = SimpleNamespace(cfg=SimpleNamespace(admin_timeout_s=60.0, admin_failpoint_file=None),
                            epoch_log=log, unavailable=RuntimeError)
    pub = publisher_module.Publisher(party)  # type: ignore[arg-type]
    assert asyncio.run(pub._propose("pub-y", "req", lambda head, seq: None)) == "proposed"
    return slept


def test_a_waiting_publisher_reads_again_soon_after_the_log_moves(monkeypatch):
    """The other publisher's next proposal follows its decision within milliseconds: a waiter
    that read the log every 250 ms missed that gap again and again (issue 28's two-writer p99).
    Waits start short and start short again when the log moved; they grow only while one
    proposal stays undecided, and never run past its lease."""
    a, b = (3, "pub-a", "router-1"), (5, "pub-b", "router-1")
    log = _HeldLog([a] * 8 + [b, b])
    slept = _waits(log, monkeypatch)
    assert log.reads == 11 and len(slept) == 10
    on_a, on_b = slept[:8], slept[8:]
    assert on_a[0] <= 1.5 * FIRST_POLL_S and on_b[0] <= 1.5 * FIRST_POLL_S
    assert on_a[-1] >= 0.5 * MAX_POLL_S  # one proposal held long: fewer reads
    assert max(slept) <= 1.5 * MAX_POLL_S
    # the lease ends sooner than the next step: read again just after it, to abort it
    assert _waits(_HeldLog([a] * 8, left_s=0.002), monkeypatch)[-1] <= 0.012
    # a long log read slowly: never read more often than a read takes, whatever moved
    assert min(_waits(_HeldLog([a, b, a, b]), monkeypatch, read_s=0.05)) >= 0.025
