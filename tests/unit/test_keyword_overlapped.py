"""Publishing with party B's leg of one version overlapping party A's leg of the next: every
version reaches A before B, each party takes them in order on the parent its last leg left,
a version is marked published only once B has it, and a failure at any leg is finished by a
re-run without applying anything twice."""

from __future__ import annotations

import hashlib
import random
import threading
from pathlib import Path

import numpy as np
import pytest
from _party_world import apply_batch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from morphogen.keyword import build_table
from morphogen.keyword.overlapped import OverlappedPublisher
from morphogen.keyword.owner import Change, OwnerTable, create_owner_dir
from morphogen.keyword.publishing import Form, publish
from morphogen.protocol.changes import ChangeBatch

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


class Refused(Exception):
    """A party's 409: the publication names a parent the party no longer serves."""


class Party:
    def __init__(self, pages: np.ndarray) -> None:
        self.pages = pages.copy()
        self.head = "genesis"
        self.log: dict[str, str] = {}  # publication -> the identity it made
        self.applied: list[str] = []

    def take(self, pub: str, batch, parent: str | None) -> dict:
        if pub in self.log:  # answered as done, whatever the parent
            return {"identity": self.log[pub], "duplicate": True}
        if parent is not None and parent != self.head:
            raise Refused(f"{pub}: parent {parent}, head {self.head}")
        self.pages = apply_batch(self.pages, batch)
        self.head = hashlib.sha256((self.head + pub).encode()).hexdigest()[:16]
        self.log[pub] = self.head
        self.applied.append(pub)
        return {"identity": self.head}


class Parties:
    """Two in-memory parties taking legs as `cluster.parties.HttpParties` sends them."""

    def __init__(self, pages: np.ndarray) -> None:
        self.parties = [Party(pages), Party(pages)]
        self.events: list[tuple[str, int, int]] = []  # (start/end, party, version)
        self.hook = lambda party, version: None  # called as a leg starts
        self.heads: list[str | None] | None = None
        self.lock = threading.Lock()

    def max_updates(self) -> int:
        return 10_000

    def digest_version(self) -> int:
        return 2

    def updates(self, publication, batch):
        raise AssertionError("the overlapped publisher sends legs")

    snapshot = updates

    def parents(self, publication: str) -> list[str | None]:
        if self.heads is not None:
            return list(self.heads)
        a, b = self.parties
        if a.head == b.head or publication in a.log or publication in b.log:
            return [a.head, b.head]
        raise Refused("the parties apart")

    def leg(self, party: int, form: Form, parent: str | None) -> dict:
        with self.lock:
            self.events.append(("start", party, form.version))
        self.hook(party, form.version)
        out = self.parties[party].take(form.publication, form.batch, parent)
        with self.lock:
            self.events.append(("end", party, form.version))
        return out

    def settled(self, identities) -> None:
        self.heads = list(identities) if identities is not None else None


def _b_fails_once(parties: Parties, version: int) -> None:
    """Party B's leg of `version` raises, the first time only."""
    failures = {(1, version)}

    def hook(party: int, v: int) -> None:
        if (party, v) in failures:
            failures.discard((party, v))
            raise ConnectionError("party B unreachable")

    parties.hook = hook


def _owner(tmp_path: Path, versions: int) -> tuple[OwnerTable, np.ndarray]:
    rng = random.Random(4)
    recs = {rng.randbytes(20): rng.randbytes(32) for _ in range(300)}
    table = build_table(recs.items(), value_size=32, signing_key=KEY, load=0.7)
    create_owner_dir(table, tmp_path / "o")
    owner = OwnerTable(tmp_path / "o")
    for _ in range(versions):
        owner.apply([Change("put", k, rng.randbytes(32)) for k in rng.sample(sorted(recs), 5)],
                    KEY, rng=rng.randrange)
    return owner, table.pages


def test_b_takes_a_version_while_a_takes_the_next(tmp_path: Path) -> None:
    owner, pages = _owner(tmp_path, 4)
    parties = Parties(pages)
    a_took: dict[int, threading.Event] = {v: threading.Event() for v in range(1, 6)}

    def hook(party: int, version: int) -> None:
        if party == 0:
            return
        # B's leg of v goes on only once A is taking v + 1: overlapped, or this fails
        if version < owner.current and not a_took[version + 1].wait(10):
            raise AssertionError(f"A never took version {version + 1} during B's {version}")

    parties.hook = hook
    original = parties.leg

    def leg(party: int, form: Form, parent):
        if party == 0:
            a_took[form.version].set()
        return original(party, form, parent)

    parties.leg = leg
    done = []
    pub = OverlappedPublisher(OwnerTable(owner.root), parties, done=done.append)
    pub.push()
    pub.wait()
    owner.reload()
    assert owner.published == owner.current
    assert [p.version for p in done] == list(range(2, owner.current + 1))  # 1: the build
    for v in range(2, owner.current + 1):  # A before B, each party in order
        assert parties.events.index(("end", 0, v)) < parties.events.index(("start", 1, v))
    for party in (0, 1):
        taken = [v for kind, p, v in parties.events if p == party and kind == "start"]
        assert taken == sorted(taken)
    a, b = parties.parties
    assert a.applied == b.applied and len(a.applied) == owner.current - 1
    assert a.head == b.head
    assert np.array_equal(a.pages, owner.pages()) and np.array_equal(b.pages, owner.pages())
    pub.close()


