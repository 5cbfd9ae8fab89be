"""Keyword lookups proven against one signed root a version: the tables a lookup reads, pages
of two versions never mixing, and the freshness bounds (versions, blocks, age)."""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path

import numpy as np
import pytest
from _kw import TablePir
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from morphogen.keyword import KeywordClient, KeywordIntegrityError, StaleTableError, build_table
from morphogen.keyword.descriptor import Anchor
from morphogen.keyword.owner import Change, OwnerTable, create_owner_dir
from morphogen.keyword.verify import ANSWER_FAILED

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
PUB = KEY.public_key()
H = "0x" + "ab" * 32


def records(n: int, seed: int) -> dict[bytes, bytes]:
    rng = random.Random(seed)
    return {rng.randbytes(20): rng.randbytes(32) for _ in range(n)}


@pytest.fixture(scope="module")
def big() -> tuple[dict[bytes, bytes], object]:
    # two buckets a page: more than 128 data pages, two tree levels
    recs = records(3000, seed=1)
    return recs, build_table(recs.items(), value_size=32, signing_key=KEY, layout="row",
                             row_size=2048)


def resigned(t, **fields) -> np.ndarray:
    """The table's pages under a descriptor with `fields` changed, signed by the owner."""
    desc = dataclasses.replace(t.descriptor, **fields)
    pages = t.pages.copy()
    pages[-1] = np.frombuffer(desc.to_page(KEY), np.uint8)
    return pages


def test_each_part_is_read_from_its_own_table_the_same_for_every_key(big) -> None:
    recs, t = big
    g = t.descriptor.geometry
    pir = TablePir(t.pages)
    kc = KeywordClient(pir, PUB, whole_level_pages=8)
    rng = random.Random(3)
    keys = rng.sample(sorted(recs), 5) + [rng.randbytes(20) for _ in range(3)]
    assert kc.get(keys[0]) == recs[keys[0]]
    # the descriptor (a one-page table), the top level whole, then the data and tree1 pages
    # (asked at once)
    got = [(r[0], r[2]) for r in pir.requests]
    assert got[:2] == [("descriptor", 1), ("tree2", 1)]
    assert sorted(got[2:]) == [("data", g.data_pages), ("tree1", g.levels[0])]
    shapes = set()
    for key in keys:
        pir.requests.clear()
        assert kc.get(key) == recs.get(key)
        shapes.add(tuple(sorted((r[0], len(r[1]), r[2]) for r in pir.requests)))
    assert shapes == {(("data", 3, g.data_pages), ("tree1", 3, g.levels[0]))}
    # the reference's server serves the one matrix: the same pages, read from it
    flat = TablePir(t.pages, tables=False)
    kc = KeywordClient(flat, PUB, whole_level_pages=8)
    assert kc.get_many(keys) == [recs.get(k) for k in keys]
    assert {(r[0], r[2]) for r in flat.requests} == {(None, g.num_pages)}
    # the default reads tree1 (14 pages) whole once a version: one table a lookup
    pir = TablePir(t.pages)
    kc = KeywordClient(pir, PUB)
    assert kc.get_many(keys) == [recs.get(k) for k in keys]
    assert sorted(r[0] for r in pir.requests[:3]) == ["descriptor", "tree1", "tree2"]
    assert {r[0] for r in pir.requests[3:]} == {"data"}


def test_pages_of_two_versions_never_mix(tmp_path: Path) -> None:
    recs = records(3000, seed=2)
    table = build_table(recs.items(), value_size=32, signing_key=KEY, layout="row",
                        row_size=2048)
    create_owner_dir(table, tmp_path / "owner")
    owner = OwnerTable(tmp_path / "owner")
    changed = sorted(recs)[:4]
    version, batch = owner.apply([Change("put", k, bytes(32)) for k in changed], KEY)
    assert version == 2
    v1, v2 = owner.pages(1), owner.pages(2)
    g = table.descriptor.geometry
    data = [i for i in batch.pages.tolist() if i < g.data_pages]
    tree = [i for i in batch.pages.tolist() if g.data_pages <= i < g.descriptor_page]
    assert data and len(tree) >= 2 and batch.pages[-1] == g.descriptor_page  # paths in it
    assert KeywordClient(TablePir(v2), PUB).get_many(changed) == [bytes(32)] * 4
    for mixed in (
        np.concatenate([v1[:g.data_pages], v2[g.data_pages:]]),  # old data, new tree + root
        np.concatenate([v2[:g.data_pages], v1[g.data_pages:-1], v2[-1:]]),  # new data, old tree
        np.concatenate([v2[:-1], v1[-1:]]),  # everything new but the signed root
    ):
        for key in changed:
            with pytest.raises(KeywordIntegrityError) as exc:
                KeywordClient(TablePir(mixed), PUB, whole_level_pages=1).get(key)
            assert str(exc.value) == ANSWER_FAILED or "failed verification" in str(exc.value)


def test_a_version_older_than_the_callers_age_bound_is_refused(big) -> None:
    recs, t = big
    key = sorted(recs)[0]
    old = resigned(t, time=int(time.time()) - 3600)
    with pytest.raises(StaleTableError, match=r"made 360[0-9] s ago; the caller accepts 60 s"):
        KeywordClient(TablePir(old), PUB, max_age=60).get(key)
    assert KeywordClient(TablePir(old), PUB, max_age=7200).get(key) == recs[key]
    assert KeywordClient(TablePir(t.pages), PUB, max_age=60).get(key) == recs[key]
    with pytest.raises(ValueError, match="max_age"):
        KeywordClient(None, PUB, max_age=0)


