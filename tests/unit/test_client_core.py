"""The client's protocol core driven by hand: no transport, every action and reply explicit."""

from __future__ import annotations

import pytest

from morphogen.client.core import (
    ClientCore,
    ReadEpoch,
    RetryPolicy,
    Send,
    Sleep,
    drive,
)
from morphogen.client.wire import (
    Answer,
    EpochMismatchError,
    PageOutOfRange,
    PirError,
    PirUnavailable,
    ServerInfo,
    Transient,
    View,
    answer_from_obj,
    info_from_epoch,
)
from morphogen.constants import key_length

FAST = RetryPolicy(attempts=3, backoff_s=0.01, max_backoff_s=0.5)
IDENT_1 = "0x" + "11" * 16
IDENT_2 = "0x" + "22" * 16


def doc(epoch: int, num_pages: int = 37, domain_bits: int = 6, identity: str | None = None,
        max_batch: int = 4) -> dict:
    out = {"epoch_id": epoch, "page_pir": {"num_pages": num_pages, "domain_bits": domain_bits,
                                           "max_batch_queries": max_batch}}
    if identity:
        out["identity"] = identity
    return out


def page(n: int) -> bytes:
    return bytes([n % 251]) * 4096


def answers(send: Send, epoch: int, wanted: list[int], identity: str | None = None,
            identity_b: str | None = None, epoch_b: int | None = None) -> tuple[Answer, Answer]:
    """Answers whose XOR is `page(p)` for each wanted page (A's are zeros)."""
    n = 3 * len(send.queries_a)
    b_pages = [page(p) for p in wanted] + [bytes(4096)] * (n - len(wanted))
    return (Answer(epoch, identity, [bytes(4096)] * n),
            Answer(epoch if epoch_b is None else epoch_b,
                   identity if identity_b is None else identity_b, b_pages))


def test_a_get_is_a_conversation_of_actions() -> None:
    core = ClientCore(FAST)
    machine = core.get([5, 9])
    assert isinstance(next(machine), ReadEpoch)
    send = machine.send((doc(1, identity=IDENT_1), doc(1, identity=IDENT_1)))
    assert isinstance(send, Send) and len(send.queries_a) == len(send.queries_b) == 1
    assert all(len(k) == key_length(6) for k in send.queries_a[0] + send.queries_b[0])
    with pytest.raises(StopIteration) as done:
        machine.send(answers(send, 1, [5, 9], IDENT_1))
    assert done.value.value == [page(5), page(9)]
    assert core.info is not None and core.info.identity == IDENT_1


def test_a_page_past_the_end_is_refused_before_any_query() -> None:
    core = ClientCore(FAST)
    machine = core.get([3, 37])
    next(machine)
    with pytest.raises(PageOutOfRange) as exc:
        machine.send((doc(1), doc(1)))
    assert exc.value.page == 37 and "0..36" in str(exc.value)
    with pytest.raises(PageOutOfRange):
        drive(core.get_with_epoch([-1]), lambda action: pytest.fail("nothing is to be done"))


def test_a_shrunken_answer_is_refused_after_one_refresh() -> None:
    core = ClientCore(FAST)
    core.info = info_from_epoch(doc(1, identity=IDENT_1), doc(1, identity=IDENT_1))
    machine = core.get([20, 36])
    send = next(machine)
    assert isinstance(machine.send(answers(send, 2, [20, 36], IDENT_2)), ReadEpoch)
    with pytest.raises(PageOutOfRange) as exc:
        machine.send((doc(2, 33, identity=IDENT_2), doc(2, 33, identity=IDENT_2)))
    assert (exc.value.page, exc.value.num_pages) == (36, 33)


def test_planned_info_of_either_party_vouches_for_an_answer() -> None:
    """/epoch read while an update reached B first: answers from B's epoch need no refresh."""
    core = ClientCore(FAST)
    core.info = info_from_epoch(doc(1, identity=IDENT_1), doc(2, identity=IDENT_2))
    assert core.info.views == (View(1, IDENT_1), View(2, IDENT_2))
    machine = core.get_with_epoch([4])
    send = next(machine)
    with pytest.raises(StopIteration) as done:
        machine.send(answers(send, 2, [4], IDENT_2))
    assert done.value.value == (2, [page(4)])


