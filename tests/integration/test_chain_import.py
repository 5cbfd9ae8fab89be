"""`morphogen chain import` on the session's local Ray: the owner directory equals, byte for
byte, the one `chain build` makes of the same state; a malformed line leaves nothing behind; a
killed import resumes from the ranges it had encoded; and a real anvil's dump, imported and
served by two real parties, reads back privately every balance, nonce, code and storage word
anvil holds at that block, through the keyword clients and through the wallet's endpoint (and
the follower carries it on from there)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import web3

from cluster.chain_import import encode_ranges, import_dump
from cluster.cli import main
from cluster.parties import HttpParties
from morphogen.chain import dumps
from morphogen.chain.export import BlockRef, ExportHeader, state_records, write_export
from morphogen.chain.follow import Follower
from morphogen.chain.rpc import EthRpc, quantity
from morphogen.chain.tables import build_chain_tables
from morphogen.client import PirClient
from morphogen.client.admin import AdminClient
from morphogen.keyword.descriptor import Anchor
from morphogen.keyword.owner import OwnerTable, create_owner_dir
from morphogen.keyword.records import RecordError
from morphogen.keyword.signing import load_signing_key
from morphogen.wallet import Endpoint, PrivateState, RpcServer
from tests.chain_node import DEV_ACCOUNTS, running_anvil
from tests.integration.conftest import delete_apps, deploy
from tests.integration.test_chain_follow import (
    INIT,
    RUNTIME,
    TOKEN,
    Reader,
    _catch_up,
    _mine,
    _receipt,
    _send,
    _touched,
)
from tests.integration.test_wallet_rpc import _same_as_node
from tests.unit._chain_dump import geth_dump

pytestmark = [pytest.mark.ray]

ANCHOR = Anchor(1, 5, "0x" + "ab" * 32)


@pytest.fixture(scope="module")
def dump(serve_instance, tmp_path_factory):
    root = tmp_path_factory.mktemp("import")
    assert main(["records", "keygen", "--out", str(root / "o.key")]) == 0
    state = geth_dump(root / "d.jsonl", 400)
    return {"root": root, "path": root / "d.jsonl", "state": state,
            "key": load_signing_key(root / "o.key")}


def _files(root: Path) -> dict[str, bytes]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == "manifest.json":  # the snapshot's: says when it was written
                obj = json.loads(data)
                obj.pop("created", None)
                data = json.dumps(obj, sort_keys=True).encode()
            out[str(path.relative_to(root))] = data
    return out


def _built(dump, seed: int) -> Path:
    out = dump["root"] / f"built-{seed}"
    if not out.exists():
        export = dump["root"] / "export.jsonl"
        write_export(export, ExportHeader(1, BlockRef(5, ANCHOR.hash, "0x" + "cd" * 32,
                                                      "0x" + "11" * 32)),
                     sorted(dump["state"], key=lambda a: a.address))
        table = build_chain_tables(state_records(export), dump["key"], ANCHOR, seed=seed,
                                   created=1000, min_records=256)
        create_owner_dir(table, out)
    return out


def _import(dump, out: Path, *, seed: int | None, path: Path | None = None, workers: int = 2,
            report=lambda line: None) -> Path:
    """`import_dump` of the test's dump (or `path`), as every test here imports it."""
    return import_dump(dump["path"] if path is None else path, out, signing_key=dump["key"],
                       anchor=ANCHOR, workers=workers, seed=seed, created=1000,
                       min_records=256, range_bytes=20_000, report=report)


def test_the_import_equals_the_one_process_build(dump):
    out = dump["root"] / "imported"
    lines: list[str] = []
    _import(dump, out, seed=3, report=lines.append)
    assert _files(out) == _files(_built(dump, 3))
    assert any("records/s" in line and "left" in line for line in lines)
    assert not out.with_name("imported.work").exists()


def test_a_malformed_line_leaves_nothing_behind(dump, capsys):
    bad = dump["root"] / "bad.jsonl"
    lines = dump["path"].read_text().splitlines()
    lines.insert(250, '{"balance": "12", "nonce": 1, "address": "0x1234"}')
    bad.write_text("\n".join(lines) + "\n")
    out = dump["root"] / "refused"
    code = main(["chain", "import", "--dump", str(bad), "--signing-key",
                 str(dump["root"] / "o.key"), "--out", str(out), "--chain-id", "1",
                 "--block", "5", "--block-hash", ANCHOR.hash, "--range-mb", "0.02"])
    assert code != 0
    assert "bad.jsonl:251: address '0x1234'" in capsys.readouterr().err
    assert [p.name for p in dump["root"].iterdir() if p.name.startswith("refused")] == []


