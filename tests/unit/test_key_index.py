"""`KeyIndex`, the owner's tag -> key index in files: the same answers as a dict through any
mix of puts, rewrites and deletes (probe runs that wrap around the end and cross each other's
homes included), after a reopen, a copy and a resize; a copy leaves out a crash's bytes."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from morphogen.keyword.key_index import HEAP, SLOT, SLOTS, KeyIndex, slots_for


def _tag(rng: random.Random, home: int | None = None, slots: int = 0) -> bytes:
    if home is None:
        return rng.randbytes(16)
    # a tag whose first eight bytes put it at `home`: runs collide and wrap on purpose
    prefix = home + slots * rng.randrange(1 << 20)
    return prefix.to_bytes(8, "little") + rng.randbytes(8)


@pytest.mark.parametrize("seed", range(6))
def test_it_answers_as_a_dict_through_puts_rewrites_and_deletes(tmp_path: Path, seed: int):
    rng = random.Random(seed)
    slots = 97
    index = KeyIndex.create(tmp_path / "i", slots)
    model: dict[bytes, bytes] = {}
    # crowded homes near the end: runs wrap past the last slot to the first
    homes = [rng.choice([0, 1, 2, 90, 94, 95, 96]) for _ in range(40)]
    pool = [_tag(rng, h, slots) for h in homes] + [_tag(rng) for _ in range(40)]
    for _ in range(3000):
        tag = rng.choice(pool)
        op = rng.random()
        if op < 0.5 and len(model) < 0.85 * slots:
            key = rng.randbytes(rng.choice([0, 20, 32, 52]))
            index[tag] = key
            model[tag] = key
        elif op < 0.6 and tag in model:
            index[tag] = model[tag]  # a rewrite with the same bytes appends nothing
        elif tag in model:
            del index[tag]
            del model[tag]
        else:
            with pytest.raises(KeyError):
                del index[tag]
        assert len(index) == len(model)
    assert dict(index.items()) == model
    assert set(index) == set(model)
    for tag in pool:
        assert (tag in index) == (tag in model)
        assert index.get(tag) == model.get(tag)
    index.sync()
    index.close()
    with KeyIndex(tmp_path / "i", writable=False) as again:
        assert dict(again.items()) == model
        with pytest.raises(PermissionError):
            again[_tag(rng)] = b"x"


def test_a_rewrite_with_the_same_key_appends_nothing(tmp_path: Path):
    rng = random.Random(1)
    with KeyIndex.create(tmp_path / "i", slots_for(100)) as index:
        tags = [_tag(rng) for _ in range(50)]
        for t in tags:
            index[t] = t + b"k" * 20
        index.sync()
        size = (tmp_path / "i" / HEAP).stat().st_size
        for t in tags:
            index[t] = t + b"k" * 20
        index.sync()
        assert (tmp_path / "i" / HEAP).stat().st_size == size == 50 * 36


def test_more_records_than_asked_for_double_the_slots(tmp_path: Path):
    rng = random.Random(2)
    model = {_tag(rng): rng.randbytes(20) for _ in range(500)}
    with KeyIndex.build(tmp_path / "i", model.items(), 64) as index:
        index.sync()
        assert dict(index.items()) == model
    assert (tmp_path / "i" / SLOTS).stat().st_size >= 500 / 0.9 * SLOT
    with KeyIndex(tmp_path / "i") as index:
        assert all(index[t] == k for t, k in model.items())


def test_a_copy_is_the_synced_index_without_a_crashs_bytes(tmp_path: Path):
    rng = random.Random(3)
    model = {_tag(rng): rng.randbytes(52) for _ in range(200)}
    with KeyIndex.build(tmp_path / "i", model.items(), slots_for(300)) as index:
        index.sync()
    with (tmp_path / "i" / HEAP).open("ab") as f:
        f.write(b"appended by a run that never synced")  # bytes the record does not count
    KeyIndex.copy(tmp_path / "i", tmp_path / "c")
    assert (tmp_path / "c" / HEAP).stat().st_size == 200 * 52
    with KeyIndex(tmp_path / "c") as copy:
        assert dict(copy.items()) == model


def test_bad_tags_and_keys_are_refused(tmp_path: Path):
    with KeyIndex.create(tmp_path / "i", 64) as index:
        with pytest.raises(KeyError):
            index[b"short"]
        assert b"short" not in index
        with pytest.raises(ValueError):
            index[bytes(16)] = b"x" * 70000
    (tmp_path / "i" / SLOTS).write_bytes(b"\0" * 10)
    with pytest.raises(ValueError, match="does not hold 64 slots"):
        KeyIndex(tmp_path / "i")


@pytest.mark.parametrize("fault", ["tag_twice", "key_twice", "zero_tag", "alike"])
def test_a_build_refuses_a_tag_twice_or_the_empty_slots_before_writing(tmp_path: Path, fault):
    """A tag names its record: the build refuses two records of one tag (named by their keys)
    and a record of the empty slot's tag (zeros), found in the sort it makes to place them,
    and makes no file; tags alike in all but their last bit are built as any two."""
    from morphogen.keyword.key_columns import KeyColumns
    from morphogen.keyword.records import RecordError

    rng = np.random.default_rng(9)
    n, first, second = 5000, 3100, 4321  # both in the second table
    tags = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    keys = rng.integers(0, 256, (n, 20), dtype=np.uint8)
    if fault == "zero_tag":
        tags[second] = 0
    else:
        tags[second] = tags[first]
    if fault == "key_twice":
        keys[second] = keys[first]
    if fault == "alike":
        tags[second, 15] ^= 1  # the same home and first word: they tie in the packed sort
    # as a chain import hands them: a table's keys an array of their own width
    short = np.ascontiguousarray(keys[3000:, :12])
    columns = KeyColumns.rows(tags, [keys[:3000], short])
    folder = tmp_path / "i"
    if fault == "alike":
        with KeyIndex.build(folder, columns, slots_for(n)) as index:
            assert dict(index.items()) == dict(columns.items()) and len(index) == n
        return
    key = {i: short[i - 3000].tobytes().hex() for i in (first, second)}
    says = {"tag_twice": f"keys whose 128-bit tags collide: 0x{key[first]} and 0x{key[second]}",
            "key_twice": f"the same key twice: 0x{key[first]} and 0x{key[first]}",
            "zero_tag": f"key 0x{key[second]}: its tag is all zeros"}[fault]
    with pytest.raises(RecordError, match=says):
        KeyIndex.build(folder, columns, slots_for(n))
    assert not folder.exists()


@pytest.mark.parametrize("seed", range(4))
def test_a_built_index_is_what_inserting_gives_in_any_order(tmp_path: Path, seed: int):
    """`build` places every record in one pass; it answers as inserting them one by one does
    (crowded homes at the end wrap to the first slots), then takes changes as any index.
    Two builds of the same records in different orders put every tag in the same slot, and
    two in the same order write the same bytes."""
    rng = random.Random(seed)
    slots = 61
    homes = [rng.choice([0, 1, 30, 58, 59, 60]) for _ in range(30)] + [None] * 20
    model = {_tag(rng, h, slots): rng.randbytes(rng.choice([0, 20, 52])) for h in homes}
    items = list(model.items())
    a = KeyIndex.build(tmp_path / "a", items, slots)
    rng.shuffle(items)
    b = KeyIndex.build(tmp_path / "b", items, slots)
    for index in (a, b):
        assert dict(index.items()) == model and len(index) == len(model)
        for tag, key in model.items():
            assert index[tag] == key
        index.close()
    a_tags, b_tags = ([r[i:i + 16] for i in range(0, len(r), SLOT)]
                      for r in ((tmp_path / d / SLOTS).read_bytes() for d in "ab"))
    assert a_tags == b_tags
    with KeyIndex.build(tmp_path / "c", items, slots):
        pass
    for name in (SLOTS, HEAP):
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "c" / name).read_bytes()
    with KeyIndex(tmp_path / "a") as index:
        for tag in list(model)[::3]:
            del index[tag]
            del model[tag]
        new = _tag(rng, 60, slots)
        index[new] = model[new] = b"late"
        assert dict(index.items()) == model
        assert all(index[t] == k for t, k in model.items())


def test_the_build_order_is_home_then_tag_ties_included():
    """`build`'s one-key sort gives the order by (home, tag), also where tags agree in the
    bits it packs (the sort by all three then decides)."""
    import numpy as np

    from morphogen.keyword.key_index import _by_home_then_tag

    rng = np.random.default_rng(5)
    slots = 1000
    for words in (rng.integers(0, 2**63, (5000, 2), dtype=np.uint64),
                  # first words alike in all but their low bits: the packed keys tie
                  np.stack([np.uint64(2**40) + rng.integers(0, 4, 300).astype(np.uint64)
                            * np.uint64(slots), rng.integers(0, 2**63, 300, dtype=np.uint64)],
                           axis=1)):
        homes = words[:, 0] % np.uint64(slots)
        want = np.lexsort((words[:, 1], words[:, 0], homes))
        order, tied = _by_home_then_tag(words, homes, slots)
        assert np.array_equal(order, want) and tied == (len(words) == 300)


def test_key_columns_read_as_the_pairs_and_build_the_same_index(tmp_path: Path) -> None:
    """A build's tag -> key arrays (`KeyColumns`): from keys of one width or of many, joined,
    they read as the dict of their pairs, and the index built from them is the one the pairs
    build, in the same order."""
    import numpy as np

    from morphogen.keyword.key_columns import KeyColumns

    rng = random.Random(3)
    fixed = {rng.randbytes(16): rng.randbytes(20) for _ in range(50)}
    mixed = {rng.randbytes(16): rng.randbytes(rng.choice([0, 36, 52])) for _ in range(70)}
    a = KeyColumns.of(np.frombuffer(b"".join(fixed), np.uint8),
                      np.frombuffer(b"".join(fixed.values()), np.uint8).reshape(50, 20))
    b = KeyColumns.of(np.frombuffer(b"".join(mixed), np.uint8), list(mixed.values()))
    both = KeyColumns.concat([a, b])
    assert dict(a) == fixed and dict(b) == mixed and dict(both) == fixed | mixed
    assert len(both) == 120 and list(both) == [*fixed, *mixed]
    with KeyIndex.build(tmp_path / "c", both, slots_for(120)), \
            KeyIndex.build(tmp_path / "p", list((fixed | mixed).items()), slots_for(120)):
        pass
    for name in (SLOTS, HEAP):
        assert (tmp_path / "c" / name).read_bytes() == (tmp_path / "p" / name).read_bytes()
    with pytest.raises(ValueError, match="offsets"):
        KeyColumns(np.zeros((2, 16), np.uint8), np.zeros(5, np.uint8), np.array([0, 3, 4]))
    # keys as rows of arrays of their own widths (a build's tables), never joined: the same
    # records as those arrays' columns joined, empty arrays included
    blocks = [np.frombuffer(b"".join(fixed.values()), np.uint8).reshape(50, 20),
              np.zeros((0, 52), np.uint8), np.arange(36 * 3, dtype=np.uint8).reshape(3, 36)]
    tags = np.frombuffer(b"".join([*fixed, *(rng.randbytes(16) for _ in range(3))]), np.uint8)
    rows = KeyColumns.rows(tags, blocks)
    joined = KeyColumns.concat([KeyColumns.of(tags[:800], blocks[0]),
                                KeyColumns.of(tags[800:], blocks[2])])
    assert list(rows.items()) == list(joined.items()) and len(rows) == 53
    assert np.array_equal(rows.offsets, joined.offsets)


def test_touch_finds_what_the_lookups_find_and_writes_nothing(tmp_path: Path) -> None:
    """`touch` (the follower's read-ahead of a block's lookups) walks the same probe runs as a
    lookup: held and absent tags, runs crowded at the end that wrap to the first slot. It
    changes no byte, and leaves the mapping free to close."""
    rng = random.Random(7)
    slots = 97
    index = KeyIndex.create(tmp_path / "i", slots)
    held = [_tag(rng, rng.choice([0, 1, 94, 95, 96]), slots) for _ in range(30)]
    held += [_tag(rng) for _ in range(40)]
    for tag in held:
        index[tag] = rng.randbytes(20)
    index.sync()
    before = (tmp_path / "i" / SLOTS).read_bytes(), (tmp_path / "i" / HEAP).read_bytes()
    absent = [_tag(rng, rng.choice([0, 95, 96]), slots) for _ in range(20)]
    absent += [_tag(rng) for _ in range(20)]
    asked = held[::3] + absent
    rng.shuffle(asked)
    tags = np.frombuffer(b"".join(asked), np.uint8).reshape(-1, 16)
    assert index.touch(tags) == sum(t in index for t in asked) == len(held[::3])
    assert index.touch(tags[:0]) == 0
    index.close()  # no view of the mapping is left behind
    after = (tmp_path / "i" / SLOTS).read_bytes(), (tmp_path / "i" / HEAP).read_bytes()
    assert after == before
