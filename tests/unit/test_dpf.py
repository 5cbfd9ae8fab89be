"""DPF keys: the worked example, the point-function property, range/point evaluation, parsing."""

import numpy as np
import pytest

from morphogen.constants import key_length
from morphogen.protocol import dpf
from morphogen.protocol.dpf import DomainError, DpfKey, KeyFormatError, eval_points, eval_range

S0 = bytes(range(16))
S1 = bytes(range(16, 32))
K0_HEX = (
    "000102030405060708090a0b0c0d0e0f000004"
    "cd3f287358a378bafc41832129e717060100"
    "be9cfe8c61c65ef841831f15b494c4ca0101"
    "db850a5a14941ff9a749a83e3bb14a820001"
    "e373701da83bc93eb93b98eefaeda3220100"
    "a276eea39b6aa1b5a87953699e490730"
)
FF = b"\xff" * 16


def worked_example():
    return dpf.generate_keys(4, 5, seeds=(S0, S1))


def test_worked_example_key_bytes():
    k0, k1 = worked_example()
    b0 = k0.to_bytes()
    assert len(b0) == 107 == key_length(4)
    assert b0.hex() == K0_HEX
    b1 = k1.to_bytes()
    assert b1[:16] == S1 and b1[16:18] == b"\x01\x01" and b1[18:] == b0[18:]


def test_worked_example_evaluations():
    k0, k1 = worked_example()
    assert k0.eval(5).hex() == "658364a5dce3e5bdf0d5a3a240ee77df"
    assert k1.eval(5).hex() == "9a7c9b5a231c1a420f2a5c5dbf118820"
    assert k0.eval(0).hex() == k1.eval(0).hex() == "cf3976379ffbd09cf20a50436a562c32"


def test_worked_example_scan():
    k0, k1 = worked_example()
    pages = (31 * np.arange(16)[:, None] + np.arange(4096)[None, :]).astype(np.uint8)
    answers = []
    for k in (k0, k1):
        masks = eval_range(k, 0, 16)
        acc = np.zeros(4096, np.uint8)
        for i in range(16):
            acc ^= pages[i] & np.tile(masks[i], 256)
        answers.append(acc)
    assert answers[0][:32].tobytes().hex() == (
        "f0ba319f19a530567f651face14a6f6020ca317f09a5f0361ff50f5ce10a7f60"
    )
    assert np.array_equal(answers[0] ^ answers[1], pages[5])


def test_parse_round_trip_and_key_length():
    for d in (1, 2, 7, 25, 32):
        k0, k1 = dpf.generate_keys(d, (1 << d) - 1)
        for k in (k0, k1):
            b = k.to_bytes()
            assert len(b) == 35 + 18 * d
            parsed = DpfKey.from_bytes(b)
            assert parsed.to_bytes() == b
            assert parsed == k
            assert (parsed.domain_bits, parsed.party) == (d, k.party)


@pytest.mark.parametrize("d", [1, 2, 3, 5, 8])
def test_point_function_whole_small_domains(d):
    for target in range(1 << d):
        k0, k1 = dpf.generate_keys(d, target)
        m = eval_range(k0, 0, 1 << d) ^ eval_range(k1, 0, 1 << d)
        expected = np.zeros((1 << d, 16), np.uint8)
        expected[target] = 0xFF
        assert np.array_equal(m, expected)


@pytest.mark.parametrize("d", [12, 20, 25, 31, 32])
def test_point_function_large_domains(d):
    rng = np.random.default_rng(d)
    target = int(rng.integers(0, 1 << d))
    k0, k1 = dpf.generate_keys(d, target)
    assert bytes(a ^ b for a, b in zip(k0.eval(target), k1.eval(target), strict=True)) == FF
    others = {int(x) for x in rng.integers(0, 1 << d, 20)} - {target}
    pts = np.array(sorted(others | {target, 0, (1 << d) - 1}))
    m = eval_points([k0, k1], pts)
    x = m[0] ^ m[1]
    for j, p in enumerate(pts):
        assert x[j].tobytes() == (FF if p == target else bytes(16))
    # a window around the target, unaligned on both ends
    lo, hi = max(0, target - 37), min(1 << d, target + 1000)
    w = eval_range(k0, lo, hi) ^ eval_range(k1, lo, hi)
    assert np.flatnonzero(w.any(axis=1)).tolist() == [target - lo]
    assert w[target - lo].tobytes() == FF


