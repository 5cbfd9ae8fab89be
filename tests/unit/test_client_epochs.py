"""Rotations, updates and split parties as every client sees them: sync and async HTTP (JSON and
msgpack) and the handle client (sync and async), against fake parties that answer with the real
DPF over scripted data. Pages are compared byte for byte with the data they must come from."""

from __future__ import annotations

from typing import Any

import pytest
from _pir_fakes import FAST, KINDS, Client, Party, World

from morphogen.client import (
    DataMoved,
    EpochMismatchError,
    PageOutOfRange,
    PirError,
    PirUnavailable,
    RetryPolicy,
)
from morphogen.constants import key_length


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def clients():
    made: list[Client] = []

    def make(kind: str, a: Party, b: Party, **kw: Any) -> Client:
        made.append(Client(kind, a, b, **kw))
        return made[-1]

    yield make
    for c in made:
        c.close()


def _rotate(world: World, *parties: Party) -> None:
    for p in parties:
        p.world = world


def test_shrinking_rotation_never_answers_past_the_new_end(kind: str, clients) -> None:
    old, new = World(1, 37, 1), World(2, 33, 2)
    assert old.domain_bits == new.domain_bits  # the domain alone cannot tell the rotation
    a, b = Party(old), Party(old)
    c = clients(kind, a, b)
    assert c.info().num_pages == 37
    _rotate(new, a, b)
    with pytest.raises(PageOutOfRange) as exc:
        c.get([35])  # the servers answer it (all zeros): the client must not believe that
    assert isinstance(exc.value, IndexError) and isinstance(exc.value, PirError)
    assert (exc.value.page, exc.value.num_pages) == (35, 33)
    assert (a.epoch_reads, b.epoch_reads, len(a.sent)) == (2, 2, 1)  # refreshed once
    assert c.get([3, 32, 0]) == [new.page(3), new.page(32), new.page(0)]
    assert (a.epoch_reads, len(a.sent)) == (2, 2)
    with pytest.raises(PageOutOfRange):
        c.get([1, 33])
    assert len(a.sent) == len(b.sent) == 2  # refused before anything was sent


def test_pages_below_the_new_end_are_accepted_with_one_refresh(kind: str, clients) -> None:
    old, new = World(1, 37, 1), World(2, 33, 2)
    a, b = Party(old), Party(old)
    c = clients(kind, a, b)
    c.info()
    _rotate(new, a, b)
    assert c.get_with_epoch([0, 32, 5]) == (2, [new.page(0), new.page(32), new.page(5)])
    assert (a.epoch_reads, b.epoch_reads, len(a.sent), len(b.sent)) == (2, 2, 1, 1)
    info = c.info()
    assert (info.num_pages, info.epoch_id, info.identity) == (33, 2, new.digest)


def test_other_data_under_the_same_epoch_id_is_vouched_for_by_identity(kind: str,
                                                                       clients) -> None:
    """A snapshot rebuilt in place keeps its epoch id; only the identity tells. The answer is
    kept once /epoch shows both parties on exactly that data."""
    old, rebuilt = World(1, 37, 1), World(5, 37, 1)
    a, b = Party(old), Party(old)
    c = clients(kind, a, b)
    c.info()
    _rotate(rebuilt, a, b)
    assert c.get([4, 36]) == [rebuilt.page(4), rebuilt.page(36)]
    assert (a.epoch_reads, b.epoch_reads, len(a.sent)) == (2, 2, 1)
    assert c.info().identity == rebuilt.digest


def test_parties_serving_different_data_under_one_epoch_are_refused(kind: str,
                                                                    clients) -> None:
    a, b = Party(World(1, 37, 4)), Party(World(9, 37, 4))
    c = clients(kind, a, b)
    with pytest.raises(PirUnavailable, match="different data under epoch 4") as exc:
        c.get([1])
    assert not isinstance(exc.value, EpochMismatchError)
    assert len(a.sent) == len(b.sent) == FAST.attempts