def test_blocks_only_go_forward_and_meet_the_callers_bound(big) -> None:
    recs, t = big
    key = sorted(recs)[1]
    # one version number: the block alone must keep the client from going back
    at = {n: resigned(t, version=5, anchor=Anchor(1, 100 + n, H)) for n in (1, 2, 3)}
    pir = TablePir(at[2])
    kc = KeywordClient(pir, PUB)
    assert kc.get(key) == recs[key] and kc.seen_block == 102
    pir.pages, pir.epoch = at[1], 2  # the parties go back one block
    with pytest.raises(StaleTableError, match="block 101 .* already read block 102"):
        kc.get(key)
    pir.pages, pir.epoch = at[3], 3
    assert kc.get(key) == recs[key] and kc.seen_block == 103
    with pytest.raises(StaleTableError, match="block 103 .* caller trusts block 104"):
        KeywordClient(TablePir(at[3]), PUB, min_block=104).get(key)
    head = {"block": 103}
    kc = KeywordClient(TablePir(at[3]), PUB, trusted_block=lambda: head["block"])
    assert kc.get(key) == recs[key]
    head["block"] = 110
    with pytest.raises(StaleTableError, match="caller trusts block 110"):
        kc.get(key)
    # a bound on blocks and a table that names none: nothing says it is fresh
    with pytest.raises(StaleTableError, match="names no chain block"):
        KeywordClient(TablePir(t.pages), PUB, min_block=1).get(key)


def test_one_signature_check_a_version(big, monkeypatch) -> None:
    from morphogen.keyword import descriptor as dmod

    recs, t = big
    calls = []
    real = dmod.verify
    monkeypatch.setattr(dmod, "verify", lambda *a: calls.append(1) or real(*a))
    pir = TablePir(t.pages)
    kc = KeywordClient(pir, PUB)
    for key in sorted(recs)[:20]:
        assert kc.get(key) == recs[key]
    pir.epoch = 2  # the same version served under another epoch: read again, checked once
    assert kc.get_many(sorted(recs)[:40]) == [recs[k] for k in sorted(recs)[:40]]
    assert len(calls) == 1


@pytest.mark.parametrize("identity", [True, False])
def test_a_party_left_behind_is_never_answered_from_silently(identity: bool) -> None:
    """B restarted on the owner's first version (its log lost) while A serves the second:
    under other epoch ids the page client refuses the pair; under the same epoch id and no
    identities (the reference's servers) the answer cannot be proven. Never a value."""
    from _pir_fakes import FAST, Client, Party, World

    from morphogen.client import EpochMismatchError

    recs = records(300, seed=4)
    t = build_table(recs.items(), value_size=32, signing_key=KEY)
    v2 = resigned(t, version=2)
    v2[0, :16] ^= 0xFF  # the second version changed a page
    a = Party(World(2, len(v2), 2, pages=v2, identity=identity))
    b = Party(World(1, len(t.pages), 2 if not identity else 1, pages=t.pages,
                    identity=identity))
    pages = Client("msgpack", a, b, retry=FAST)
    try:
        kc = KeywordClient(pages.c, PUB)
        for key in sorted(recs)[:5]:
            with pytest.raises((EpochMismatchError, KeywordIntegrityError)) as exc:
                kc.get(key)
            expected = EpochMismatchError if identity else KeywordIntegrityError
            assert isinstance(exc.value, expected), exc.value
    finally:
        pages.close()


def test_a_block_that_changes_nothing_is_still_a_version(tmp_path: Path) -> None:
    recs = records(200, seed=8)
    create_owner_dir(build_table(recs.items(), value_size=32, signing_key=KEY), tmp_path / "o")
    owner = OwnerTable(tmp_path / "o")
    version, batch = owner.apply([], KEY)
    assert version == 1 and len(batch) == 0  # nothing to say: no version
    version, batch = owner.apply([], KEY, anchor=Anchor(1, 7, H))
    # the descriptor page alone
    assert version == 2 and batch.pages.tolist() == [owner.pages().shape[0] - 1]
    kc = KeywordClient(TablePir(owner.pages()), PUB, min_block=7)
    key = sorted(recs)[0]
    assert kc.get(key) == recs[key] and kc.seen_block == 7


def test_a_newer_version_may_name_an_older_block_after_a_reorg(big) -> None:
    """The owner signs the new branch of a reorg under a higher version: the client follows
    it even though its block number is lower; at the same version it would be a replay."""
    recs, t = big
    key = sorted(recs)[2]
    pir = TablePir(resigned(t, version=5, anchor=Anchor(1, 110, H)))
    kc = KeywordClient(pir, PUB)
    assert kc.get(key) == recs[key]
    pir.pages, pir.epoch = resigned(t, version=6, anchor=Anchor(1, 108, "0x" + "ee" * 32)), 2
    assert kc.get(key) == recs[key] and kc.descriptor().anchor.number == 108
    # that version read again (the parties moved to other data and back): still accepted,
    # its block is the newest version's, not the highest ever seen
    pir.epoch = 3
    assert kc.get(key) == recs[key] and kc.descriptor(refresh=True).anchor.number == 108
    pir.pages, pir.epoch = resigned(t, version=6, anchor=Anchor(1, 107, H)), 4
    with pytest.raises(StaleTableError, match="block 107 .* already read block 108"):
        kc.get(key)
    with pytest.raises(StaleTableError, match="caller trusts block 109"):
        KeywordClient(TablePir(resigned(t, version=7, anchor=Anchor(1, 108, H))), PUB,
                      min_block=109).get(key)
