"""The party logic without Ray: in-process shards (ShardCore) behind `ShardLink`s, a real epoch
log on disk. Answers carry the identity of their data; a shard on other data under the same
epoch id is refused, never XORed; publications are logged first and a restarted shard replays
the log to the party's identity."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from morphogen import dpf
from morphogen.changes import ChangeBatch, PageUpdate, PageWrite
from morphogen.codec import ErrorCode, WireError
from morphogen.config import PartyConfig
from morphogen.dpf import DomainError
from morphogen.epoch_log import EpochLog, EpochLogError
from morphogen.matrix import Snapshot, build_synthetic, domain_bits_for, synthetic_pages
from morphogen.party import Party
from morphogen.shard import ShardCore

NUM_PAGES = 96


class CoreLink:
    """A ShardCore as the party calls a shard deployment (threads, like the deployment)."""

    def __init__(self, core: ShardCore, epoch_log: EpochLog | None) -> None:
        self.core = core
        self.log = epoch_log

    async def scan(self, batch):
        try:
            return await asyncio.to_thread(self.core.scan, batch)
        except DomainError as exc:  # as deployments/shard.py answers it
            raise WireError(400, ErrorCode.BAD_DOMAIN, str(exc)) from None

    async def info(self) -> dict[str, Any]:
        out = self.core.info()
        out["checksum"] = out["snapshot_checksum"]
        return out

    async def prepare_updates(self, epoch_id, changes, base_epoch, op):
        return await asyncio.to_thread(self.core.prepare_updates, epoch_id, changes,
                                       base_epoch=base_epoch, op=op)

    async def prepare_snapshot(self, epoch_id, path, checksum, op):
        first, stop = await asyncio.to_thread(self.core.prepare_snapshot, epoch_id, path,
                                              checksum=checksum, op=op)
        return {"first_page": first, "stop_page": stop}

    async def commit(self, epoch_id, op):
        self.core.commit(epoch_id, op=op)
        return self.core.epoch_id

    async def abort(self, epoch_id, op):
        self.core.abort(epoch_id, op=op)

    async def catch_up(self):
        applied = await asyncio.to_thread(self.core.catch_up, self.log) if self.log else 0
        return {"applied": applied, "identity": self.core.identity.digest}


@pytest.fixture
def world(tmp_path: Path):
    snaps = tmp_path / "snaps"
    build_synthetic(snaps / "base", NUM_PAGES, seed=3, epoch_id=1, progress=False)
    build_synthetic(snaps / "next", 70, seed=4, epoch_id=1, progress=False)
    return tmp_path, snaps


def _cfg(snaps: Path, log_dir: Path | None) -> PartyConfig:
    return PartyConfig(snapshot=str(snaps / "base"), num_shards=2, coalesce_window_ms=0,
                       admin_snapshot_dir=str(snaps), retry_backoff_ms=1,
                       epoch_log_dir=None if log_dir is None else str(log_dir))


def _start_shard(snap_dir: Path, index: int, epoch_log: EpochLog | None) -> ShardCore:
    core = ShardCore.open(Snapshot.open(snap_dir), index, 2, "cpu")
    if epoch_log is not None:
        core.catch_up(epoch_log)  # what the deployment does before it reports ready
    return core


def _party(snaps: Path, log_dir: Path | None) -> tuple[Party, list[CoreLink]]:
    epoch_log = EpochLog(log_dir) if log_dir is not None else None
    links = [CoreLink(_start_shard(snaps / "base", i, epoch_log), epoch_log) for i in range(2)]
    return Party(_cfg(snaps, log_dir), links, epoch_log), links


def _ask(party: Party, model: np.ndarray, targets: list[int]) -> tuple[dict, list[bytes]]:
    """Query party A's half and combine with a locally computed B half: the page bytes."""
    d = domain_bits_for(model.shape[0])
    pairs = [dpf.generate_keys(d, t) for t in targets]
    keys = [a.to_bytes() for a, _ in pairs]
    while len(keys) % 3:
        keys.append(keys[0])
    answer = asyncio.run(party.query_batch([keys[i:i + 3] for i in range(0, len(keys), 3)]))
    pages_a = [p for r in answer["results"] for p in r["pages"]]
    out = []
    for (_, kb), pa in zip(pairs, pages_a, strict=False):
        masks = np.stack([np.frombuffer(kb.eval(p), np.uint8) for p in range(model.shape[0])])
        pb = np.bitwise_xor.reduce(model & np.tile(masks, (1, 256)), axis=0)
        out.append((np.frombuffer(pa, np.uint8) ^ pb).tobytes())
    return answer, out


def test_answers_carry_the_identity_and_the_right_pages(world):
    _, snaps = world
    party, links = _party(snaps, None)
    model = synthetic_pages(3, 0, NUM_PAGES)
    answer, pages = _ask(party, model, [0, 47, 48, 95])
    assert pages == [model[t].tobytes() for t in (0, 47, 48, 95)]
    doc = asyncio.run(party.epoch())
    assert answer["epoch_id"] == doc["epoch_id"] == 1
    assert answer["identity"] == doc["identity"] == links[0].core.identity.digest