def test_eval_range_equals_point_walks_on_any_range():
    k0, _ = dpf.generate_keys(13, 4321)
    rng = np.random.default_rng(5)
    for _ in range(15):
        a = int(rng.integers(0, 1 << 13))
        b = int(rng.integers(a, min(1 << 13, a + 9000) + 1))
        r = eval_range(k0, a, b)
        assert r.shape == (b - a, 16)
        for i in {0, (b - a) // 2, b - a - 1} if b > a else set():
            assert r[i].tobytes() == k0.eval(a + i)
    assert np.array_equal(eval_range(k0, 0, 1 << 13)[100:5000], eval_range(k0, 100, 5000))
    assert np.array_equal(
        eval_points([k0], np.arange(3000, 3100))[0], eval_range(k0, 3000, 3100)
    )


def test_out_of_domain_targets_and_pages():
    with pytest.raises(DomainError):
        dpf.generate_keys(4, 16)
    with pytest.raises(DomainError):
        dpf.generate_keys(4, -1)
    for d in (0, 33):
        with pytest.raises(DomainError):
            dpf.generate_keys(d, 0)
    k0, _ = dpf.generate_keys(4, 3)
    with pytest.raises(DomainError):
        k0.eval(16)
    with pytest.raises(DomainError):
        eval_range(k0, 0, 17)
    with pytest.raises(DomainError):
        eval_points([k0], [16])


def _mutate(b: bytes, offset: int, value: int) -> bytes:
    out = bytearray(b)
    out[offset] = value
    return bytes(out)


def test_malformed_keys_are_rejected():
    k0, k1 = dpf.generate_keys(6, 9)
    b0, b1 = k0.to_bytes(), k1.to_bytes()
    bad = {
        "empty": b"",
        "short header": b0[:18],
        "truncated": b0[:-1],
        "extended": b0 + b"\x00",
        "d zero": _mutate(b0, 18, 0),
        "d 33": _mutate(b0, 18, 33) + bytes(18 * 27),
        "d mismatching length": _mutate(b0, 18, 7),
        "party 2": _mutate(_mutate(b0, 17, 2), 16, 2),
        "root_t 2": _mutate(b0, 16, 2),
        "root_t != party (A)": _mutate(b0, 16, 1),
        "root_t != party (B)": _mutate(b1, 16, 0),
        "tcw_left 2": _mutate(b0, 35, 2),
        "tcw_right 255": _mutate(b0, 36 + 18 * 5, 255),
    }
    for name, data in bad.items():
        with pytest.raises(KeyFormatError):
            DpfKey.from_bytes(data)
        assert issubclass(KeyFormatError, ValueError), name


def test_key_repr_hides_secrets():
    k0, _ = dpf.generate_keys(8, 77)
    text = repr(k0) + str(k0) + repr(dpf.KeyBatch.from_keys([k0]))
    assert k0.root_seed.hex() not in text and "root_seed" not in text


def test_key_batch_layout_and_domain_check():
    keys = [dpf.generate_keys(9, t)[t % 2] for t in range(5)]
    b = dpf.KeyBatch.from_keys(keys)
    assert len(b) == 5 and b.domain_bits == 9
    assert b.root_seed.shape == (5, 4) and b.root_seed.dtype == np.uint32
    assert b.cw.shape == (5, 9, 4) and b.tcw.shape == (5, 9, 2) and b.final_cw.shape == (5, 4)
    for arr in (b.root_seed, b.root_t, b.cw, b.tcw, b.final_cw):
        assert arr.flags.c_contiguous
    assert b.root_seed[2].tobytes() == keys[2].root_seed
    assert b.cw[3, 4].tobytes() == keys[3].cw[4]
    assert list(b.tcw[1, :, 1]) == list(keys[1].tcw_right)
    with pytest.raises(DomainError):
        dpf.KeyBatch.from_keys([keys[0], dpf.generate_keys(10, 1)[0]])


def test_key_batch_gives_the_keys_back():
    keys = [dpf.generate_keys(11, t)[t % 2] for t in (0, 5, 2047)]
    back = dpf.KeyBatch.from_keys(keys).keys()
    assert [k.to_bytes() for k in back] == [k.to_bytes() for k in keys]


def test_key_batch_arrays_are_read_only_copies_of_the_rows():
    keys = [dpf.generate_keys(6, t)[0] for t in (1, 2)]
    rows = np.frombuffer(b"".join(k.to_bytes() for k in keys), np.uint8).reshape(2, -1).copy()
    b = dpf.KeyBatch.from_rows(rows)
    rows[:] = 0  # the batch owns its arrays: the request buffer may be reused
    assert [k.to_bytes() for k in b.keys()] == [k.to_bytes() for k in keys]
    for arr in (b.root_seed, b.root_t, b.cw, b.tcw, b.final_cw):
        assert not arr.flags.writeable and arr.flags.c_contiguous


def test_key_rows_are_validated_at_once_and_name_the_first_bad_row():
    keys = [dpf.generate_keys(5, t)[t % 2] for t in range(4)]
    rows = np.frombuffer(b"".join(k.to_bytes() for k in keys), np.uint8).reshape(4, -1).copy()
    rows[2, dpf._HEADER + 18 * 3 + 17] = 2  # level 3's right control bit
    rows[3, 17] = 5  # party byte
    with pytest.raises(KeyFormatError) as err:
        dpf.KeyBatch.from_rows(rows)
    assert err.value.index == 2 and "level 3" in err.value.reason
    rows[2, dpf._HEADER + 18 * 3 + 17] = 0
    with pytest.raises(KeyFormatError) as err:
        dpf.KeyBatch.from_rows(rows)
    assert err.value.index == 3 and "party byte" in err.value.reason
    other = np.frombuffer(dpf.generate_keys(5, 1)[0].to_bytes(), np.uint8).copy()
    other[18] = 4  # another domain, right length for neither
    with pytest.raises(KeyFormatError):
        dpf.KeyBatch.from_rows(np.stack([other]))


def test_the_batch_check_agrees_with_the_rules_key_by_key():
    """The vectorised flag check against PROTOCOL.md section 4 spelled out per key, on random
    flag mutations (any single bad key of a batch must be found, and only a bad one)."""
    rng = np.random.default_rng(8)
    d = 6
    keys = [dpf.generate_keys(d, t)[t % 2] for t in range(5)]
    good = np.frombuffer(b"".join(k.to_bytes() for k in keys), np.uint8).reshape(5, -1)
    flag_bytes = [16, 17] + [dpf._HEADER + 18 * i + 16 + j for i in range(d) for j in (0, 1)]

    def breaks_a_rule(row: np.ndarray) -> bool:
        root_t, party = int(row[16]), int(row[17])
        levels = [int(row[dpf._HEADER + 18 * i + 16 + j]) for i in range(d) for j in (0, 1)]
        return party > 1 or root_t > 1 or root_t != party or any(x > 1 for x in levels)

    for _ in range(300):
        rows = good.copy()
        for _ in range(int(rng.integers(1, 3))):
            rows[rng.integers(5), flag_bytes[rng.integers(len(flag_bytes))]] = rng.choice(
                [0, 1, 2, 255])
        bad = [i for i in range(5) if breaks_a_rule(rows[i])]
        found = dpf.malformed_key(rows)
        assert (found is None) == (not bad)
        if bad:
            assert found[0] == bad[0]


def test_key_batches_concatenate_and_select_in_order():
    keys = [dpf.generate_keys(7, t)[t % 2] for t in range(5)]
    a, b = dpf.KeyBatch.from_keys(keys[:2]), dpf.KeyBatch.from_keys(keys[2:])
    merged = dpf.KeyBatch.concat([a, b])
    assert [k.to_bytes() for k in merged.keys()] == [k.to_bytes() for k in keys]
    assert [k.to_bytes() for k in merged.select(1, 4).keys()] == [
        k.to_bytes() for k in keys[1:4]]
    assert dpf.KeyBatch.concat([a]) is a
    with pytest.raises(DomainError):
        dpf.KeyBatch.concat([a, dpf.KeyBatch.from_keys([dpf.generate_keys(8, 1)[0]])])


def test_jitted_key_generation_equals_the_plain_construction():
    rng = np.random.default_rng(21)
    for d in (1, 2, 5, 17, 25, 32):
        for _ in range(3):
            target = int(rng.integers(0, 1 << d))
            seeds = (rng.bytes(16), rng.bytes(16))
            fast = dpf.generate_keys(d, target, seeds=seeds)
            plain = dpf.generate_keys_reference(d, target, seeds=seeds)
            assert [k.to_bytes() for k in fast] == [k.to_bytes() for k in plain]
    assert dpf.generate_keys_reference(4, 5, seeds=(S0, S1))[0].to_bytes().hex() == K0_HEX
