"""Ethereum state as keyword records: the three encodings round-trip, and the export file
reads back what was written and refuses bad lines with their line numbers."""

from __future__ import annotations

import json
import random

import pytest

from morphogen.chain.export import (
    AccountState,
    BlockRef,
    ExportError,
    ExportHeader,
    read_accounts,
    read_header,
    state_records,
    write_export,
)
from morphogen.chain.state import (
    ACCOUNT_VALUE_SIZE,
    CODE_CHUNK_SIZE,
    CODE_VALUE_SIZE,
    EMPTY_CODE_HASH,
    Account,
    code_length,
    code_records,
    decode_account,
    decode_storage_value,
    encode_account,
    join_code,
    keccak256,
    split_storage_key,
    storage_key,
    storage_records,
)

ADDRESS = bytes.fromhex("f39fd6e51aad88f6f4ce6ab8827279cfffb92266")


def test_keccak_of_nothing_is_the_well_known_empty_code_hash() -> None:
    assert EMPTY_CODE_HASH.hex() == (
        "c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470")
    # keccak-256, not NIST SHA3-256 (3a985da7... for b"abc"), which differs in its padding
    assert keccak256(b"abc").hex().startswith("4e03657aea45a94f")


@pytest.mark.parametrize("account", [
    Account(0, 0),
    Account(1, 10_000 * 10**18, keccak256(b"\x60\x00")),
    Account(2**64 - 1, 2**256 - 1, bytes(range(32))),
])
def test_accounts_round_trip(account: Account) -> None:
    value = encode_account(account)
    assert len(value) == ACCOUNT_VALUE_SIZE == 72
    assert value[:8] == account.nonce.to_bytes(8, "big")
    assert value[8:40] == account.balance.to_bytes(32, "big")
    assert value[40:] == account.code_hash
    assert decode_account(value) == account


def test_accounts_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="nonce"):
        Account(2**64, 0)
    with pytest.raises(ValueError, match="balance"):
        Account(0, 2**256)
    with pytest.raises(ValueError, match="72 bytes"):
        decode_account(bytes(71))


def test_storage_records_leave_zero_words_out() -> None:
    storage = {7: 0x1234, 0: 0, 2**256 - 1: 2**256 - 1, "0x2": "0x" + "00" * 31 + "01"}
    records = list(storage_records("0x" + ADDRESS.hex(), storage))
    assert [split_storage_key(k) for k, _ in records] == [
        (ADDRESS, (2).to_bytes(32, "big")), (ADDRESS, (7).to_bytes(32, "big")),
        (ADDRESS, b"\xff" * 32)]
    assert [decode_storage_value(v) for _, v in records] == [1, 0x1234, 2**256 - 1]
    assert records[1][0] == storage_key(ADDRESS, 7) and len(records[1][0]) == 52
    assert decode_storage_value(None) == 0