def test_transient_failures_sleep_then_give_up() -> None:
    core = ClientCore(FAST)
    core.info = ServerInfo(37, 6, 1)
    machine = core.get([1])
    assert isinstance(next(machine), Send)
    sleeps = []
    for _ in range(FAST.attempts - 1):
        action = machine.throw(Transient("HTTP 503", delay=0.3))
        assert isinstance(action, Sleep)
        sleeps.append(action.seconds)
        assert isinstance(machine.send(None), Send)  # fresh keys each time
    with pytest.raises(PirUnavailable, match="gave up after 3 attempts: HTTP 503"):
        machine.throw(Transient("HTTP 503"))
    assert all(0.15 <= s <= 0.5 for s in sleeps)  # the Retry-After hint, jittered and capped


def test_a_refusal_is_raised_at_once() -> None:
    core = ClientCore(FAST)
    core.info = ServerInfo(37, 6, 1)
    machine = core.get([1])
    next(machine)
    with pytest.raises(PirError) as exc:
        machine.throw(PirError("HTTP 400: no", 400, "bad_key"))
    assert exc.value.code == "bad_key"


def test_epoch_mismatch_error_after_every_attempt() -> None:
    core = ClientCore(FAST)
    core.info = ServerInfo(37, 6, 1)

    def perform(action):
        if isinstance(action, Sleep):
            return None
        return answers(action, 1, [2], epoch_b=2)

    with pytest.raises(EpochMismatchError, match="A 1, B 2"):
        drive(core.get([2]), perform)


def test_drive_closes_the_operation_on_a_foreign_error() -> None:
    core = ClientCore(FAST)
    machine = core.read_info()

    def perform(action):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        drive(machine, perform)
    assert machine.gi_frame is None  # closed, not left suspended


def test_server_info_keeps_its_positional_form() -> None:
    info = ServerInfo(32, 6, 1, 4)
    assert info.epoch_ids == (1, 1) and info.identities == (None, None)
    assert info.names(View(1, IDENT_1)) and not info.names(View(2, None))
    known = ServerInfo(32, 6, 1, 4, IDENT_1)
    assert known.names(View(1, IDENT_1)) and not known.names(View(1, IDENT_2))
    assert known.names(View(1, None))  # an answer without identity: epoch ids only


def test_epoch_documents() -> None:
    info = info_from_epoch(doc(3, identity=IDENT_1.upper().replace("0X", "0x")),
                           doc(4, identity=IDENT_2, max_batch=2))
    assert (info.num_pages, info.domain_bits, info.max_batch_queries) == (37, 6, 2)
    assert info.identities == (IDENT_1, IDENT_2) and info.epoch_ids == (3, 4)
    with pytest.raises(Transient, match="different matrices") as exc:
        info_from_epoch(doc(1), doc(1, 40))
    assert exc.value.kind == "matrix"
    for bad in ({"epoch_id": 1}, doc(1, identity="nothex"), doc(1, 65, 6), doc(1, 0, 6)):
        with pytest.raises(PirError, match="malformed /epoch"):
            info_from_epoch(bad, bad)


@pytest.mark.parametrize("mangle", [
    lambda o: o.update(identity="0xzz"),
    lambda o: o.update(identity=5),
    lambda o: o.update(epoch_id=True),
    lambda o: o.update(epoch_id="1"),
    lambda o: o["results"][0]["pages"].pop(),
    lambda o: o["results"][0]["pages"].__setitem__(0, b"\0" * 4095),
    lambda o: o.pop("results"),
])
def test_malformed_answers_are_errors(mangle) -> None:
    obj = {"epoch_id": 1, "identity": IDENT_1, "results": [{"pages": [bytes(4096)] * 3}]}
    assert answer_from_obj(obj, 1) == Answer(1, IDENT_1, [bytes(4096)] * 3)
    mangle(obj)
    with pytest.raises(PirError, match="malformed answer"):
        answer_from_obj(obj, 1)