def test_a_failed_b_leg_is_finished_by_a_rerun_without_a_version_twice(tmp_path: Path) -> None:
    owner, pages = _owner(tmp_path, 4)
    parties = Parties(pages)
    _b_fails_once(parties, 3)  # B down, the process killed
    first = OverlappedPublisher(OwnerTable(owner.root), parties)
    with pytest.raises(ConnectionError):
        first.push()
        first.wait()
    owner.reload()
    a, b = parties.parties
    assert owner.published == 2  # B had only version 2: nothing after it is marked
    assert len(b.applied) == 1 and 2 <= len(a.applied) <= 3  # A at most two ahead
    assert parties.heads is None  # nothing assumed: the next push reads both heads
    first.close()
    # a re-run, as a restarted follower makes it (A answers what it has as done)
    again = OverlappedPublisher(OwnerTable(owner.root), parties)
    again.push()
    again.wait()
    owner.reload()
    assert owner.published == owner.current
    assert a.applied == b.applied and len(set(a.applied)) == owner.current - 1
    assert a.head == b.head
    assert np.array_equal(b.pages, owner.pages())
    again.close()


def test_a_party_moved_by_another_publisher_refuses_and_b_never_gets_it(tmp_path: Path) -> None:
    owner, pages = _owner(tmp_path, 1)
    parties = Parties(pages)
    pub = OverlappedPublisher(OwnerTable(owner.root), parties)
    pub.push()
    pub.wait()
    a, b = parties.parties
    # moved A between our publications
    a.take("another-publisher", ChangeBatch.from_triples([]), a.head)
    rng = random.Random(5)
    key = next(iter(OwnerTable(owner.root).records()))[0]
    owner.apply([Change("put", key, rng.randbytes(32))], KEY, rng=rng.randrange)
    with pytest.raises(Refused):
        pub.push()
    owner.reload()
    assert owner.published == owner.current - 1
    assert owner.publication_id(owner.current) not in b.log
    assert owner.publication_id(owner.current) not in a.log
    # the plain publisher then sees the parties apart and sends nothing either
    with pytest.raises(Refused):
        parties.parents(owner.publication_id(owner.current))
    pub.close()


class Both:
    """`publish`'s view of the same two parties: A then B, one version at a time."""

    def __init__(self, parties: Parties) -> None:
        self.parties = parties

    def max_updates(self) -> int:
        return self.parties.max_updates()

    def digest_version(self) -> int:
        return 2

    def updates(self, publication, batch):
        a, b = self.parties.parties
        heads = self.parties.parents(publication)
        out = [a.take(publication, batch, heads[0]), b.take(publication, batch, heads[1])]
        self.parties.settled([r["identity"] for r in out])
        return out


def test_the_overlapped_publisher_goes_on_after_the_plain_one_published(tmp_path: Path) -> None:
    """A follower publishes what a failure left with the plain publisher (`publish_pending`),
    then the next block with the overlapped one: that one reads the heads again
    (`forget`), where it named the parent its own last leg left and A refused it (409)."""
    owner, pages = _owner(tmp_path, 1)
    parties = Parties(pages)
    over = OverlappedPublisher(OwnerTable(owner.root), parties)
    over.push()
    over.wait()
    rng = random.Random(9)
    keys = sorted(OwnerTable(owner.root).keys())
    for _ in range(2):  # a version made, its push never sent; the plain publisher sends it
        owner.apply([Change("put", k, rng.randbytes(32)) for k in rng.sample(keys, 3)], KEY,
                    rng=rng.randrange)
        publish(OwnerTable(owner.root), Both(parties))  # settles the heads it left
        over.forget()
        owner.apply([Change("put", k, rng.randbytes(32)) for k in rng.sample(keys, 3)], KEY,
                    rng=rng.randrange)
        over.push()
        over.wait()
    over.close()
    owner.reload()
    a, b = parties.parties
    assert owner.published == owner.current == 6
    assert a.applied == b.applied and len(a.applied) == 5
    assert np.array_equal(b.pages, owner.pages())


def test_the_plain_publisher_finishes_what_the_overlapped_one_left(tmp_path: Path) -> None:
    owner, pages = _owner(tmp_path, 3)
    parties = Parties(pages)
    _b_fails_once(parties, 3)
    over = OverlappedPublisher(OwnerTable(owner.root), parties)
    with pytest.raises(ConnectionError):
        over.push()
        over.wait()
    over.close()

    publish(OwnerTable(owner.root), Both(parties))
    owner.reload()
    a, b = parties.parties
    assert owner.published == owner.current
    assert a.applied == b.applied and len(set(a.applied)) == owner.current - 1
    assert np.array_equal(b.pages, owner.pages())