@pytest.mark.parametrize("size", [0, 1, 1020, 1021, 5000])
def test_code_round_trips_through_its_chunks(size: int) -> None:
    code = random.Random(size).randbytes(size)
    records = code_records(code)
    assert len(records) == -(-size // CODE_CHUNK_SIZE)
    code_hash = keccak256(code)
    for i, (key, value) in enumerate(records):
        assert key == code_hash + i.to_bytes(4, "big")
        assert len(value) == CODE_VALUE_SIZE and code_length(value) == size
    assert join_code(code_hash, [v for _, v in records]) == code


def test_joining_code_checks_every_chunk() -> None:
    code = random.Random(1).randbytes(2100)
    code_hash = keccak256(code)
    values = [v for _, v in code_records(code)]
    with pytest.raises(ValueError, match="3 chunks, got 2"):
        join_code(code_hash, values[:2])
    with pytest.raises(ValueError, match="past the code's end"):
        join_code(code_hash, values[:2] + [values[2][:-1] + b"\x01"])
    with pytest.raises(ValueError, match="does not hash"):
        join_code(code_hash, [values[0][:10] + b"\xaa" + values[0][11:]] + values[1:])
    with pytest.raises(ValueError, match="states length"):
        join_code(code_hash, values[:1] + [(9).to_bytes(4, "big") + values[1][4:]] + values[2:])
    assert join_code(EMPTY_CODE_HASH, []) == b""


# -- the export file ---------------------------------------------------------------------------

HEADER = ExportHeader(31337, BlockRef(5, "0x" + "11" * 32, "0x" + "22" * 32, "0x" + "33" * 32))


def sample_accounts() -> list[AccountState]:
    return [AccountState(bytes([i]) * 20, i, 10**18 * i, bytes([0x60, i]) * (600 * i),
                         {i: i + 1, 2**255: 2**256 - 1} if i % 2 else {})
            for i in range(1, 6)]


def test_an_export_reads_back_what_was_written(tmp_path) -> None:
    path = tmp_path / "state.jsonl"
    accounts = sample_accounts()
    assert write_export(path, HEADER, accounts) == 5
    assert read_header(path) == HEADER
    assert list(read_accounts(path)) == accounts
    first = json.loads(path.read_text().splitlines()[0])
    assert first == {"format": "morphogen-state/1", "chain_id": 31337,
                     "block": {"number": 5, "hash": "0x" + "11" * 32,
                               "parent_hash": "0x" + "22" * 32, "state_root": "0x" + "33" * 32}}
    line = json.loads(path.read_text().splitlines()[1])
    assert line == {"address": "0x" + "01" * 20, "nonce": 1, "balance": hex(10**18),
                    "code": "0x" + "6001" * 600,
                    "storage": {"0x" + "00" * 31 + "01": "0x" + "00" * 31 + "02",
                                "0x80" + "00" * 31: "0x" + "ff" * 32}}


def test_the_writer_refuses_unsorted_accounts_and_leaves_no_file(tmp_path) -> None:
    path = tmp_path / "state.jsonl"
    with pytest.raises(ValueError, match="out of order"):
        write_export(path, HEADER, sample_accounts()[::-1])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("line", "message"), [
    ('{"address": "0x12", "nonce": 0, "balance": "0x0"}', "state.jsonl:3: address '0x12'"),
    ('{"address": "0x' + "02" * 20 + '", "nonce": -1, "balance": "0x0"}', ":3: nonce -1"),
    ('{"address": "0x' + "02" * 20 + '", "nonce": 0, "balance": "12"}', ":3: balance '12'"),
    ('{"address": "0x' + "02" * 20 + '", "nonce": 0, "balance": "0x0", "code": "0xabc"}',
     ":3: code '0xabc'"),
    ('{"address": "0x' + "01" * 20 + '", "nonce": 0, "balance": "0x0"}', ":3: address 0x0101"),
    ("{not json", ":3: not JSON"),
])
def test_bad_lines_are_named_by_their_number(tmp_path, line: str, message: str) -> None:
    path = tmp_path / "state.jsonl"
    write_export(path, HEADER, sample_accounts()[:1])
    path.write_text(path.read_text() + line + "\n")
    with pytest.raises(ExportError, match=message) as caught:
        list(read_accounts(path))
    assert "\n" not in str(caught.value)


def test_a_file_without_the_header_is_not_an_export(tmp_path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text('{"key": "0x01", "value": "0x02"}\n')
    with pytest.raises(ExportError, match="records.jsonl:1: not a state export"):
        read_header(path)


def test_state_records_give_the_three_tables(tmp_path) -> None:
    path = tmp_path / "state.jsonl"
    accounts = sample_accounts()
    twin = AccountState(b"\x09" * 20, 0, 0, accounts[2].code)  # shares its code
    write_export(path, HEADER, accounts + [twin])
    records = state_records(path)
    got = dict(records.accounts)
    assert len(got) == 6 and decode_account(got[b"\x03" * 20]) == Account(
        3, 3 * 10**18, keccak256(accounts[2].code))
    assert dict(records.storage) == {
        storage_key(a.address, s): w.to_bytes(32, "big")
        for a in accounts for s, w in a.storage.items()}
    code = list(records.code)
    assert len(code) == len({k for k, _ in code})  # shared code once
    by_hash: dict[bytes, list[bytes]] = {}
    for key, value in code:
        by_hash.setdefault(key[:32], []).append(value)
    assert {join_code(h, v) for h, v in by_hash.items()} == {a.code for a in accounts}
    assert list(records.accounts) == list(records.accounts)  # re-iterable
