"""A shard replica whose epoch log's store is down: it starts (a node restarting from its own
cache during an outage), but answers only for an epoch a router names, never on its own word
that its epoch is the party's; it stays healthy while the store is down (a replacement could
not read the log either) and is itself again once the log can be read."""

from __future__ import annotations

import asyncio

import pytest

from morphogen.protocol import dpf
from morphogen.protocol.codec import WireError
from morphogen.publication.log import EpochLog
from morphogen.publication.records import EpochLogUnreachable
from morphogen.storage.settings import StoreSettings, configure, current
from tests.unit._party_world import make_world, start_replica


@pytest.fixture
def short_outage():
    before = current()
    configure(StoreSettings(outage_s=0.5))
    yield
    configure(before)


def _down(transient: bool):
    def raw() -> bytes:
        raise EpochLogUnreachable("s3://b/log: cannot read the epoch log: error sending "
                                  "request (the store could not be reached)",
                                  "unreachable" if transient else "denied", transient)
    return raw


def test_a_replica_started_while_its_log_is_down_answers_only_a_named_epoch(
        tmp_path, monkeypatch, short_outage) -> None:
    _, snaps = make_world(tmp_path)
    log = EpochLog(tmp_path / "log")
    monkeypatch.setattr(log._store, "raw", _down(True))
    replica = start_replica(snaps / "base", 0, log, catch_up_wait_s=5)
    batch = dpf.KeyBatch.from_keys([dpf.generate_keys(7, 3)[0]])

    async def scenario() -> None:  # one event loop, as in a replica
        with pytest.raises(WireError) as err:
            await replica.scan(batch, None)
        assert err.value.status == 503 and "cannot tell" in err.value.message
        identity, _ = await replica.scan(batch, replica.core.identity)
        assert identity == replica.core.identity  # a router that read the log names it
        await replica.check_health()  # healthy: a replacement could do no better
        monkeypatch.undo()  # the store is back
        identity, _ = await replica.scan(batch, None)
        assert identity == replica.core.identity

    asyncio.run(scenario())


def test_a_log_that_refuses_the_replica_still_stops_its_start(tmp_path, monkeypatch,
                                                             short_outage) -> None:
    _, snaps = make_world(tmp_path)
    log = EpochLog(tmp_path / "log")
    monkeypatch.setattr(log._store, "raw", _down(False))  # credentials refused: not an outage
    with pytest.raises(EpochLogUnreachable):
        start_replica(snaps / "base", 0, log)
