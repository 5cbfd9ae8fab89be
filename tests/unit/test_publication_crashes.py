"""Randomized crash test of publication (docs/publication.md): two parties, two routers each,
shard replicas added and removed, a router that dies at a random step of a random publication
while the admin re-sends it to the other router, and now and then a second publication racing
it. After every publication: both parties on one identity, every acknowledged publication
applied exactly once, every page read equal to the model of the identity it was answered
from, and reads served again within the bound.

Seeded and reproducible: MORPHOGEN_CRASH_SEED and MORPHOGEN_CRASH_SCENARIOS pick another run;
the scenario count and the longest outage are printed."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import numpy as np
from _party_world import (
    apply_batch,
    cfg_for,
    make_party,
    make_world,
    random_batch,
    start_replica,
)

from morphogen.party.router import Party
from morphogen.protocol import dpf
from morphogen.protocol.codec import WireError
from morphogen.publication.log import EpochLog
from morphogen.snapshot.synthetic import synthetic_pages

LEASE_S = 0.3
OUTAGE_BOUND_S = 15.0
STEPS = ("proposed", "some-prepares", "prepared", "decided", "mid-commit", None)
SNAPSHOTS = {"base": (3, 96), "next": (4, 70)}  # name: (synthetic seed, pages)


class World:
    def __init__(self, root: Path, snaps: Path) -> None:
        self.snaps = snaps
        self.parties = {}
        for name in "ab":
            log_dir = root / f"log-{name}"
            r1, links = make_party(snaps, log_dir, replicas=2, admin_lease_s=LEASE_S)
            r2 = Party(cfg_for(snaps, log_dir, admin_lease_s=LEASE_S), links, EpochLog(log_dir))
            self.parties[name] = ([r1, r2], links, log_dir)
        self.base = r1.shards[0].core.identity.digest
        self.models = {self.base: synthetic_pages(3, 0, 96)}  # identity -> pages
        self.frozen: list[asyncio.Future] = []
        self.published: dict[str, object] = {}  # pub -> its batch or snapshot name
        self.outage = 0.0
        self.crashes: dict[str, int] = {}

    def crash(self, router: Party, links, step: str) -> asyncio.Event:
        """Make `router` die at `step` of its next publication."""
        reached = asyncio.Event()

        async def forever(*args):
            router.admin.halt()
            reached.set()
            await asyncio.Event().wait()

        async def pause(name: str) -> None:
            if name == step:
                await forever()

        router.admin.pause = pause
        if step == "some-prepares":
            links[1].prepare_updates = links[1].prepare_snapshot = forever
        elif step == "mid-commit":
            links[1].commit = forever
        return reached

    @staticmethod
    def revive(router: Party, links) -> None:
        router.admin.pause = None
        for name in ("prepare_updates", "prepare_snapshot", "commit"):
            links[1].__dict__.pop(name, None)

    def churn(self, rng: np.random.Generator, links, log_dir: Path) -> None:
        link = links[int(rng.integers(0, 2))]
        index = links.index(link)
        if rng.random() < 0.5 and len(link.members) > 1:
            link.members.pop(int(rng.integers(0, len(link.members))))
        else:
            link.members.append(start_replica(self.snaps / "base", index, EpochLog(log_dir)))

    def settle(self) -> None:
        """The model of every identity committed in either log, applied in log order."""
        for _, _, log_dir in self.parties.values():
            model = self.models[self.base]
            for entry in EpochLog(log_dir).live():
                if entry.identity in self.models:
                    model = self.models[entry.identity]
                    continue
                if entry.kind == "rotation":
                    seed, pages = SNAPSHOTS[Path(entry.path or "").name]
                    model = synthetic_pages(seed, 0, pages)
                else:
                    assert model is not None
                    model = apply_batch(model, self.published[entry.pub])
                self.models[entry.identity] = model

    async def read(self, party: Party, rng: np.random.Generator) -> str:
        """One read, every page checked against the model of the identity it names (the B
        half is computed from that model)."""
        targets = [int(p) for p in rng.integers(0, 70, 3)]  # inside every snapshot
        pairs = [dpf.generate_keys(7, t) for t in targets]  # 70 and 96 pages: 7 bits
        answer = await party.query([a.to_bytes() for a, _ in pairs])
        ident = answer["identity"]
        if ident not in self.models:
            self.settle()  # a publication committed meanwhile (the crash came after it)
        assert ident in self.models, "an answer from data that was never published"
        model = self.models[ident]
        for (_, kb), t, pa in zip(pairs, targets, answer["pages"], strict=True):
            masks = np.stack([np.frombuffer(kb.eval(p), np.uint8)
                              for p in range(model.shape[0])])
            pb = np.bitwise_xor.reduce(model & np.tile(masks, (1, 256)), axis=0)
            assert (np.frombuffer(pa, np.uint8) ^ pb).tobytes() == model[t].tobytes(), \
                "a wrong page was accepted"
        return ident

    async def read_until_served(self, party: Party, rng, want: str | None = None) -> None:
        started = time.monotonic()
        while True:
            try:
                ident = await self.read(party, rng)
                if want is None or ident == want:
                    break
            except WireError as err:
                assert err.status == 503, err
            assert time.monotonic() - started < OUTAGE_BOUND_S, "party not serving again"
            await asyncio.sleep(0.05)
        self.outage = max(self.outage, time.monotonic() - started)


async def _publish(router: Party, kind: str, arg, pub: str) -> dict:
    if kind == "rotation":
        return await router.admin.snapshot(arg, pub)
    return await router.admin.updates(arg, pub)


async def _scenario(w: World, rng: np.random.Generator, i: int, current: dict) -> None:
    """One publication to both parties, perhaps with a crash, churn and a racing publication."""
    pub = f"pub-{i}"
    if rng.random() < 0.15:
        kind, arg = "rotation", ("next" if current["snapshot"] == "base" else "base")
    else:
        kind, arg = "updates", random_batch(rng, 1 + i % 3, SNAPSHOTS[current["snapshot"]][1])
    w.published[pub] = arg
    crash_in = "ab"[int(rng.integers(0, 2))]
    step = STEPS[int(rng.integers(0, len(STEPS)))]
    racing = kind == "updates" and rng.random() < 0.25
    outs = {}
    for name in "ab":
        routers, links, log_dir = w.parties[name]
        r1, r2 = routers[i % 2], routers[(i + 1) % 2]
        if name == crash_in and step is not None:
            w.crashes[step] = w.crashes.get(step, 0) + 1
            reached = w.crash(r1, links, step)
            w.frozen.append(asyncio.ensure_future(_publish(r1, kind, arg, pub)))
            await reached.wait()
            w.revive(r1, links)
            if rng.random() < 0.5:
                w.churn(rng, links, log_dir)
            await w.read_until_served(r2, rng)
            # the admin got no answer: it re-sends the same publication to the other router
            outs[name] = await _publish(r2, kind, arg, pub)
        elif racing:
            # the admin timed out on r1 and re-sent to r2 while r1 still works: two
            # publishers of one publication at once
            both = await asyncio.gather(_publish(r1, kind, arg, pub), _publish(r2, kind, arg, pub))
            assert both[0]["identity"] == both[1]["identity"]
            assert sum(1 for o in both if o.get("duplicate")) == 1
            outs[name] = both[0]
        else:
            outs[name] = await _publish(r1, kind, arg, pub)
        if rng.random() < 0.2:
            w.churn(rng, links, log_dir)
    current["identity"] = _check_logs(w, outs)
    if kind == "rotation":
        current["snapshot"] = arg
    for name in "ab":
        routers, links, _ = w.parties[name]
        for router in routers:
            await w.read_until_served(router, rng, current["identity"])


def _check_logs(w: World, outs: dict) -> str:
    """Both parties acknowledged one identity, their logs hold one history, each publication
    once; returns the head identity."""
    a_log, b_log = (EpochLog(w.parties[n][2]).live() for n in "ab")
    assert [e.identity for e in a_log] == [e.identity for e in b_log], "parties diverged"
    assert outs["a"]["identity"] == outs["b"]["identity"] == a_log[-1].identity
    for entries in (a_log, b_log):
        pubs = [e.pub for e in entries]
        assert len(pubs) == len(set(pubs)), "a publication applied twice"
    w.settle()
    return a_log[-1].identity


def test_publications_survive_a_crash_at_every_step(tmp_path: Path) -> None:
    seed = int(os.environ.get("MORPHOGEN_CRASH_SEED", "20261123"))
    count = int(os.environ.get("MORPHOGEN_CRASH_SCENARIOS", "30"))
    rng = np.random.default_rng(seed)
    root, snaps = make_world(tmp_path)
    w = World(root, snaps)
    current = {"identity": next(iter(w.models)), "snapshot": "base"}

    async def run() -> None:
        try:
            for i in range(count):
                await _scenario(w, rng, i, current)
        finally:
            for task in w.frozen:
                task.cancel()

    asyncio.run(run())
    print(f"\ncrash test: {count} scenarios (seed {seed}), longest read outage "
          f"{w.outage:.2f}s (bound {OUTAGE_BOUND_S}s), crashes by step {w.crashes}")
    assert set(w.crashes) == set(STEPS) - {None}, "a step boundary was never crashed at"
