"""Following a real chain (anvil) into two real parties (local Ray Serve, over HTTP): after
every block, every account and slot it changed, the transactions' and the block's own, reads
back privately through both parties exactly as the node answers at that block; reorgs; the
follower SIGKILLed between its steps and restarted; a second writer refused."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cluster.parties import HttpParties
from morphogen.chain.follow import CRASH_ENV, Follower
from morphogen.chain.rpc import EthRpc, quantity
from morphogen.chain.state import (
    EMPTY_CODE_HASH,
    code_chunks,
    code_key,
    code_length,
    decode_account,
    decode_storage_value,
    join_code,
    keccak256,
)
from morphogen.client import PirClient
from morphogen.client.admin import AdminClient
from morphogen.keyword import KeywordClient
from morphogen.keyword.owner import OwnerTable, WriterBusy, writer_lock
from morphogen.keyword.signing import load_signing_key
from tests.chain_node import DEV_ACCOUNTS, running_anvil
from tests.integration.conftest import (
    chain_follower,
    chain_owner,
    delete_apps,
    following_parties,
    wait_until,
)

pytestmark = [pytest.mark.ray]

TOKEN = "chain-admin-token-0123456789"
ROOT = Path(__file__).resolve().parents[2]

# A contract: with calldata (slot, word) it stores the word; without, it self-destructs to
# the caller (EIP-6780: only its balance moves, unless created in the same transaction).
# Its runtime is padded past one code chunk (1020 bytes), so its code takes three records.
RUNTIME = bytes.fromhex("36600757" "33ff00" "5b" "602035" "600035" "55" "00") + bytes(2100)
# init: SSTORE(1, 42), then return the runtime
INIT = (bytes.fromhex("602a600155") + b"\x61" + len(RUNTIME).to_bytes(2, "big")
        + bytes.fromhex("80" "6011" "6000" "39" "6000" "f3"))
assert len(INIT) == 0x11
DESTRUCT_AT_BIRTH = bytes.fromhex("33ff")  # init code that self-destructs at once


def _send(rpc: EthRpc, **tx) -> str:
    tx.setdefault("from", DEV_ACCOUNTS[0])
    return rpc.call("eth_sendTransaction", {k: v for k, v in tx.items()})


def _mine(rpc: EthRpc) -> dict:
    rpc.call("evm_mine")
    return rpc.block("latest")


def _receipt(rpc: EthRpc, tx: str) -> dict:
    got = rpc.call("eth_getTransactionReceipt", tx)
    assert got is not None and got["status"] == "0x1", got
    return got


class Reader:
    """Private, verified reads through both parties, compared with the node at a block."""

    def __init__(self, urls: list[str], pub: Path) -> None:
        self.pir = PirClient(*urls)
        self.kc = {t: KeywordClient(self.pir, pub, table=t) for t in ("accounts", "storage",
                                                                        "code")}

    def close(self) -> None:
        self.pir.close()

    def check(self, rpc: EthRpc, block: dict, accounts: set[bytes],
              slots: set[tuple[bytes, bytes]]) -> None:
        number, at = int(block["number"], 16), {"blockHash": block["hash"]}
        for t in self.kc.values():
            anchor = t.descriptor(refresh=True).anchor
            assert (anchor.number, anchor.hash) == (number, block["hash"])
        addresses = sorted(accounts)
        got = self.kc["accounts"].get_many(addresses)
        for address, value in zip(addresses, got, strict=True):
            shown = "0x" + address.hex()
            balance = int(rpc.call("eth_getBalance", shown, at), 16)
            nonce = int(rpc.call("eth_getTransactionCount", shown, at), 16)
            code = bytes.fromhex(rpc.call("eth_getCode", shown, at)[2:])
            if not (balance or nonce or code):
                assert value is None, shown
                continue
            assert value is not None, shown
            account = decode_account(value)
            assert (account.balance, account.nonce) == (balance, nonce), shown
            assert account.code_hash == (keccak256(code) if code else EMPTY_CODE_HASH)
            if code:
                first = self.kc["code"].get(code_key(account.code_hash, 0))
                n = code_chunks(code_length(first))
                rest = self.kc["code"].get_many([code_key(account.code_hash, i)
                                                 for i in range(1, n)])
                assert join_code(account.code_hash, [first, *rest]) == code
        keys = sorted(slots)
        words = self.kc["storage"].get_many([a + s for a, s in keys])
        for (address, slot), value in zip(keys, words, strict=True):
            node = int(rpc.call("eth_getStorageAt", "0x" + address.hex(), "0x" + slot.hex(),
                                at), 16)
            assert decode_storage_value(value) == node, ("0x" + address.hex(), slot.hex())


@pytest.fixture(scope="module")
def chain(serve_instance, tmp_path_factory):
    root = tmp_path_factory.mktemp("chain")
    with running_anvil() as url, EthRpc(url) as rpc:
        rpc.call("evm_setAutomine", False)
        owner = chain_owner(url, root)
        urls = following_parties(serve_instance, owner, root, TOKEN, {"cfa": 2, "cfb": 1})
        yield {"url": url, "rpc": rpc, "root": root, "urls": urls, "owner": owner,
               "key": load_signing_key(root / "o.key"), "pub": root / "o.pub"}
        delete_apps("cfa", "cfb")


def _follower(chain, **kw) -> Follower:
    return chain_follower(chain["rpc"], chain["root"], chain["urls"], TOKEN, **kw)


def _catch_up(follower: Follower) -> None:
    """Step until nothing is left, then wait for party B's lane: the last block reaches B
    after `step` returned (a party taken away before that would miss it)."""
    for _ in range(50):
        if not follower.step():
            follower.wait_published()
            return
    raise AssertionError("the follower did not catch up")


def _deploy_filler(rpc: EthRpc, follower: Follower) -> str:
    """The slot-filling contract deployed in a block of its own, the follower caught up on
    both sides of it; returns its address."""
    _catch_up(follower)
    tx = _send(rpc, data="0x" + (FILL_INIT + FILL_RUNTIME).hex(), gas=quantity(500_000))
    _mine(rpc)
    filler = _receipt(rpc, tx)["contractAddress"]
    _catch_up(follower)
    return filler


def _touched(follower: Follower) -> tuple[set[bytes], set[tuple[bytes, bytes]]]:
    t = follower._touched_of(follower._journal()[-1])
    assert t is not None
    return t.accounts, t.slots


def test_every_key_a_block_changes_reads_back_as_the_node_answers(chain) -> None:
    rpc = chain["rpc"]
    follower = _follower(chain)
    reader = Reader(chain["urls"], chain["pub"])
    fresh = [bytes([0x10 + i]) * 20 for i in range(3)]
    try:
        # transfers: to new accounts and to an existing one
        _send(rpc, to="0x" + fresh[0].hex(), value=hex(10**18))
        _send(rpc, to=DEV_ACCOUNTS[3], value="0x7", **{"from": DEV_ACCOUNTS[1]})
        block = _mine(rpc)
        _catch_up(follower)
        accounts, slots = _touched(follower)
        assert fresh[0] in accounts and bytes.fromhex(DEV_ACCOUNTS[3][2:]) in accounts
        reader.check(rpc, block, accounts | set(fresh), slots)
        # the follower holds its table in mapped files (pages and keys), whole at its version
        working = json.loads((follower.owner.root / "working" / "working.json").read_text())
        assert (working["version"], working["clean"]) == (follower.owner.current, True)
        assert (follower.owner.root / "working" / "keys" / "slots.bin").is_file()

        # a deployment (code over one chunk, a constructor's store) and one that
        # self-destructs in its creating transaction, with value
        deploy_tx = _send(rpc, data="0x" + (INIT + RUNTIME).hex(), gas=quantity(3_000_000),
                          value="0x99")
        _send(rpc, data="0x" + DESTRUCT_AT_BIRTH.hex(), gas=quantity(200_000), value="0x5",
              **{"from": DEV_ACCOUNTS[2]})
        block = _mine(rpc)
        contract = bytes.fromhex(_receipt(rpc, deploy_tx)["contractAddress"][2:])
        _catch_up(follower)
        accounts, slots = _touched(follower)
        assert contract in accounts and (contract, (1).to_bytes(32, "big")) in slots
        reader.check(rpc, block, accounts, slots)

        # storage writes, then a write of zero and a self-destruct later (balance only);
        # and an account emptied to zero balance (its nonce keeps it)
        def store(slot: int, word: int, **kw) -> str:
            return _send(rpc, to="0x" + contract.hex(), gas=quantity(100_000),
                         data="0x" + slot.to_bytes(32, "big").hex()
                         + word.to_bytes(32, "big").hex(), **kw)

        store(5, 7)
        store(6, 2**255 + 3)
        block = _mine(rpc)
        _catch_up(follower)
        accounts, slots = _touched(follower)
        assert {(contract, s.to_bytes(32, "big")) for s in (5, 6)} <= slots
        assert reader.kc["storage"].get(contract + (5).to_bytes(32, "big")) == \
            (7).to_bytes(32, "big")
        reader.check(rpc, block, accounts, slots)
        store(5, 0)
        _send(rpc, to="0x" + contract.hex(), gas=quantity(100_000), data="0x")
        price = 2 * int(rpc.block("latest")["baseFeePerGas"], 16)
        _send(rpc, to="0x" + fresh[1].hex(), value=hex(10**18))
        block = _mine(rpc)
        _catch_up(follower)
        reader.check(rpc, block, *_touched(follower))
        balance = int(rpc.call("eth_getBalance", "0x" + fresh[1].hex(), "latest"), 16)
        rpc.call("anvil_impersonateAccount", "0x" + fresh[1].hex())
        _send(rpc, to=DEV_ACCOUNTS[4], value=hex(balance - 21000 * price), gas="0x5208",
              maxFeePerGas=hex(price), maxPriorityFeePerGas=hex(price),
              **{"from": "0x" + fresh[1].hex()})
        block = _mine(rpc)
        _catch_up(follower)
        assert int(rpc.call("eth_getBalance", "0x" + fresh[1].hex(), "latest"), 16) == 0
        accounts, slots = _touched(follower)
        reader.check(rpc, block, accounts | {contract}, slots | {
            (contract, s.to_bytes(32, "big")) for s in (1, 5, 6)})
        assert reader.kc["storage"].get(contract + (5).to_bytes(32, "big")) is None  # zeroed
        code = bytes.fromhex(rpc.call("eth_getCode", "0x" + contract.hex(), "latest")[2:])
        assert code == RUNTIME  # a self-destruct after its creation leaves the code
        # a block with no transaction still moves every table to it
        block = _mine(rpc)
        _catch_up(follower)
        reader.check(rpc, block, {contract}, {(contract, (6).to_bytes(32, "big"))})
    finally:
        reader.close()


def test_a_reorg_leaves_nothing_of_the_orphaned_blocks(chain) -> None:
    rpc = chain["rpc"]
    follower = _follower(chain)
    reader = Reader(chain["urls"], chain["pub"])
    lost = [bytes([0x40 + i]) * 20 for i in range(2)]
    try:
        _catch_up(follower)
        for target in lost:
            _send(rpc, to="0x" + target.hex(), value="0x1234")
            _mine(rpc)
        _catch_up(follower)
        before = follower.progress.reorgs
        kept = bytes([0x50]) * 20
        # the last two blocks replaced by one transfer elsewhere
        rpc.call("anvil_reorg", 2, [[{"from": DEV_ACCOUNTS[5], "to": "0x" + kept.hex(),
                                      "value": "0x77"}, 0]])
        block = rpc.block("latest")
        _catch_up(follower)
        assert follower.progress.reorgs == before + 1
        assert follower.tip() == (int(block["number"], 16), block["hash"])
        reader.check(rpc, block, set(lost) | {kept, bytes.fromhex(DEV_ACCOUNTS[0][2:])},
                     set())
        assert reader.kc["accounts"].get(lost[0]) is None
    finally:
        reader.close()


def test_reorgs_to_shorter_equal_and_longer_branches_are_followed_at_once(chain) -> None:
    """Each kind of reorg is followed by the very next step: a shorter branch
    (`anvil_rollback`, `evm_revert` to a snapshot: nothing newer arrives to show it), one of
    the same height and a longer one (`anvil_reorg`, then more blocks). After each, every
    table names the node's head and no key reads as an orphaned block left it."""
    rpc = chain["rpc"]
    follower = _follower(chain)
    reader = Reader(chain["urls"], chain["pub"])
    sender = bytes.fromhex(DEV_ACCOUNTS[0][2:])

    def blocks_to(targets: list[bytes]) -> None:
        for target in targets:
            _send(rpc, to="0x" + target.hex(), value="0x4321")
            _mine(rpc)
        _catch_up(follower)
        assert all(reader.kc["accounts"].get(t) is not None for t in targets)

    def followed(orphaned: list[bytes], kept: set[bytes] = frozenset()) -> dict:
        rpc.call("anvil_dropAllTransactions")  # rolled-back transactions stay out
        block = rpc.block("latest")
        before = follower.progress.reorgs
        assert follower.step()  # the reorg, at once: the tip is on the node's chain again
        assert follower.progress.reorgs == before + 1
        number, digest = follower.tip()
        assert rpc.block(number)["hash"] == digest
        _catch_up(follower)
        assert follower.tip() == (int(block["number"], 16), block["hash"])
        reader.check(rpc, block, set(orphaned) | set(kept) | {sender}, set())
        for t in orphaned:
            assert reader.kc["accounts"].get(t) is None
        return block

    try:
        _catch_up(follower)
        # shorter: two blocks rolled back, the node one block above their parent's parent
        lost = [bytes([0x80 + i]) * 20 for i in range(3)]
        blocks_to(lost)
        tip = follower.tip()[0]
        rpc.call("anvil_rollback", 2)
        assert int(rpc.block("latest")["number"], 16) == tip - 2
        followed(lost[1:], {lost[0]})
        # shorter, to the common ancestor itself: evm_revert to a snapshot
        base = follower.tip()
        snapshot = rpc.call("evm_snapshot")
        lost = [bytes([0x90 + i]) * 20 for i in range(2)]
        blocks_to(lost)
        assert rpc.call("evm_revert", snapshot) is True
        block = followed(lost)
        assert (int(block["number"], 16), block["hash"]) == base
        # the same height: the last two blocks replaced by two others
        lost = [bytes([0xA0 + i]) * 20 for i in range(2)]
        blocks_to(lost)
        kept = bytes([0xA8]) * 20
        rpc.call("anvil_reorg", 2, [[{"from": DEV_ACCOUNTS[5], "to": "0x" + kept.hex(),
                                      "value": "0x77"}, 1]])
        followed(lost, {kept})
        assert reader.kc["accounts"].get(kept) is not None
        # longer: one block replaced, then two more on the new branch
        lost = [bytes([0xB0]) * 20]
        blocks_to(lost)
        rpc.call("anvil_reorg", 1, [])
        _mine(rpc)
        _mine(rpc)
        followed(lost)
    finally:
        reader.close()


