"""The party logic without Ray: in-process shards (ShardCore) behind `ShardLink`s, a real epoch
log on disk. Answers carry the identity of their data; a shard on other data under the same
epoch id is refused, never XORed; publications are logged first and a restarted shard replays
the log to the party's identity."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from functools import cached_property
from pathlib import Path

import numpy as np
import pytest
from _party_world import (
    NUM_PAGES,
    apply_batch,
    ask,
    ask_async,
    cfg_for,
    commit_in_log,
    make_party,
    make_world,
    random_batch,
    start_replica,
    start_shard,
)

from morphogen.party.admin_status import party_status
from morphogen.party.replica import ShardReplica
from morphogen.party.router import Party
from morphogen.party.shard import ShardCore
from morphogen.protocol import dpf
from morphogen.protocol.changes import ChangeBatch, PageUpdate
from morphogen.protocol.codec import ErrorCode, WireError
from morphogen.publication.log import EpochLog, EpochLogError
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages


@pytest.fixture
def world(tmp_path: Path):
    return make_world(tmp_path)


def test_answers_carry_the_identity_and_the_right_pages(world):
    _, snaps = world
    party, links = make_party(snaps, None)
    model = synthetic_pages(3, 0, NUM_PAGES)
    answer, pages = ask(party, model, [0, 47, 48, 95])
    assert pages == [model[t].tobytes() for t in (0, 47, 48, 95)]
    doc = asyncio.run(party.epoch())
    assert answer["epoch_id"] == doc["epoch_id"] == 1
    assert answer["identity"] == doc["identity"] == links[0].core.identity.digest


def test_same_epoch_id_on_other_data_is_refused_not_xored(world):
    """A replica restarted on a snapshot rebuilt in place under the same epoch id."""
    _, snaps = world
    party, links = make_party(snaps, None)
    build_synthetic(snaps / "rebuilt", NUM_PAGES, seed=99, epoch_id=1, progress=False)
    links[1].core = ShardCore.open(Snapshot.open(snaps / "rebuilt"), 1, 2, "cpu")
    assert links[1].core.epoch_id == links[0].core.epoch_id == 1
    with pytest.raises(WireError) as err:
        ask(party, synthetic_pages(3, 0, NUM_PAGES), [5])
    assert err.value.status == 503 and "consistent epoch" in err.value.message
    with pytest.raises(WireError) as err:
        asyncio.run(party.epoch())
    assert err.value.status == 503


def test_restarted_shards_replay_50_updates_and_a_rotation(world):
    root, snaps = world
    log_dir = root / "log-a"
    party, links = make_party(snaps, log_dir)
    rng = np.random.default_rng(8)
    model = synthetic_pages(3, 0, NUM_PAGES)
    for i in range(50):
        batch = random_batch(rng, 1 + i % 3, model.shape[0])
        out = asyncio.run(party.admin.updates(batch))
        model = apply_batch(model, batch)
        assert out["epoch_id"] == i + 2 + (i > 30)  # the rotation took epoch 33
        if i == 30:
            rot = asyncio.run(party.admin.snapshot("next"))
            assert rot["epoch_id"] == 33
            model = synthetic_pages(4, 0, 70)
    head = links[0].core.identity
    assert links[1].core.identity == head
    # both replicas die and come back from the configured snapshot: the log brings them back
    for i, link in enumerate(links):
        link.core.close()
        link.core = start_shard(snaps / "base", i, EpochLog(log_dir))
        assert link.core.identity == head
    answer, pages = ask(party, model, [0, 35, 69])
    assert answer["identity"] == head.digest
    assert pages == [model[t].tobytes() for t in (0, 35, 69)]
    # the log holds the rotation and the 19 batches after it
    assert [e.kind for e in EpochLog(log_dir).live()] == ["rotation"] + ["updates"] * 19


def test_a_failed_publication_is_aborted_in_the_log(world):
    root, snaps = world
    party, links = make_party(snaps, root / "log")
    bad = ChangeBatch.from_changes([PageUpdate(NUM_PAGES + 5, bytes(4096))])
    with pytest.raises(WireError) as err:
        asyncio.run(party.admin.updates(bad))
    assert err.value.status == 400
    assert EpochLog(root / "log").entries() == []  # refused before the log

    async def broken(*args):
        raise RuntimeError("disk gone")

    # a prepare that fails on a shard: aborted everywhere and decided aborted in the log
    links[1].prepare_updates = broken
    with pytest.raises(WireError) as err:
        asyncio.run(party.admin.updates(random_batch(np.random.default_rng(1), 2, NUM_PAGES)))
    assert err.value.status == 503
    assert EpochLog(root / "log").live() == []
    assert [e.kind for e in EpochLog(root / "log").entries()] == ["updates", "abort"]
    assert links[0].core.epoch_id == 1 and links[0].core.state.staged is None


def test_a_publication_committed_in_the_log_is_served_though_no_shard_got_it(world):
    root, snaps = world
    party, links = make_party(snaps, root / "log")
    rng = np.random.default_rng(2)
    first = random_batch(rng, 2, NUM_PAGES)
    target = commit_in_log(EpochLog(root / "log"), links[0].core.identity, first)
    model = apply_batch(synthetic_pages(3, 0, NUM_PAGES), first)
    answer, pages = ask(party, model, [int(p) for p in first.pages])
    assert answer["identity"] == target.digest
    assert pages == [model[int(p)].tobytes() for p in first.pages]
    second = random_batch(rng, 2, NUM_PAGES)
    out = asyncio.run(party.admin.updates(second))
    assert out["epoch_id"] == 3
    model = apply_batch(model, second)
    _, pages = ask(party, model, [int(p) for p in second.pages])
    assert pages == [model[int(p)].tobytes() for p in second.pages]


def test_a_log_of_other_data_or_a_corrupt_log_refuses_the_start(world):
    root, snaps = world
    party, links = make_party(snaps, root / "log")
    asyncio.run(party.admin.updates(random_batch(np.random.default_rng(5), 3, NUM_PAGES)))
    # the configured snapshot rebuilt in place (forced) under the same epoch id
    shutil.rmtree(snaps / "base")
    build_synthetic(snaps / "base", NUM_PAGES, seed=77, epoch_id=1, progress=False)
    with pytest.raises(EpochLogError, match="derived"):
        start_shard(snaps / "base", 0, EpochLog(root / "log"))
    # a flipped byte in the log itself
    log_file = next(p for p in (root / "log").iterdir() if not p.name.startswith("updates"))
    raw = bytearray(log_file.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    log_file.write_bytes(bytes(raw))
    with pytest.raises(EpochLogError):
        start_shard(snaps / "base", 0, EpochLog(root / "log"))


def test_keys_of_a_domain_the_shards_left_are_refused_and_the_layout_refreshed(world):
    """Another router rotated the shards to a bigger domain: this party's cached layout still
    validates the old keys; the shards refuse them (400, never a 500) and the layout moves."""
    _, snaps = world
    party, links = make_party(snaps, None)

    async def scenario():
        layout = await party.layout()
        assert layout.domain_bits == 7
        build_synthetic(snaps / "bigger", 200, seed=9, epoch_id=5, progress=False)
        for link in links:
            link.core.prepare_snapshot(5, snaps / "bigger", op="other router")
            link.core.commit(5, op="other router")
        keys = [dpf.generate_keys(7, 3)[0].to_bytes()] * 3
        with pytest.raises(WireError) as err:
            await party.query(keys)
        assert (err.value.status, err.value.code) == (400, ErrorCode.BAD_DOMAIN)
        deadline = time.monotonic() + 30  # the refresh runs in the background
        while (await party.layout()).domain_bits != 8 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert (await party.layout()).num_pages == 200

    asyncio.run(scenario())


# ---------------------------------------------------------------- several replicas per shard


def test_replicas_a_publication_missed_catch_up_when_a_scan_wants_more(world):
    """Three replicas per shard; one of each shard misses six update batches, a rotation and
    four more batches (a broadcast did not reach it). Scans ask for the party's identity, so
    each lagging replica replays the log before it answers: every page right, one identity."""
    root, snaps = world
    party, links = make_party(snaps, root / "log", replicas=3)
    links[0].unreachable, links[1].unreachable = {1}, {2}
    rng = np.random.default_rng(11)
    model = synthetic_pages(3, 0, NUM_PAGES)
    for _ in range(6):
        batch = random_batch(rng, 2, model.shape[0])
        asyncio.run(party.admin.updates(batch))
        model = apply_batch(model, batch)
    asyncio.run(party.admin.snapshot("next"))
    model = synthetic_pages(4, 0, 70)
    for _ in range(4):
        batch = random_batch(rng, 2, model.shape[0])
        out = asyncio.run(party.admin.updates(batch))
        model = apply_batch(model, batch)
    assert links[0].members[1].core.epoch_id == 1 and links[1].members[2].core.epoch_id == 1
    assert party.want is not None and party.want.digest == out["identity"]
    links[0].unreachable = links[1].unreachable = set()
    for round_ in range(3):  # round robin: every replica of both shards answers once
        targets = [int(t) for t in rng.integers(0, 70, 4)]
        answer, pages = ask(party, model, targets)
        assert answer["identity"] == out["identity"], round_
        assert pages == [model[t].tobytes() for t in targets]
    assert {m.core.identity.digest for link in links for m in link.members} == {out["identity"]}


def test_a_replica_started_after_the_append_takes_the_publication_as_done(world):
    """The decision is written before the commit: a replica that started in between has
    replayed it, so its prepare and commit must be no-ops, not a conflict."""
    root, snaps = world
    epoch_log = EpochLog(root / "log")
    old = start_replica(snaps / "base", 0, epoch_log)
    batch = random_batch(np.random.default_rng(4), 3, NUM_PAGES)
    target = commit_in_log(epoch_log, old.core.identity, batch, "op-1")
    new = start_replica(snaps / "base", 0, epoch_log)
    assert new.core.identity == target and new.replayed == 1

    async def publish():
        for r in (old, new):
            await r.prepare_updates(2, batch, 1, "op-1", target.digest)
        for r in (old, new):
            await r.commit(2, "op-1", target.digest)

    asyncio.run(publish())
    assert old.core.identity == new.core.identity == target
    assert old.core.state.info()["staged_epoch_id"] is None
    assert new.core.state.info()["staged_epoch_id"] is None


def test_a_replica_that_cannot_catch_up_answers_503_and_another_one_answers(world):
    root, snaps = world
    party, links = make_party(snaps, root / "log", replicas=2)
    stuck = ShardReplica(links[0].members[1].core, None, catch_up_wait_s=0)  # no log to read
    links[0].members[1] = stuck
    links[0].unreachable = {1}
    batch = random_batch(np.random.default_rng(6), 3, NUM_PAGES)
    out = asyncio.run(party.admin.updates(batch))
    model = apply_batch(synthetic_pages(3, 0, NUM_PAGES), batch)
    for _ in range(4):  # the stuck replica is asked every other round: the retry goes on
        answer, pages = ask(party, model, [1, 50, 90])
        assert answer["identity"] == out["identity"]
        assert pages == [model[t].tobytes() for t in (1, 50, 90)]
    keys = dpf.generate_keys(7, 3)[0]
    with pytest.raises(WireError) as err:
        asyncio.run(stuck.scan(dpf.KeyBatch.from_keys([keys]), party.want))
    assert err.value.status == 503 and "catching up" in err.value.message
    assert stuck.core.epoch_id == 1


def test_a_router_that_did_not_publish_moves_to_what_another_published(world):
    """Two router replicas over the same shards: B learns A's publication from the answers
    and from then on asks for it (so replicas behind it catch up)."""
    root, snaps = world
    party_a, links = make_party(snaps, root / "log", replicas=2)
    party_b = Party(cfg_for(snaps, root / "log"), links, EpochLog(root / "log"))
    model = synthetic_pages(3, 0, NUM_PAGES)
    first, _ = ask(party_b, model, [7])
    assert party_b.want.digest == first["identity"]  # the configured snapshot's
    batch = random_batch(np.random.default_rng(9), 2, NUM_PAGES)
    out = asyncio.run(party_a.admin.updates(batch))
    model = apply_batch(model, batch)
    answer, pages = ask(party_b, model, [int(batch.pages[0]), 7])
    assert answer["identity"] == out["identity"] == party_b.want.digest
    assert pages == [model[int(batch.pages[0])].tobytes(), model[7].tobytes()]
    status = asyncio.run(party_status(party_a.admin))
    assert [len(s["replicas"]) for s in status["shards"]] == [2, 2]
    assert status["wanted_identity"] == out["identity"]
    assert status["admin_max_updates"] == 1024  # what an owner's publish sizes its batches by


def test_a_publication_re_sent_to_another_router_without_a_log_is_never_applied_twice(world):
    """Without a log a publication id lived in one router replica's memory: re-sent after that
    router restarted (the admin client re-sends on its 500) or to a second router replica, it
    was applied again and the XOR diffs cancelled on one party only (issue 28, hole 1). Such
    a party now refuses publications, naming the setting that makes them safe."""
    _, snaps = world
    first, links = make_party(snaps, None)
    again = Party(cfg_for(snaps, None), links, None)  # restarted, or another replica
    batch = ChangeBatch.from_changes([PageUpdate(p, bytes([p + 1]) * 4096) for p in (3, 50)])
    outcomes: list[dict | WireError] = []
    for router in (first, again):
        try:
            outcomes.append(asyncio.run(router.admin.updates(batch, "pub-x")))
        except WireError as err:
            outcomes.append(err)
    applied = [o for o in outcomes if isinstance(o, dict) and not o.get("duplicate")]
    assert len(applied) <= 1, "one publication id applied twice"
    model = synthetic_pages(3, 0, NUM_PAGES)
    if applied:
        model = apply_batch(model, batch)
    assert ask(again, model, [3, 50])[1] == [model[3].tobytes(), model[50].tobytes()]
    for refused in (o for o in outcomes if isinstance(o, WireError)):
        assert refused.status == 403 and refused.code == "forbidden"
        assert "need epoch_log_dir" in refused.message and "applied twice" in refused.message


def test_a_publication_hashes_its_batch_off_the_event_loop(world):
    """The batch's digest (4 KiB a page changed) is computed in a thread: a query on the same
    loop is answered while it runs. Were it computed on the loop, the digest below would wait
    for a query that cannot start, and fail."""
    root, snaps = world
    party, _ = make_party(snaps, root / "log-digest")
    model = synthetic_pages(3, 0, NUM_PAGES)
    answered = threading.Event()

    class SlowDigest(ChangeBatch):
        @cached_property
        def digest(self) -> str:
            assert answered.wait(30), "the digest held the event loop"
            return ChangeBatch(self.pages, self.replace, self.data).digest

    batch = random_batch(np.random.default_rng(12), 3, NUM_PAGES)
    slow = SlowDigest(batch.pages, batch.replace, batch.data)

    async def run():
        publishing = asyncio.ensure_future(party.admin.updates(slow))
        _, pages = await ask_async(party, model, [7])
        answered.set()
        return pages, await publishing

    pages, out = asyncio.run(run())
    assert pages == [model[7].tobytes()] and out["epoch_id"] == 2
    after = apply_batch(model, batch)
    assert ask(party, after, [7, NUM_PAGES - 1])[1] == [after[p].tobytes()
                                                      for p in (7, NUM_PAGES - 1)]