def test_an_address_in_two_ranges_is_refused_by_the_index_and_leaves_nothing(dump):
    """The key index, built by a Ray task beside the placement, finds an address that two
    ranges both hold: the import is refused with it, and nothing it wrote is left."""
    twice = dump["root"] / "twice.jsonl"
    lines = dump["path"].read_text().splitlines()
    twice.write_text("\n".join(lines + [lines[3]]) + "\n")  # ranges apart: first and last
    out = dump["root"] / "twice-out"
    with pytest.raises(RecordError, match=r"address 0x[0-9a-f]{40} twice in the dump"):
        _import(dump, out, seed=3, path=twice)
    assert [p.name for p in dump["root"].iterdir() if p.name.startswith("twice-out")] == []


def test_a_worker_never_waits_on_the_read_of_the_range_before(dump, tmp_path):
    """With one worker, the range after each is already being encoded (its directory
    appears) while the one process reads that range in: the next range goes out first."""
    work = tmp_path / "work"
    work.mkdir()
    body = dumps.info(dump["path"]).body
    count = len(dumps.line_ranges(dump["path"], body, 20_000))
    assert count >= 3
    overlapped: list[bool] = []

    def encoded(i: int, folder: str) -> None:
        if i + 1 < count and all(overlapped):  # after a miss, the rest need not wait
            following = Path(folder).with_name(f"r{i + 1:06d}")
            deadline = time.monotonic() + 20
            while not following.exists() and time.monotonic() < deadline:
                time.sleep(0.005)
            overlapped.append(following.exists())

    files, _ = encode_ranges(dump["path"], work, body, workers=1, seed=5, range_bytes=20_000,
                             report=lambda line: None, encoded=encoded)
    assert len(files) == count and overlapped and all(overlapped), overlapped


def test_a_killed_import_resumes(dump):
    out = dump["root"] / "resumed"

    class Killed(Exception):
        pass

    def die(line: str) -> None:
        raise Killed(line)

    with pytest.raises(Killed):
        _import(dump, out, seed=4, workers=1, report=die)
    work = out.with_name("resumed.work")
    done = sorted(p for p in work.glob("r*") if not p.name.endswith(".tmp"))
    assert done and not out.exists()
    lines: list[str] = []
    _import(dump, out, seed=None, report=lines.append)
    assert lines[0].startswith(f"resuming: {len(done)} of ")
    assert _files(out) == _files(_built(dump, 4))  # the seed came from the work directory


def test_an_import_killed_after_its_index_moved_in_starts_again_clean(dump, monkeypatch):
    """Killed right after the key index built apart was moved into the unfinished owner
    directory (the work directory no longer holds it): the same command again builds it
    again, and the owner directory is the one-process build's, with nothing half-written
    left beside it."""
    from morphogen.keyword import versions

    out = dump["root"] / "moved"
    real = versions._move_index

    class Killed(Exception):
        pass

    def move_then_die(src, dst):
        real(src, dst)
        raise Killed(str(dst))

    monkeypatch.setattr(versions, "_move_index", move_then_die)
    with pytest.raises(Killed):
        _import(dump, out, seed=6)
    work = out.with_name("moved.work")
    # the pages moved in before the index: neither is left in the work directory
    assert not (work / "keys").exists() and not (work / "pages.staged").exists()
    assert not out.exists()
    monkeypatch.setattr(versions, "_move_index", real)
    _import(dump, out, seed=None)
    assert _files(out) == _files(_built(dump, 6))
    assert sorted(p.name for p in dump["root"].iterdir() if p.name.startswith("moved")) == \
        ["moved"]


def test_an_import_killed_while_its_pages_are_hashed_keeps_its_ranges_not_its_pages(
        dump, monkeypatch):
    """The pages are placed in a file of the work directory that becomes the snapshot's: an
    import stopped before it moved in removes it (the size of the matrix, not needed for a
    resume) and keeps the encoded ranges; the same command again resumes from them."""
    from morphogen.snapshot import writer

    out = dump["root"] / "hashing"
    work = out.with_name("hashing.work")

    class Killed(Exception):
        pass

    def die(pages, path, hasher, meter):
        assert path == work / "pages.staged" and path.stat().st_size == pages.nbytes
        raise Killed(str(path))

    monkeypatch.setattr(writer, "_hash_in_place", die)
    with pytest.raises(Killed):
        _import(dump, out, seed=8)
    assert not (work / "pages.staged").exists() and sorted(work.glob("r*"))
    monkeypatch.undo()
    lines: list[str] = []
    _import(dump, out, seed=None, report=lines.append)
    assert lines[0].startswith("resuming: ")
    assert _files(out) == _files(_built(dump, 8))
    assert sorted(p.name for p in dump["root"].iterdir() if p.name.startswith("hashing")) == \
        ["hashing"]