def test_a_domain_change_refused_by_the_servers_replans_the_keys(kind: str, clients) -> None:
    old, new = World(1, 37, 1), World(2, 100, 2)
    a, b = Party(old), Party(old)
    c = clients(kind, a, b)
    c.info()
    _rotate(new, a, b)
    assert c.get([5, 36]) == [new.page(5), new.page(36)]  # bad_domain, /epoch, new keys
    assert [len(q[0][0]) for q in a.sent] == [key_length(6), key_length(7)]
    assert c.info().num_pages == 100
    assert c.get([99]) == [new.page(99)]


def test_a_domain_change_seen_only_in_the_answer_replans_the_keys(kind: str, clients) -> None:
    """The answer names data in another domain: it is not kept, even if it looks right."""
    old, new = World(1, 37, 1), World(2, 60, 2, domain_bits=7)
    a, b = Party(old, check_domain=False), Party(old, check_domain=False)
    c = clients(kind, a, b)
    c.info()
    _rotate(new, a, b)
    epoch, got = c.get_with_epoch([5, 36])
    assert (epoch, got) == (2, [new.page(5), new.page(36)])
    assert [len(q[0][0]) for q in b.sent] == [key_length(6), key_length(7)]
    assert (a.epoch_reads, b.epoch_reads) == (2, 2)


def test_an_answer_from_a_lagging_replica_is_asked_again(kind: str, clients) -> None:
    old, new = World(1, 37, 1), World(2, 37, 2)
    a, b = Party(new), Party(new)
    c = clients(kind, a, b)
    c.info()
    a.lagging, b.lagging = [old], [old]  # /epoch says 2, the first answers come from 1
    assert c.get_with_epoch([7, 8, 9]) == (2, [new.page(7), new.page(8), new.page(9)])
    assert (len(a.sent), a.epoch_reads) == (2, 2)


def test_answers_from_data_no_party_advertises_are_never_returned(kind: str,
                                                                  clients) -> None:
    old, new = World(1, 37, 1), World(2, 37, 2)
    a, b = Party(new), Party(new)
    c = clients(kind, a, b)
    c.info()
    a.lagging, b.lagging = [old] * 10, [old] * 10
    with pytest.raises(PirUnavailable):
        c.get([7])
    assert len(a.sent) == FAST.attempts


@pytest.mark.parametrize("rotate", [False, True])
def test_reference_servers_without_identity(kind: str, clients, rotate: bool) -> None:
    old, new = World(1, 37, 1, identity=False), World(2, 33, 2, identity=False)
    a, b = Party(old), Party(old)
    c = clients(kind, a, b)
    assert c.info().identity is None
    world = old
    if rotate:
        _rotate(new, a, b)
        world = new
        with pytest.raises(PageOutOfRange):
            c.get([34])
    assert c.get([0, 31, 2, 6]) == [world.page(p) for p in (0, 31, 2, 6)]
    assert a.epoch_reads == (2 if rotate else 1)


def test_one_party_without_identity_is_checked_by_epoch(kind: str, clients) -> None:
    a, b = Party(World(1, 37, 3)), Party(World(1, 37, 3, identity=False))
    c = clients(kind, a, b)
    assert c.get([10, 20]) == [a.world.page(10), a.world.page(20)]
    assert a.epoch_reads == 1


def test_epoch_mismatch_still_ends_in_epoch_mismatch_error(kind: str, clients) -> None:
    a, b = Party(World(1, 37, 1)), Party(World(1, 37, 2))
    c = clients(kind, a, b)
    with pytest.raises(EpochMismatchError, match="A 1, B 2"):
        c.get([1])


def test_a_grown_snapshot_is_found_through_the_next_answer(kind: str, clients) -> None:
    old, new = World(1, 37, 1), World(2, 50, 2)
    a, b = Party(old), Party(old)
    c = clients(kind, a, b)
    c.info()
    _rotate(new, a, b)
    with pytest.raises(PageOutOfRange):
        c.get([45])  # past the end the client knows: nothing sent, nothing refreshed
    assert (len(a.sent), a.epoch_reads) == (0, 1)
    assert c.get([3]) == [new.page(3)]
    assert c.get([45]) == [new.page(45)]