def _follow_cli(chain, *extra: str, crash: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, MORPHOGEN_ADMIN_TOKEN=TOKEN, PYTHONPATH=str(ROOT))
    env.pop(CRASH_ENV, None)
    if crash:
        env[CRASH_ENV] = crash
    return subprocess.run(
        [sys.executable, "-m", "cluster.cli", "chain", "follow", "--rpc", chain["url"],
         "--owner", str(chain["root"] / "owner"), "--signing-key", str(chain["root"] / "o.key"),
         "--server-a", chain["urls"][0], "--server-b", chain["urls"][1],
         "--snapshot-dir", str(chain["root"] / "rot"), "--poll", "0.1", *extra],
        env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_the_follower_killed_between_any_two_steps_resumes_without_a_gap(chain) -> None:
    rpc = chain["rpc"]
    rng = random.Random(3)
    reader = Reader(chain["urls"], chain["pub"])
    steps = ["traced", "read", "applied", "sent-a", "published"]
    try:
        _catch_up(_follower(chain))
        start = _follower(chain).tip()[0]
        for i, step in enumerate(steps + [rng.choice(steps) for _ in range(2)]):
            _send(rpc, to="0x" + bytes([0x60 + i]).hex() * 20, value=hex(1000 + i))
            block = _mine(rpc)
            number = int(block["number"], 16)
            died = _follow_cli(chain, "--until-block", str(number), crash=step)
            assert died.returncode == -9, (step, died.stdout, died.stderr)
            done = _follow_cli(chain, "--until-block", str(number))
            assert done.returncode == 0, (step, done.stdout, done.stderr)
            reader.check(rpc, block, {bytes([0x60 + i]) * 20}, set())
        owner = OwnerTable(chain["root"] / "owner")
        # one version a block: no block applied twice, none skipped
        numbers = [int(b["number"]) for b in owner.state["chain"]["blocks"]]
        assert numbers == sorted(set(numbers)) and numbers[-1] - numbers[0] + 1 == len(numbers)
        assert numbers[-1] == start + len(steps) + 2
        heads = [AdminClient(u, TOKEN).head() for u in chain["urls"]]
        assert heads[0][0] == heads[1][0]  # both parties on one identity
    finally:
        reader.close()


def test_a_second_writer_is_refused_while_the_first_holds_the_owner(chain) -> None:
    lock = writer_lock(chain["root"] / "owner")
    try:
        with pytest.raises(WriterBusy, match="one writer per owner directory"):
            writer_lock(chain["root"] / "owner")
        busy = _follow_cli(chain, "--blocks", "1")
        assert busy.returncode == 1 and "one writer per owner directory" in busy.stderr
        assert len(busy.stderr.strip().splitlines()) == 1
    finally:
        lock.release()


# stores word i + 1 in slots start .. start + n - 1 (calldata: start, n)
FILL_RUNTIME = bytes.fromhex("60003560203581015b808210156" "01e57816001018255" "9060010190600856"
                             "5b00")
FILL_INIT = (b"\x61" + len(FILL_RUNTIME).to_bytes(2, "big")
             + bytes.fromhex("80" "600c" "6000" "39" "6000" "f3"))


def test_a_block_of_tens_of_thousands_of_records_is_one_publication(chain) -> None:
    """20,000 new slots in one block: the storage table grows first (a version of its own,
    the same block), then the block is one rotation; both parties serve it whole."""
    rpc = chain["rpc"]
    follower = _follower(chain)
    reader = Reader(chain["urls"], chain["pub"])
    try:
        filler = _deploy_filler(rpc, follower)
        rpc.call("evm_setBlockGasLimit", quantity(2_000_000_000))
        n = 10_000
        for start in (1_000, 1_000 + n):
            _send(rpc, to=filler, gas=quantity(300_000_000),
                  data="0x" + start.to_bytes(32, "big").hex() + n.to_bytes(32, "big").hex())
        block = _mine(rpc)
        assert len(block["transactions"]) == 2
        parties = [AdminClient(u, TOKEN) for u in chain["urls"]]
        _catch_up(follower)
        accounts, slots = _touched(follower)
        address = bytes.fromhex(filler[2:])
        assert len([s for a, s in slots if a == address]) == 2 * n
        # one publication for the growth, one for the block, on each party
        owner = follower.owner
        owner.reload()
        wanted = [owner.publication_id(v) for v in (owner.current - 1, owner.current)]
        assert [c.head()[1][-2:] for c in parties] == [wanted, wanted]
        assert parties[0].head()[0] == parties[1].head()[0]
        sample = set(random.Random(4).sample(sorted(slots), 150))
        reader.check(rpc, block, accounts, sample)
    finally:
        reader.close()


def test_a_block_larger_than_a_request_is_published_in_parts(chain) -> None:
    """Parties taken at 16 updates a request: a block of 300 new slots goes to each party in
    parts of one publication, served whole after the last (no rotation: it changed a small
    share of the table), and reads back as the node answers."""
    import httpx

    from morphogen.protocol.codec import PART_HEADER

    parts_seen: list[str] = []

    class Counting(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            if PART_HEADER in request.headers:
                parts_seen.append(request.headers[PART_HEADER])
            return super().handle_request(request)

    rpc = chain["rpc"]
    # whole pages, so that the cap is the request's (a party takes a block's diffs as their
    # changed bytes in one request: tests/unit/test_sparse.py)
    clients = [AdminClient(u, TOKEN, transport=Counting(), sparse=False) for u in chain["urls"]]
    follower = Follower(rpc, OwnerTable(chain["root"] / "owner"), HttpParties(clients, 30.0, 16),
                        chain["key"], snapshot_dir=str(chain["root"] / "rot"))
    reader = Reader(chain["urls"], chain["pub"])
    try:
        filler = _deploy_filler(rpc, follower)
        parts_seen.clear()
        _send(rpc, to=filler, gas=quantity(20_000_000),
              data="0x" + (50_000).to_bytes(32, "big").hex() + (300).to_bytes(32, "big").hex())
        block = _mine(rpc)
        _catch_up(follower)
        owner = follower.owner
        owner.reload()
        batch = owner.store.batch(owner.current)
        parts = -(-len(batch) // 16)
        assert len(batch) > 16 and parts > 1
        # every part of the block's publication, to each party (the last one once at least)
        assert parts_seen.count(f"{parts}/{parts}") >= 2
        assert {f"{i}/{parts}" for i in range(1, parts + 1)} <= set(parts_seen)
        pub = owner.publication_id(owner.current)
        assert [c.head()[1][-1] for c in clients] == [pub, pub]
        accounts, slots = _touched(follower)
        address = bytes.fromhex(filler[2:])
        assert len([s for a, s in slots if a == address]) == 300
        reader.check(rpc, block, accounts, set(random.Random(7).sample(sorted(slots), 60)))
        left = [p for d in ("log-cfa", "log-cfb") for p in (chain["root"] / d).iterdir()
                if p.name.startswith("part-")]
        assert left == []
    finally:
        follower.close()
        reader.close()


def test_a_party_restarted_mid_follow_catches_up(chain, serve_instance) -> None:
    """Party B goes away while blocks come: the block is applied but cannot be published
    (the parties' heads are read before either is sent anything, so A does not run ahead
    alone); once B is back, from its own epoch log, the same publications reach both in
    order. (A follower killed between A and B is the crash test's `sent-a`.)"""
    from ray import serve

    rpc = chain["rpc"]
    follower = _follower(chain)
    reader = Reader(chain["urls"], chain["pub"])
    try:
        _catch_up(follower)
        serve.delete("cfb")
        # gone from the ingress too: until its route is dropped a request may still reach
        # the draining replica
        assert wait_until(lambda: httpx.get(f"{chain['urls'][1]}/epoch").status_code == 404, 30)
        target = bytes([0x70]) * 20
        _send(rpc, to="0x" + target.hex(), value="0x4242")
        block = _mine(rpc)
        follower.parties.retry_for_s = 1.0
        with pytest.raises(Exception, match="404|did not take the publication"):
            _catch_up(follower)
        owner = follower.owner
        assert owner.published < owner.current  # applied, not yet on the parties
        following_parties(serve_instance, owner, chain["root"], TOKEN, {"cfb": 1})
        follower.parties.retry_for_s = 60.0
        _catch_up(follower)
        assert owner.published == owner.current
        reader.check(rpc, block, {target}, set())
        heads = [AdminClient(u, TOKEN).head() for u in chain["urls"]]
        assert heads[0][0] == heads[1][0]
    finally:
        reader.close()