def test_same_epoch_id_on_other_data_is_refused_not_xored(world):
    """A replica restarted on a snapshot rebuilt in place under the same epoch id."""
    _, snaps = world
    party, links = _party(snaps, None)
    build_synthetic(snaps / "rebuilt", NUM_PAGES, seed=99, epoch_id=1, progress=False)
    links[1].core = ShardCore.open(Snapshot.open(snaps / "rebuilt"), 1, 2, "cpu")
    assert links[1].core.epoch_id == links[0].core.epoch_id == 1
    with pytest.raises(WireError) as err:
        _ask(party, synthetic_pages(3, 0, NUM_PAGES), [5])
    assert err.value.status == 503 and "consistent epoch" in err.value.message
    with pytest.raises(WireError) as err:
        asyncio.run(party.epoch())
    assert err.value.status == 503


def _random_batch(rng, n: int, num_pages: int) -> ChangeBatch:
    changes = []
    for _ in range(n):
        page = int(rng.integers(0, num_pages))
        if rng.random() < 0.7:
            changes.append(PageUpdate(page, rng.integers(0, 256, 4096, np.uint8).tobytes()))
        else:
            changes.append(PageWrite(page, rng.integers(0, 256, 100, np.uint8).tobytes()))
    return ChangeBatch.from_changes(changes)


def _apply(model: np.ndarray, batch: ChangeBatch) -> np.ndarray:
    model = model.copy()
    for i, page in enumerate(batch.pages.tolist()):
        data = np.frombuffer(batch.data[i * 4096:(i + 1) * 4096], np.uint8)
        model[page] = data if batch.replace[i] else model[page] ^ data
    return model


def test_restarted_shards_replay_50_updates_and_a_rotation(world):
    root, snaps = world
    log_dir = root / "log-a"
    party, links = _party(snaps, log_dir)
    rng = np.random.default_rng(8)
    model = synthetic_pages(3, 0, NUM_PAGES)
    for i in range(50):
        batch = _random_batch(rng, 1 + i % 3, model.shape[0])
        out = asyncio.run(party.admin.updates(batch))
        model = _apply(model, batch)
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
        link.core = _start_shard(snaps / "base", i, EpochLog(log_dir))
        assert link.core.identity == head
    answer, pages = _ask(party, model, [0, 35, 69])
    assert answer["identity"] == head.digest
    assert pages == [model[t].tobytes() for t in (0, 35, 69)]
    # the log holds the rotation and the 19 batches after it
    assert [e.kind for e in EpochLog(log_dir).live()] == ["rotation"] + ["updates"] * 19


def test_a_failed_publication_is_cancelled_in_the_log(world):
    root, snaps = world
    party, links = _party(snaps, root / "log")
    bad = ChangeBatch.from_changes([PageUpdate(NUM_PAGES + 5, bytes(4096))])
    with pytest.raises(WireError) as err:
        asyncio.run(party.admin.updates(bad))
    assert err.value.status == 400
    assert EpochLog(root / "log").entries() == []  # refused before the log
    # a prepare that fails on a shard: aborted everywhere and in the log
    links[1].core.prepare_updates(2, ChangeBatch.from_changes([]), op="another router")
    with pytest.raises(WireError) as err:
        asyncio.run(party.admin.updates(_random_batch(np.random.default_rng(1), 2, NUM_PAGES)))
    assert err.value.status == 409
    assert EpochLog(root / "log").live() == []
    assert [e.kind for e in EpochLog(root / "log").entries()] == ["updates", "abort"]
    assert links[0].core.epoch_id == 1


def test_shards_behind_the_log_are_caught_up_before_the_next_publication(world):
    """A router that died between the log append and the commit."""
    root, snaps = world
    party, links = _party(snaps, root / "log")
    rng = np.random.default_rng(2)
    first = _random_batch(rng, 2, NUM_PAGES)
    base = links[0].core.identity
    EpochLog(root / "log").append_updates(2, 1, first, base.after_updates(2, first.digest))
    second = _random_batch(rng, 2, NUM_PAGES)
    out = asyncio.run(party.admin.updates(second))
    assert out["epoch_id"] == 3
    model = _apply(_apply(synthetic_pages(3, 0, NUM_PAGES), first), second)
    _, pages = _ask(party, model, [int(p) for p in first.pages] + [int(second.pages[0])])
    assert pages == [model[int(p)].tobytes() for p in first.pages] + [
        model[int(second.pages[0])].tobytes()]


def test_a_log_of_other_data_or_a_corrupt_log_refuses_the_start(world):
    root, snaps = world
    party, links = _party(snaps, root / "log")
    asyncio.run(party.admin.updates(_random_batch(np.random.default_rng(5), 3, NUM_PAGES)))
    # the configured snapshot rebuilt in place (forced) under the same epoch id
    shutil.rmtree(snaps / "base")
    build_synthetic(snaps / "base", NUM_PAGES, seed=77, epoch_id=1, progress=False)
    with pytest.raises(EpochLogError, match="derived"):
        _start_shard(snaps / "base", 0, EpochLog(root / "log"))
    # a flipped byte in the log itself
    log_file = next(p for p in (root / "log").iterdir() if not p.name.startswith("updates"))
    raw = bytearray(log_file.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    log_file.write_bytes(bytes(raw))
    with pytest.raises(EpochLogError):
        _start_shard(snaps / "base", 0, EpochLog(root / "log"))


def test_keys_of_a_domain_the_shards_left_are_refused_and_the_layout_refreshed(world):
    """Another router rotated the shards to a bigger domain: this party's cached layout still
    validates the old keys; the shards refuse them (400, never a 500) and the layout moves."""
    _, snaps = world
    party, links = _party(snaps, None)

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
        for _ in range(100):  # the refresh runs in the background
            if (await party.layout()).domain_bits == 8:
                break
            await asyncio.sleep(0.01)
        assert (await party.layout()).num_pages == 200

    asyncio.run(scenario())