@pytest.mark.parametrize("grow", [False, True])
def test_a_pinned_read_follows_no_move_whichever_pages_it_wanted(kind: str, clients,
                                                                 grow: bool) -> None:
    """Pages below and past the new end alike: the same requests, then `DataMoved`."""
    seen = []
    for wanted in ([0, 1, 2], [34, 35, 36]):
        old, new = World(1, 37, 1), World(2, 100 if grow else 33, 2)
        a, b = Party(old), Party(old)
        c = clients(kind, a, b)
        assert c.get_pinned([5]) == (1, old.digest, [old.page(5)])
        _rotate(new, a, b)
        with pytest.raises(DataMoved) as exc:
            c.get_pinned(wanted)
        assert isinstance(exc.value, LookupError)
        seen.append((len(a.sent), len(b.sent), a.epoch_reads, b.epoch_reads))
        assert c.info().num_pages == new.num_pages  # /epoch was read again
    assert seen[0] == seen[1] == (2, 2, 2, 2)


def test_a_pinned_read_keeps_only_answers_from_the_data_it_planned_for(kind: str,
                                                                       clients) -> None:
    old, new = World(1, 37, 1), World(2, 37, 2)
    a, b = Party(new), Party(new)
    c = clients(kind, a, b)
    c.info()
    a.lagging, b.lagging = [old], [old]
    with pytest.raises(DataMoved):  # /epoch named only 2 when the keys were planned
        c.get_pinned([7])
    assert c.get_pinned([7, 8]) == (2, new.digest, [new.page(7), new.page(8)])
    sent = len(a.sent)
    with pytest.raises(DataMoved, match="37 pages, not 40"):  # planned for another size
        c.get_pinned([7], 40)
    assert len(a.sent) == sent


class _CatchingUp(Party):
    """A party that moves to `then` at its `after`-th /epoch read (its publication lands
    while the client waits)."""

    def __init__(self, world: World, then: World, after: int) -> None:
        super().__init__(world)
        self.then, self.after = then, after

    def epoch_doc(self) -> dict[str, Any]:
        if self.epoch_reads + 1 >= self.after:
            self.world = self.then
        return super().epoch_doc()


@pytest.mark.parametrize("poll", [0.002, 0.0])
def test_a_party_behind_is_waited_for_on_epoch(kind: str, clients, poll: float) -> None:
    old, new = World(1, 37, 1), World(1, 37, 2, pages=World(1, 37, 1).pages ^ 7)
    a, b = Party(new), _CatchingUp(old, new, after=3)
    c = clients(kind, a, b, retry=RetryPolicy(attempts=3, backoff_s=0.05, max_backoff_s=0.05,
                                              agreement_poll_s=poll))
    c.info()  # A at 2, B at 1 (an update reached A first)
    if poll == 0:  # backoffs slept whole: B's move is never seen
        with pytest.raises(EpochMismatchError, match="A 2, B 1"):
            c.get([5])
        return
    assert c.get_with_epoch([5, 30]) == (2, [new.page(5), new.page(30)])
    assert len(a.sent) == len(b.sent) == 2 and b.epoch_reads == 3  # one re-send, on agreement


def test_a_pinned_read_waited_for_agreement_still_follows_no_move(kind: str, clients) -> None:
    old, new = World(1, 37, 1), World(1, 37, 2, pages=World(1, 37, 1).pages ^ 7)
    a, b = Party(old), _CatchingUp(old, new, after=3)
    c = clients(kind, a, b, retry=RetryPolicy(attempts=4, backoff_s=0.05, max_backoff_s=0.05,
                                              agreement_poll_s=0.002))
    c.info()  # both at 1: the keys are planned for it
    a.world = new  # then an update reaches A, and B while the client waits
    with pytest.raises(DataMoved):
        c.get_pinned([5], 37)
    assert b.epoch_reads >= 3 and c.get_with_epoch([5]) == (2, [new.page(5)])
