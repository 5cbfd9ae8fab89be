"""`morphogen chain export` and `chain build` against a real anvil: the node's state at its
head, in one owner directory of three tables anchored at that block; bad input, one line
each."""

from __future__ import annotations

from pathlib import Path

from _kw import lookup
from chain_node import DEV_ACCOUNTS, DEV_BALANCE, free_port, running_anvil
from test_chain_export import INIT, RUNTIME, SLOT, WORD, wait_receipt

from cluster.cli import main
from morphogen.chain.rpc import EthRpc, quantity
from morphogen.chain.state import decode_account, decode_storage_value, storage_key
from morphogen.keyword.descriptor import parts_of
from morphogen.keyword.owner import OwnerTable


def test_export_then_build_gives_tables_anchored_at_the_block(tmp_path: Path, capsys) -> None:
    assert main(["records", "keygen", "--out", str(tmp_path / "o.key")]) == 0
    with running_anvil(chain_id=31337) as url, EthRpc(url) as rpc:
        sender = DEV_ACCOUNTS[0]
        wait_receipt(rpc, rpc.call("eth_sendTransaction",
                                   {"from": sender, "to": DEV_ACCOUNTS[2], "value": "0x5"}))
        deployed = wait_receipt(rpc, rpc.call("eth_sendTransaction", {
            "from": sender, "data": "0x" + (INIT + RUNTIME).hex(), "gas": quantity(2_000_000)}))
        head = rpc.block("latest")
        capsys.readouterr()
        assert main(["chain", "export", "--rpc", url, "--out", str(tmp_path / "s.jsonl"),
                     "--chain-id", "31337", "--check", "all"]) == 0
        assert f"at block 2 ({head['hash']})" in capsys.readouterr().out
        # another chain id: refused naming both, nothing written
        assert main(["chain", "export", "--rpc", url, "--out", str(tmp_path / "x.jsonl"),
                     "--chain-id", "1"]) == 1
        err = capsys.readouterr().err
        assert "31337" in err and " 1" in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "x.jsonl").exists()
    assert main(["chain", "build", "--state", str(tmp_path / "s.jsonl"), "--signing-key",
                 str(tmp_path / "o.key"), "--out", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "accounts:" in out and "storage:" in out and "code:" in out
    owner = OwnerTable(tmp_path / "t")
    pages = owner.pages()
    tables = {}
    for part in parts_of(pages):
        desc = part.descriptor
        assert desc.anchor is not None
        assert (desc.anchor.chain_id, desc.anchor.number, desc.anchor.hash) == (
            31337, 2, head["hash"])
        tables[desc.name] = (pages[part.first:part.first + part.span], desc)
    assert sorted(tables) == ["accounts", "code", "storage"]
    pages, desc = tables["accounts"]
    got = lookup(pages, desc, [bytes.fromhex(DEV_ACCOUNTS[2][2:])])[0]
    assert got is not None and decode_account(got).balance == DEV_BALANCE + 5
    contract = bytes.fromhex(deployed["contractAddress"][2:])
    pages, desc = tables["storage"]
    assert decode_storage_value(lookup(pages, desc, [storage_key(contract, SLOT)])[0]) == WORD
    # built once: a second build into the same place is refused
    assert main(["chain", "build", "--state", str(tmp_path / "s.jsonl"), "--signing-key",
                 str(tmp_path / "o.key"), "--out", str(tmp_path / "t")]) == 2
    assert "not empty" in capsys.readouterr().err


def test_bad_input_is_one_line_each(tmp_path: Path, capsys) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    assert main(["chain", "export", "--rpc", closed, "--out", str(tmp_path / "s.jsonl"),
                 "--timeout", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "127.0.0.1" in err
    (tmp_path / "bad.jsonl").write_text('{"format": "something else"}\n')
    assert main(["records", "keygen", "--out", str(tmp_path / "o.key")]) == 0
    capsys.readouterr()
    assert main(["chain", "build", "--state", str(tmp_path / "bad.jsonl"), "--signing-key",
                 str(tmp_path / "o.key"), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.jsonl" in err
