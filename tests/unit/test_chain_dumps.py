"""Node state dumps (geth's JSON lines, anvil's JSON) read in ranges, encoded apart and placed:
the tables equal, byte for byte, what the one-process build makes of the same state; a
malformed line is refused with its line number."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from morphogen.chain import anvil_dump, bulk, dumps
from morphogen.chain.export import AccountState, BlockRef, ExportHeader, state_records, write_export
from morphogen.chain.state import code_chunks
from morphogen.chain.tables import build_chain_tables
from morphogen.keyword import radix
from morphogen.keyword.descriptor import Anchor
from morphogen.keyword.key_index import HEAP, META, SLOTS, KeyIndex
from morphogen.keyword.records import RecordError
from tests.unit._chain_dump import geth_dump

ANCHOR = Anchor(1, 5, "0x" + "ab" * 32)
KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


def single(tmp: Path, state: list[AccountState], seed: int):
    export = tmp / "export.jsonl"
    write_export(export, ExportHeader(1, BlockRef(5, ANCHOR.hash, "0x" + "cd" * 32,
                                                  "0x" + "11" * 32)),
                 sorted(state, key=lambda a: a.address))
    return build_chain_tables(state_records(export), KEY, ANCHOR, seed=seed, created=1000,
                              min_records=64)


def encoded(path: Path, target: int, seed: int) -> list[dict]:
    info = dumps.info(path)
    plans = bulk.plan(seed)
    return [bulk.encode_range(str(path), a, b, plans)
            for a, b in dumps.line_ranges(path, info.body, target)]


@pytest.mark.parametrize("drop_codes", [False, True])
@pytest.mark.parametrize("target", [1, 3000, 1 << 30])
def test_ranges_built_apart_equal_the_one_process_build(tmp_path, target, drop_codes):
    state = geth_dump(tmp_path / "d.jsonl", 300)
    parts = encoded(tmp_path / "d.jsonl", target, seed=5)
    # ranges done in any order: their outputs are put in order by key, not by arrival
    random.Random(0).shuffle(parts)
    if drop_codes:  # as an import reads them in: a code's records kept by the first range only
        seen: set[bytes] = set()
        chunks_before = sum(int(p["code_chunks"].sum()) for p in parts)
        for part in parts:
            bulk.drop_seen_codes(part, seen)
        held = sum(len(p["code_keys"]) for p in parts)
        assert held == sum(int(p["code_chunks"].sum()) for p in parts)
        # each distinct code's chunks exactly once, however many ranges have it
        assert held == sum(code_chunks(len(c)) for c in {a.code for a in state if a.code})
        if target < 1 << 30:  # several ranges share the dump's four codes
            assert held < chunks_before
    got = bulk.assemble(parts, seed=5, signing_key=KEY, anchor=ANCHOR, created=1000,
                        min_records=64)
    want = single(tmp_path, state, seed=5)
    assert got.pages.shape == want.pages.shape
    assert np.array_equal(got.pages, want.pages)
    assert list(got.keys.items()) == list(want.keys.items())
    assert got.descriptor == want.descriptor


def _keys_of(parts: list[dict]):
    """`assemble`'s `keys_apart`, from copies of the ranges' keys (assemble drops its own)."""
    kept = {f: [p[f].copy() for p in parts] for f in ("acc_keys", "sto_keys")}

    def keys(name, order):
        prefix = bulk.PREFIXES[name]
        return bulk.gathered([{f"{prefix}_keys": k} for k in kept[f"{prefix}_keys"]],
                             f"{prefix}_keys", order, bulk.KEY_SIZES[name])

    return keys


@pytest.mark.parametrize("redraw", [False, True])
@pytest.mark.parametrize("target", [1, 3000])
def test_keys_indexed_apart_equal_the_one_process_build(tmp_path, monkeypatch, target, redraw):
    """The import's split: one process places from the values, tags and hashes, another builds
    the key index from the keys and tags; together they are the one-process build's table.
    `redraw`: no draw is the planned one, so every placement hashes keys read from the ranges
    (the path of a placement that must draw other seeds)."""
    state = geth_dump(tmp_path / "d.jsonl", 300)
    parts = encoded(tmp_path / "d.jsonl", target, seed=5)
    random.Random(0).shuffle(parts)
    seen: set[bytes] = set()
    for part in parts:
        bulk.drop_seen_codes(part, seen)
    index_parts = [{f: p[f].copy() for f in bulk.INDEX_FIELDS} for p in parts]
    heap_parts = [{f: p[f].copy() for f in bulk.INDEX_FIELDS} for p in parts]
    keys_apart = _keys_of(parts)
    place_parts = [{f: p[f] for f in bulk.PLACE_FIELDS} for p in parts]
    asked = []

    def counted(name, order):
        asked.append(name)
        return keys_apart(name, order)

    if redraw:
        real = bulk.plan
        monkeypatch.setattr(bulk, "plan", lambda seed: {
            name: (token, (0, 0, 0)) for name, (token, _) in real(seed).items()})
    got = bulk.assemble(place_parts, seed=5, signing_key=KEY, anchor=ANCHOR, created=1000,
                        min_records=64, keys_apart=counted)
    want = single(tmp_path, state, seed=5)
    assert np.array_equal(got.pages, want.pages)
    assert got.descriptor == want.descriptor
    assert sorted(set(asked)) == (["accounts", "storage"] if redraw else [])
    assert list(bulk.key_columns(index_parts).items()) == list(want.keys.items())
    # the import's index: its keys gathered straight into the heap file, then placed; the
    # same files as the index of the one-process build's keys
    apart = tmp_path / "apart"
    apart.mkdir()
    columns = bulk.key_columns(heap_parts, keys_at=apart / HEAP)
    assert list(columns.items()) == list(want.keys.items())
    with KeyIndex.build(apart, columns, 256), KeyIndex.build(tmp_path / "one", want.keys, 256):
        pass
    for name in (SLOTS, HEAP, META):
        assert (apart / name).read_bytes() == (tmp_path / "one" / name).read_bytes()


def test_the_index_apart_refuses_an_address_twice(tmp_path):
    path = tmp_path / "d.jsonl"
    geth_dump(path, 10)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines + [lines[4]]) + "\n")
    parts = encoded(path, 200, seed=1)
    with pytest.raises(RecordError, match="twice"):
        bulk.key_columns([{f: p[f] for f in bulk.INDEX_FIELDS} for p in parts])


@pytest.mark.parametrize("dtype,width", [(np.uint8, 52), (np.uint64, 3)])
def test_rows_gathered_from_the_ranges_equal_a_gather_of_their_concatenation(dtype, width):
    rng = np.random.default_rng(4)
    parts = [{"f": rng.integers(0, 255, (n, width)).astype(dtype)} for n in (5, 0, 17, 1, 9)]
    whole = np.concatenate([p["f"] for p in parts])
    for order in (rng.permutation(len(whole)),  # every row
                  np.sort(rng.choice(len(whole), 11, replace=False))[::-1],  # some (code)
                  np.zeros(0, np.int64)):
        got = bulk.gathered(parts, "f", order.astype(np.int64), width, dtype)
        assert got.dtype == dtype and np.array_equal(got, whole[order])
        # into rows of an array given, as the index gathers each table into its place
        into = np.zeros((len(order) + 4, width), dtype)
        bulk.gathered(parts, "f", order.astype(np.int64), width, dtype, out=into[2:-2])
        assert np.array_equal(into[2:-2], whole[order]) and not into[:2].any() \
            and not into[-2:].any()
    with pytest.raises(ValueError, match="C-contiguous rows"):
        bulk.gathered(parts, "f", np.arange(3), width, dtype, out=np.zeros((3, width + 1), dtype))


def test_the_seed_decides_the_table(tmp_path):
    state = geth_dump(tmp_path / "d.jsonl", 40)
    a, b = single(tmp_path, state, seed=1), single(tmp_path, state, seed=2)
    assert not np.array_equal(a.pages, b.pages)
    assert np.array_equal(a.pages, single(tmp_path, state, seed=1).pages)


def test_geth_shapes_parse():
    line = json.dumps({"balance": "1000000000000000000000", "nonce": 3, "root": "0x00",
                       "codeHash": "0x00", "code": "0x6001",
                       "storage": {"0x" + "00" * 31 + "07": "1234",
                                   "0x" + "00" * 31 + "02": "0"},
                       "address": "0x00000000000000000000000000000000000000bB"})
    account = dumps.parse_account(line)
    assert account[:4] == ("00" * 19 + "bb", 3, 10**21, "6001")
    assert account.storage == [("00" * 31 + "07", "0" * 60 + "1234")]
    # other spellings of the same storage (upper case, short slots, 0x words) read the same
    for storage in ({"0x" + "00" * 31 + "07": "0x1234", "0x02": "0x0"},
                    {"0X7": "0x" + "0" * 60 + "1234"}, {"0x" + "00" * 31 + "07": "01234"},
                    {"7": "1234", "0x" + "ab" * 32: "0"}):
        other = json.loads(line)
        other["storage"] = storage
        assert dumps.parse_account(json.dumps(other)).storage == account.storage, storage
    other["storage"] = {"0x07": "1", "0x7": "2"}
    with pytest.raises(dumps.LineError, match="twice"):
        dumps.parse_account(json.dumps(other))


@pytest.mark.parametrize("bad, says", [
    ("{not json", "not JSON"),
    ('{"balance": "1", "nonce": 0, "key": "0x1234"}', "preimage"),
    ('{"balance": "x1", "nonce": 0, "address": "0x' + "11" * 20 + '"}', "balance"),
    ('{"balance": "1", "nonce": -1, "address": "0x' + "11" * 20 + '"}', "nonce"),
    ('{"balance": "1", "nonce": 0, "address": "0x' + "11" * 20 + '", "storage": '
     '{"0xzz": "1"}}', "storage slot"),
    ('{"balance": "1", "nonce": 0, "address": "0x' + "11" * 20 + '", "code": "0x123"}', "code"),
    ("[1, 2]", "JSON object"),
    ('{"balance": "1", "nonce": 0, "address": "0x1234"}', "address"),
])
def test_a_malformed_line_is_refused_with_its_number(tmp_path, bad, says):
    path = tmp_path / "d.jsonl"
    geth_dump(path, 30)
    lines = path.read_text().splitlines()
    lines.insert(17, bad)
    path.write_text("\n".join(lines) + "\n")
    info = dumps.info(path)
    plans = bulk.plan(1)
    ranges = dumps.line_ranges(path, info.body, 500)
    for a, b in ranges:
        try:
            bulk.encode_range(str(path), a, b, plans)
        except bulk.RangeError as exc:
            assert dumps.line_number(path, a) + exc.index == 18
            assert says in str(exc)
            break
    else:
        pytest.fail("the malformed line was read")


def test_an_address_twice_is_refused(tmp_path):
    path = tmp_path / "d.jsonl"
    geth_dump(path, 10)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines + [lines[4]]) + "\n")
    info = dumps.info(path)
    with pytest.raises(bulk.RangeError, match="twice") as caught:
        bulk.encode_range(str(path), info.body, info.size, bulk.plan(1))
    assert caught.value.index == 10  # the repeat, the 12th line, is the range's 11th
    # across ranges: found where they meet
    parts = encoded(path, 200, seed=1)
    with pytest.raises(RecordError, match="twice"):
        bulk.assemble(parts, seed=1, signing_key=KEY, anchor=ANCHOR, created=1000)


@pytest.mark.parametrize("fault", ["key", "tag", "zero_tag", None])
def test_repeats_are_found_among_many_records(fault):
    # past the size where the tags are sorted on every core
    rng = np.random.default_rng(3)
    n = radix.SMALL + 1000
    keys = np.sort(rng.integers(0, 2**63, n, dtype=np.int64)).view(np.uint8).reshape(n, 8)
    keys = np.ascontiguousarray(keys[:, ::-1])  # big-endian: byte order is number order
    tags = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    if fault == "key":
        keys[n - 7] = keys[n - 8]
    elif fault == "tag":
        tags[n - 3] = tags[11]
    elif fault == "zero_tag":
        tags[500] = 0
    if fault is None:
        bulk._refuse_repeats(keys, tags, "storage key")
        return
    says = {"key": f"storage key 0x{keys[n - 7].tobytes().hex()} twice",
            "tag": "have the same 128-bit tag", "zero_tag": "all zeros"}[fault]
    with pytest.raises(RecordError, match=says):
        bulk._refuse_repeats(keys, tags, "storage key")


def test_line_ranges_cover_the_file_at_line_starts(tmp_path):
    path = tmp_path / "d.jsonl"
    geth_dump(path, 50)
    data = path.read_bytes()
    body = dumps.info(path).body
    ranges = dumps.line_ranges(path, body, 700)
    assert ranges[0][0] == body and ranges[-1][1] == len(data) and len(ranges) > 3
    for (_, b), (c, _) in zip(ranges, ranges[1:], strict=False):
        assert b == c and data[b - 1:b] == b"\n"


def test_anvil_state_is_rewritten_as_lines(tmp_path):
    address = "0x" + "ab" * 20
    state = {"block": {"number": "0x9"}, "best_block_number": "0x9", "accounts": {
        address: {"nonce": 2, "balance": "0x10", "code": "0x6001",
                  "storage": {"0x" + "00" * 31 + "01": "0x" + "00" * 31 + "05"}}}}
    (tmp_path / "a.json").write_text(json.dumps(state))
    info = anvil_dump.anvil_lines(tmp_path / "a.json", tmp_path / "a.jsonl")
    assert info.number == 9 and info.root is None
    [(_, line)] = list(dumps.read_range(tmp_path / "a.jsonl", info.body, info.size))
    account = dumps.parse_account(line)
    assert account[:4] == ("ab" * 20, 2, 16, "6001")
    assert account.storage == [("00" * 31 + "01", "0" * 63 + "5")]
    state["accounts"][address]["balance"] = "lots"
    (tmp_path / "a.json").write_text(json.dumps(state))
    with pytest.raises(dumps.DumpError, match="balance"):
        anvil_dump.anvil_lines(tmp_path / "a.json", tmp_path / "b.jsonl")
    assert not (tmp_path / "b.jsonl").exists()


def _anvil_state(n: int) -> dict:
    rng = random.Random(n)
    accounts = {}
    for i in range(n):
        storage = {"0x" + rng.randbytes(32).hex(): "0x" + rng.randbytes(32).hex()
                   for _ in range(rng.randrange(0, 4))}
        accounts["0x" + rng.randbytes(20).hex()] = {
            "nonce": i, "balance": hex(rng.randrange(1, 10**24)),
            "code": "0x" + rng.randbytes(rng.randrange(0, 40)).hex(), "storage": storage}
    return accounts


@pytest.mark.parametrize("form", ["plain", "gzip", "hex"])
@pytest.mark.parametrize("chunk", [7, 1 << 20])
def test_anvil_dumps_are_read_as_a_stream_in_every_form(tmp_path, form, chunk):
    """The accounts are taken one at a time through a window of `chunk` bytes (7: every
    value and name is cut across reads), whatever members come before or after them, from a
    plain, a gzip'd and a hex-in-a-string gzip'd dump; the lines are those of the whole read."""
    import gzip

    accounts = _anvil_state(40)
    state = {"block": {"number": "0x2a", "timestamp": "0x1"}, "accounts": accounts,
             "blocks": [{"header": {"number": "0x2a"}, "transactions": []}] * 3,
             "best_block_number": "0x2a", "historical_states": None}
    text = json.dumps(state, indent=1).encode()
    path = tmp_path / "a.json"
    if form == "gzip":
        path.write_bytes(gzip.compress(text))
    elif form == "hex":
        path.write_bytes(json.dumps("0x" + gzip.compress(text).hex()).encode())
    else:
        path.write_bytes(text)
    info = anvil_dump.anvil_lines(path, tmp_path / "a.jsonl", chunk=chunk)
    assert info.number == 42
    lines = [json.loads(line) for _, line in
             dumps.read_range(tmp_path / "a.jsonl", info.body, info.size)]
    assert lines == [{**account, "address": address} for address, account in accounts.items()]


@pytest.mark.parametrize(("text", "match"), [
    (b'{"accounts": {"0x' + b"ab" * 20 + b'": {"nonce": 1, "balance": "0x1"', "not JSON"),
    (b'{"accounts": {}} {"more": 1}', "more after"),                      # two documents
    (b'{"best_block_number": "0x1"}', 'no "accounts" object'),
    (b'[1, 2]', 'no "accounts" object'),
    (b'{"accounts": {"0x' + b"ab" * 20 + b'": 5}}', "is not an object"),
])
def test_a_bad_anvil_dump_is_named_and_writes_nothing(tmp_path, text, match):
    (tmp_path / "a.json").write_bytes(text)
    with pytest.raises(dumps.DumpError, match=match):
        anvil_dump.anvil_lines(tmp_path / "a.json", tmp_path / "a.jsonl", chunk=5)
    assert list(tmp_path.iterdir()) == [tmp_path / "a.json"]