def test_anvil_dump_reads_back_through_both_parties(serve_instance, dump):
    root = dump["root"]
    with running_anvil() as url, EthRpc(url) as rpc:
        rpc.call("evm_setAutomine", False)

        def mined(tx: str) -> dict:
            _mine(rpc)
            return _receipt(rpc, tx)

        contracts, slots = [], set()
        for i in range(3):  # each stores 42 in slot 1; then a slot of our own
            tx = _send(rpc, data="0x" + (INIT + RUNTIME).hex(), gas=quantity(3_000_000))
            contracts.append(bytes.fromhex(mined(tx)["contractAddress"][2:]))
            word = (i + 1) * 2**200 + i
            mined(_send(rpc, to="0x" + contracts[-1].hex(), gas=quantity(100_000),
                                data="0x" + (7 + i).to_bytes(32, "big").hex()
                        + word.to_bytes(32, "big").hex()))
        for i in range(5):
            mined(_send(rpc, to="0x" + bytes([i + 1]).hex() * 20, value=hex(10**15 + i)))
        number = rpc.block_number()
        (root / "anvil.json").write_text(json.dumps(rpc.call("anvil_dumpState")))
        assert main(["chain", "import", "--format", "anvil", "--dump", str(root / "anvil.json"),
                     "--rpc", url, "--signing-key", str(root / "o.key"),
                     "--out", str(root / "anvil-owner"), "--min-records", "1024",
                     "--log", str(root / "import.log")]) == 0
        assert "records/s" in (root / "import.log").read_text()
        owner = OwnerTable(root / "anvil-owner")
        state = json.loads(subprocess.run(
            ["gzip", "-dc"], input=bytes.fromhex(json.loads((root / "anvil.json").read_text())[2:]),
            capture_output=True, check=True).stdout)
        accounts = {bytes.fromhex(a[2:]) for a in state["accounts"]}
        for a, acct in state["accounts"].items():
            slots |= {(bytes.fromhex(a[2:]), int(s, 16).to_bytes(32, "big"))
                      for s in acct.get("storage", {})}
        assert {bytes.fromhex(DEV_ACCOUNTS[0][2:].lower())} <= accounts
        assert {(c, (7 + i).to_bytes(32, "big")) for i, c in enumerate(contracts)} <= slots
        # and some the state lacks: they read as nothing, as the node says
        accounts |= {b"\x77" * 20}
        slots |= {(contracts[0], (99).to_bytes(32, "big"))}
        (root / "token").write_text(TOKEN)
        (root / "rot").mkdir()
        urls = []
        for name in ("cia", "cib"):
            deploy(serve_instance, name, snapshot=str(owner.snapshot_dir(1)), num_shards=1,
                   admin_token_file=str(root / "token"), epoch_log_dir=str(root / f"log-{name}"),
                   admin_snapshot_dir=str(root / "rot"))
            urls.append(serve_instance.app_url(name))
        reader = Reader(urls, root / "o.pub")
        try:
            reader.check(rpc, rpc.block(number), accounts, slots)
            _endpoint_answers_as_the_node(urls, root / "o.pub", rpc, rpc.block(number),
                                          accounts, slots)
            # the follower carries the imported tables on from the dump's block
            follower = Follower(rpc, owner, HttpParties([AdminClient(u, TOKEN) for u in urls],
                                                        30.0, None),
                                load_signing_key(root / "o.key"), snapshot_dir=str(root / "rot"))
            _send(rpc, to="0x" + "42" * 20, value="0x99")
            _send(rpc, to="0x" + contracts[1].hex(), gas=quantity(100_000),
                  data="0x" + (7).to_bytes(32, "big").hex() + (5).to_bytes(32, "big").hex())
            block = _mine(rpc)
            _catch_up(follower)
            changed, changed_slots = _touched(follower)
            assert b"\x42" * 20 in changed
            assert (contracts[1], (7).to_bytes(32, "big")) in changed_slots
            reader.check(rpc, block, changed | accounts, changed_slots | slots)
        finally:
            reader.close()
            delete_apps("cia", "cib")



def _endpoint_answers_as_the_node(urls: list[str], pub: Path, rpc: EthRpc, block: dict,
                                  accounts: set[bytes], slots: set[tuple[bytes, bytes]]) -> None:
    """The wallet's endpoint, as `morphogen rpc` serves it (private, verified reads through the
    parties at `urls`, JSON-RPC over HTTP on loopback), asked through web3.py and raw batches
    (`test_wallet_rpc._same_as_node`): every balance, nonce, code and storage word of
    `accounts` and `slots` as the node answers at `block`."""
    pir = PirClient(*urls)
    server = RpcServer(Endpoint(PrivateState(pir, pub)), "127.0.0.1", 0)
    server.start()
    try:
        wallet = {"rpc": rpc, "server": server,
                  "w3": web3.Web3(web3.Web3.HTTPProvider(server.url))}
        _same_as_node(wallet, block, ["0x" + a.hex() for a in sorted(accounts)],
                      [("0x" + a.hex(), int.from_bytes(s, "big")) for a, s in sorted(slots)])
    finally:
        server.shutdown()
        server.server_close()
        pir.close()
