"""Packed DPF keys (docs/packed-keys.md): the point property over whole small domains, the
strict parser, batches, and the one-page, range and point evaluations agreeing."""

import pickle

import numpy as np
import pytest

from morphogen.constants import key_format_of, key_length, packed_key_length
from morphogen.protocol import dpf, packed
from morphogen.protocol.dpf import DomainError, KeyFormatError
from morphogen.protocol.packed import (
    PackedKey,
    PackedKeyBatch,
    batch_from_rows,
    concat_batches,
    generate_packed_keys,
    masks_at,
    selection_range,
    selections_at,
)


@pytest.mark.parametrize("d", [1, 2, 5, 7, 8, 9, 10])
def test_selections_differ_at_the_target_and_nowhere_else(d):
    n = 1 << d
    targets = range(n) if d <= 5 else sorted({0, 1, 127, 128, n // 3, n - 129, n - 1} - {-1})
    for target in targets:
        if not 0 <= target < n:
            continue
        k0, k1 = generate_packed_keys(d, target)
        diff = selection_range(k0, 0, n) ^ selection_range(k1, 0, n)
        assert np.flatnonzero(diff).tolist() == [target], (d, target)


def test_selections_look_random_and_each_key_alone_selects_about_half():
    k0, k1 = generate_packed_keys(14, 9999)
    for k in (k0, k1):
        share = selection_range(k, 0, 1 << 14).mean()
        assert 0.45 < share < 0.55


def test_one_page_range_and_points_agree():
    k0, k1 = generate_packed_keys(13, 4321)
    rng = np.random.default_rng(3)
    whole = selection_range(k0, 0, 1 << 13)
    for _ in range(10):
        a = int(rng.integers(0, 1 << 13))
        b = int(rng.integers(a, (1 << 13) + 1))
        assert np.array_equal(selection_range(k0, a, b), whole[a:b])
    pts = rng.integers(0, 1 << 13, 40)
    batch = PackedKeyBatch.from_keys([k0, k1])
    sel = selections_at(batch, pts)
    assert sel.tolist()[0] == [int(whole[p]) for p in pts]
    assert [k0.eval(int(p)) for p in pts[:8]] == [int(whole[p]) for p in pts[:8]]
    masks = masks_at(batch, pts)
    assert masks.shape == (2, 40, 16)
    assert np.array_equal(masks[:, :, 0], sel * 0xFF) and (masks == masks[:, :, :1]).all()


def test_large_domains_walk_and_window():
    for d in (20, 25, 32):
        target = (1 << d) - 12345
        k0, k1 = generate_packed_keys(d, target)
        assert k0.eval(target) ^ k1.eval(target) == 1
        lo, hi = target - 300, target + 200
        w = selection_range(k0, lo, hi) ^ selection_range(k1, lo, hi)
        assert np.flatnonzero(w).tolist() == [target - lo]


def test_key_bytes_lengths_and_round_trip():
    for d in (1, 7, 8, 25, 32):
        k0, k1 = generate_packed_keys(d, (1 << d) - 1)
        for k in (k0, k1):
            b = k.to_bytes()
            assert len(b) == packed_key_length(d) == 36 + 18 * max(0, d - 7)
            assert b[16:20] == bytes((k.party, k.party, d, 2))
            assert PackedKey.from_bytes(b) == k and PackedKey.from_bytes(b).to_bytes() == b
            assert key_format_of(len(b)) == "packed"
    assert packed_key_length(25) == 360
    for d in range(1, 33):  # no length is both formats'
        assert key_format_of(key_length(d)) == "v1"
        assert key_length(d) != packed_key_length(d)


def test_keys_come_from_os_randomness():
    a = generate_packed_keys(10, 7)[0].root_seed
    b = generate_packed_keys(10, 7)[0].root_seed
    assert a != b


def _mutate(b: bytes, offset: int, value: int) -> bytes:
    out = bytearray(b)
    out[offset] = value
    return bytes(out)


def test_malformed_packed_keys_are_rejected():
    k0, k1 = generate_packed_keys(10, 9)
    b0, b1 = k0.to_bytes(), k1.to_bytes()
    bad = {
        "empty": b"",
        "short header": b0[:19],
        "truncated": b0[:-1],
        "extended": b0 + b"\x00",
        "d zero": _mutate(b0, 18, 0),
        "d 33": _mutate(b0, 18, 33),
        "d mismatching length": _mutate(b0, 18, 11),
        "tag 0": _mutate(b0, 19, 0),
        "tag 3": _mutate(b0, 19, 3),
        "party 2": _mutate(_mutate(b0, 17, 2), 16, 2),
        "root_t 2": _mutate(b0, 16, 2),
        "root_t != party (A)": _mutate(b0, 16, 1),
        "root_t != party (B)": _mutate(b1, 16, 0),
        "tcw_left 2": _mutate(b0, 36, 2),
        "tcw_right 255": _mutate(b0, 37 + 18 * 2, 255),
        "a v1 key": dpf.generate_keys(10, 9)[0].to_bytes(),
    }
    for name, data in bad.items():
        with pytest.raises(KeyFormatError):
            PackedKey.from_bytes(data)
            pytest.fail(name)
    with pytest.raises(KeyFormatError):
        dpf.DpfKey.from_bytes(b0)  # and the v1 parser refuses a packed key


def test_rows_validated_at_once_naming_the_first_bad_row():
    keys = [generate_packed_keys(12, t)[t % 2] for t in range(4)]
    rows = np.frombuffer(b"".join(k.to_bytes() for k in keys), np.uint8).reshape(4, -1).copy()
    rows[2, 20 + 18 * 3 + 17] = 2
    rows[3, 19] = 7
    with pytest.raises(KeyFormatError) as err:
        PackedKeyBatch.from_rows(rows)
    assert err.value.index == 2 and "level 3" in err.value.reason
    rows[2, 20 + 18 * 3 + 17] = 0
    with pytest.raises(KeyFormatError) as err:
        batch_from_rows(rows)
    assert err.value.index == 3 and "format tag" in err.value.reason


def test_batches_layout_select_concat_pickle_and_never_mix_formats():
    keys = [generate_packed_keys(11, t)[t % 2] for t in (0, 5, 2047)]
    b = PackedKeyBatch.from_keys(keys)
    assert b.cw.shape == (3, 4, 4) and b.tcw.shape == (3, 4, 2) and b.levels == 4
    for arr in (b.root_seed, b.root_t, b.cw, b.tcw, b.final_cw):
        assert arr.flags.c_contiguous and not arr.flags.writeable
    assert [k.to_bytes() for k in b.keys()] == [k.to_bytes() for k in keys]
    rows = np.frombuffer(b"".join(k.to_bytes() for k in keys), np.uint8).reshape(3, -1)
    assert isinstance(batch_from_rows(rows.copy()), PackedKeyBatch)
    merged = concat_batches([b.select(0, 1), b.select(1, 3)])
    assert [k.to_bytes() for k in merged.keys()] == [k.to_bytes() for k in keys]
    back = pickle.loads(pickle.dumps(b))
    assert not back.cw.flags.writeable and back.keys()[1].to_bytes() == keys[1].to_bytes()
    v1 = dpf.KeyBatch.from_keys([dpf.generate_keys(11, 3)[0]])
    with pytest.raises(KeyFormatError):
        concat_batches([b, v1])
    with pytest.raises(KeyFormatError):
        PackedKeyBatch.concat([b, v1])
    with pytest.raises(DomainError):
        PackedKeyBatch.from_keys([keys[0], generate_packed_keys(12, 1)[0]])
    # small domains: no tree levels at all
    tiny = PackedKeyBatch.from_keys([generate_packed_keys(3, 2)[0]])
    assert tiny.cw.shape == (1, 0, 4) and tiny.levels == 0


def test_repr_hides_secrets_and_out_of_domain_is_refused():
    k0, _ = generate_packed_keys(9, 77)
    text = repr(k0) + str(k0) + repr(PackedKeyBatch.from_keys([k0]))
    assert k0.root_seed.hex() not in text and "root_seed" not in text
    with pytest.raises(DomainError):
        generate_packed_keys(9, 512)
    with pytest.raises(DomainError):
        k0.eval(512)
    with pytest.raises(DomainError):
        selection_range(k0, 0, 513)
    with pytest.raises(DomainError):
        selections_at(PackedKeyBatch.from_keys([k0]), [512])
    assert packed.batch_format(PackedKeyBatch.from_keys([k0])) == "packed"


def test_the_batch_check_agrees_with_the_rules_key_by_key():
    """The vectorised check (and its all-good fast path) against docs/packed-keys.md section
    4 spelled out per key, on random flag and tag mutations."""
    rng = np.random.default_rng(8)
    d, n = 11, 4
    keys = [generate_packed_keys(d, t)[t % 2] for t in range(5)]
    good = np.frombuffer(b"".join(k.to_bytes() for k in keys), np.uint8).reshape(5, -1)
    flag_bytes = [16, 17, 19] + [20 + 18 * i + 16 + j for i in range(n) for j in (0, 1)]

    def breaks_a_rule(row: np.ndarray) -> bool:
        root_t, party, tag = int(row[16]), int(row[17]), int(row[19])
        levels = [int(row[20 + 18 * i + 16 + j]) for i in range(n) for j in (0, 1)]
        return (tag != 2 or party > 1 or root_t > 1 or root_t != party
                or any(x > 1 for x in levels))

    assert packed.malformed_packed(good.copy()) is None
    for _ in range(300):
        rows = good.copy()
        for _ in range(int(rng.integers(1, 3))):
            rows[rng.integers(5), flag_bytes[rng.integers(len(flag_bytes))]] = rng.choice(
                [0, 1, 2, 255])
        bad = [i for i in range(5) if breaks_a_rule(rows[i])]
        found = packed.malformed_packed(rows)
        assert (found is None) == (not bad)
        if bad:
            assert found[0] == bad[0]