POLLING = RetryPolicy(attempts=4, backoff_s=2.0, max_backoff_s=2.0, agreement_poll_s=0.25)


def _mismatched(core: ClientCore) -> tuple:
    """A get whose first answers came from A at epoch 2 and B still at 1."""
    core.info = info_from_epoch(doc(1, identity=IDENT_1), doc(1, identity=IDENT_1))
    machine = core.get_with_epoch([4])
    send = next(machine)
    return machine, machine.send(answers(send, 2, [4], IDENT_2, identity_b=IDENT_1, epoch_b=1))


def test_parties_apart_are_waited_for_on_epoch_not_a_whole_backoff() -> None:
    core = ClientCore(POLLING)
    machine, action = _mismatched(core)
    slept = 0.0
    # B still behind, then both on the older epoch (a replica behind the answers: it would
    # part them again), then both on epoch 2: the query goes out again at once
    for docs in ((doc(2, identity=IDENT_2), doc(1, identity=IDENT_1)),
                 (doc(1, identity=IDENT_1), doc(1, identity=IDENT_1)),
                 (doc(2, identity=IDENT_2), doc(2, identity=IDENT_2))):
        assert action == Sleep(0.25)
        slept += action.seconds
        assert isinstance(machine.send(None), ReadEpoch)
        action = machine.send(docs)
    assert isinstance(action, Send) and slept == 0.75  # the backoff was 1 to 2 s
    assert core.info is not None and core.info.views[1] == View(2, IDENT_2)
    with pytest.raises(StopIteration) as done:
        machine.send(answers(action, 2, [4], IDENT_2))
    assert done.value.value == (2, [page(4)])


def test_parties_still_apart_wait_the_whole_backoff() -> None:
    core = ClientCore(POLLING)
    machine, action = _mismatched(core)
    slept, reads = 0.0, 0
    while isinstance(action, Sleep | ReadEpoch):
        if isinstance(action, Sleep):
            slept += action.seconds
            action = machine.send(None)
        else:
            reads += 1
            action = machine.send((doc(2, identity=IDENT_2), doc(1, identity=IDENT_1)))
    assert isinstance(action, Send)
    assert 1.0 <= slept <= 2.0 and 3 <= reads <= 7  # one jittered backoff, read every 0.25 s


def test_a_failed_epoch_read_sleeps_the_rest_of_the_backoff() -> None:
    core = ClientCore(POLLING)
    machine, action = _mismatched(core)
    assert action == Sleep(0.25) and isinstance(machine.send(None), ReadEpoch)
    rest = machine.throw(Transient("HTTP 503"))
    assert isinstance(rest, Sleep) and 0.75 - 1e-9 <= rest.seconds <= 1.75
    assert isinstance(machine.send(None), Send)


def test_no_epoch_reads_when_agreement_polling_is_off() -> None:
    core = ClientCore(RetryPolicy(attempts=4, backoff_s=2.0, max_backoff_s=2.0,
                                  agreement_poll_s=0))
    machine, action = _mismatched(core)
    assert isinstance(action, Sleep) and 1.0 <= action.seconds <= 2.0
    assert isinstance(machine.send(None), Send)


def test_a_refresh_waits_for_one_shape_only() -> None:
    """/epoch read while a rotation reached A only: the wait ends once both serve one shape,
    whatever their epochs (what a refresh needs to plan keys)."""
    core = ClientCore(POLLING)
    machine = core.read_info()
    assert isinstance(next(machine), ReadEpoch)
    action = machine.send((doc(2, num_pages=50), doc(1)))
    assert action == Sleep(0.25) and isinstance(machine.send(None), ReadEpoch)
    with pytest.raises(StopIteration) as done:
        machine.send((doc(3, num_pages=50), doc(2, num_pages=50)))
    assert done.value.value.num_pages == 50 and done.value.value.epoch_ids == (3, 2)
