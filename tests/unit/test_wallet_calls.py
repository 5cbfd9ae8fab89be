"""eth_call's pieces without an EVM: the call object's params, the buckets, a run's reads
(answered from what is known, the rest noted), the group commit that merges calls' rounds, a
round's shape and version pinning, and the loopback routes. The EVM over real parties is
tests/integration's."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from morphogen.chain.state import (
    EMPTY_CODE_HASH,
    Account,
    account_record,
    code_records,
    keccak256,
    storage_key,
)
from morphogen.keyword.descriptor import Anchor
from morphogen.wallet.call_params import CALL_GAS, call_param
from morphogen.wallet.commit import GroupCommit
from morphogen.wallet.costs import MAX_ROUNDS, round_bucket
from morphogen.wallet.loopback import CallReads, CallRoutes
from morphogen.wallet.methods import InvalidParams, NotServed
from morphogen.wallet.state import (
    CODE_READ_CHUNKS,
    CallCache,
    PrivateState,
    bucket,
    code_bucket,
)
from morphogen.wallet.versions import Served

HEAD = Served(1, 9, "0x" + "ab" * 32, 4, 0)
TOKEN = bytes.fromhex("22" * 20)
TOKEN2 = bytes.fromhex("23" * 20)
CODE = bytes.fromhex("6000")


class KnownState:
    def __init__(self, codes: dict[bytes, bytes]) -> None:
        self.codes = codes

    def known_code(self, code_hash):
        return b"" if code_hash == EMPTY_CODE_HASH else self.codes.get(code_hash)


def test_buckets():
    assert [bucket(n) for n in (0, 1, 4, 5, 8, 9, 1024, 1025)] == [4, 4, 4, 8, 8, 16, 1024, 2048]
    assert [code_bucket(n) for n in (0, 1, 2, 3, 5)] == [1, 1, 2, 4, 8]
    assert [round_bucket(n) for n in (0, 1, 2, 3, 5, MAX_ROUNDS)] == [0, 1, 2, 4, 8, MAX_ROUNDS]
    with pytest.raises(NotServed, match="more than"):
        round_bucket(MAX_ROUNDS + 1)


def test_call_params():
    c = call_param({"to": "0x" + "22" * 20, "data": "0xabcd", "value": "0x10"})
    assert (c.sender, c.data, c.value, c.gas) == ("0x" + "00" * 20, b"\xab\xcd", 16, CALL_GAS)
    assert call_param({"to": "0x" + "22" * 20, "input": "0x01", "gas": "0x5208"}).gas == 21000
    assert call_param({"to": "0x" + "22" * 20, "value": hex(2**256 - 1)}).value == 2**256 - 1
    listed = call_param({"to": "0x" + "22" * 20, "accessList": [
        {"address": "0x" + "33" * 20, "storageKeys": ["0x" + "00" * 31 + "01", "0x02"]}]})
    assert listed.access_list == (("0x" + "33" * 20, (1, 2)),)
    with pytest.raises(NotServed, match="7702"):
        call_param({"to": "0x" + "22" * 20, "authorizationList": []})
    with pytest.raises(NotServed, match="without `to`"):
        call_param({"data": "0x00"})
    with pytest.raises(NotServed, match="pays for gas"):
        call_param({"to": "0x" + "22" * 20, "gasPrice": "0x1"})
    for bad in ("x", {"to": "0x12"}, {"to": "0x" + "22" * 20, "data": "0x1"},
                {"to": "0x" + "22" * 20, "value": "12"}, {"to": "0x" + "22" * 20, "bogus": 1},
                {"to": "0x" + "22" * 20, "value": hex(2**256)},
                {"to": "0x" + "22" * 20, "gas": hex(2**64)},
                {"to": "0x" + "22" * 20, "accessList": [{"address": "0x12"}]},
                {"to": "0x" + "22" * 20, "accessList": [{"address": "0x" + "33" * 20,
                                                        "storageKeys": ["0x" + "1" * 65]}]},
                {"to": "0x" + "22" * 20, "accessList": {"a": 1}}):
        with pytest.raises(InvalidParams):
            call_param(bad)


def _ask(reads, method, *params):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)})
    return json.loads(reads.handle(body.encode()))


def test_a_run_is_answered_from_what_is_known_and_notes_the_rest():
    cache = CallCache()
    t, other, gone = "0x" + TOKEN.hex(), "0x" + "33" * 20, "0x" + "44" * 20
    slot = "0x" + "00" * 31 + "05"
    reads = CallReads(KnownState({}), HEAD, cache)
    # nothing known: placeholders (no account, no code, zero), each noted once
    for _ in range(2):
        assert _ask(reads, "eth_getBalance", t, "0x9")["result"] == "0x0"
        assert _ask(reads, "eth_getCode", t, "0x9")["result"] == "0x"
        assert _ask(reads, "eth_getStorageAt", t, "0x5", "0x9")["result"] == "0x" + "00" * 32
    assert reads.want.accounts == {TOKEN} and reads.want.code == set()
    assert reads.want.words == {(TOKEN, bytes.fromhex(slot[2:]))}
    # the account known, its code not: the code hash is what is wanted
    cache.accounts[TOKEN] = Account(1, 5, keccak256(CODE))
    cache.accounts[bytes.fromhex(gone[2:])] = None
    reads = CallReads(KnownState({}), HEAD, cache)
    assert _ask(reads, "eth_getBalance", t, "0x9")["result"] == "0x5"
    assert _ask(reads, "eth_getTransactionCount", t, "0x9")["result"] == "0x1"
    assert _ask(reads, "eth_getCode", t, "0x9")["result"] == "0x"
    assert _ask(reads, "eth_getStorageAt", gone, "0x5", "0x9")["result"] == "0x" + "00" * 32
    assert reads.want.code == {keccak256(CODE)} and not reads.want.accounts | reads.want.words
    # all known: nothing wanted, the run is the answer
    cache.words[(TOKEN, bytes.fromhex(slot[2:]))] = 7
    reads = CallReads(KnownState({keccak256(CODE): CODE}), HEAD, cache)
    assert _ask(reads, "eth_getCode", t, "0x9")["result"] == "0x6000"
    assert _ask(reads, "eth_getStorageAt", t, "0x5", "0x9")["result"] == "0x" + "00" * 31 + "07"
    assert _ask(reads, "eth_getCode", other, "0x9")["result"] == "0x"  # unknown: noted
    assert not reads.want.code and reads.want.accounts == {bytes.fromhex("33" * 20)}
    assert reads.failure is None
    # a read at another block than the call's, or another method, fails the run
    for method, params in (("eth_getBalance", (t, "0x8")), ("eth_sendTransaction", ({},))):
        bad = CallReads(KnownState({}), HEAD, cache)
        assert "error" in _ask(bad, method, *params)
        assert bad.failure is not None


def test_a_run_is_given_the_accounts_known_with_their_code_and_counts_them_read():
    cache = CallCache()
    gone, other, unseen = bytes.fromhex("44" * 20), bytes.fromhex("33" * 20), bytes(20)
    cache.accounts[TOKEN] = Account(1, 5, keccak256(CODE))
    cache.accounts[gone] = None
    cache.accounts[other] = Account(0, 2, keccak256(b"\x00"))  # its code not read yet
    reads = CallReads(KnownState({keccak256(CODE): CODE}), HEAD, cache)
    got = reads.preloaded({TOKEN, gone, other, unseen})
    # what the loopback would answer for each, as the fork's cache wants it; an account
    # whose code is not known, or not read at all, is left for the run to ask
    assert got == [("0x" + TOKEN.hex(), 5, 1, keccak256(CODE), CODE),
                   ("0x" + gone.hex(), 0, 0, EMPTY_CODE_HASH, b"")]
    assert reads.touched.accounts == {TOKEN, gone}
    assert reads.touched.code == {keccak256(CODE)} and not reads.want


def test_what_arrives_while_a_round_is_out_goes_out_together_in_the_next():
    runs: list[list[int]] = []
    first_in = threading.Event()
    release = threading.Event()

    def run(items):
        runs.append(list(items))
        if items == [0]:
            first_in.set()
            release.wait(10)
        return [i * 10 for i in items]

    commit = GroupCommit(run)
    got: dict[int, int] = {}

    def submit(i):
        got[i] = commit.submit(i)

    threads = [threading.Thread(target=submit, args=(0,))]
    threads[0].start()
    assert first_in.wait(10)
    threads += [threading.Thread(target=submit, args=(i,)) for i in (1, 2, 3)]
    for th in threads[1:]:
        th.start()
    time.sleep(0.2)  # all three queued behind the round in flight
    release.set()
    for th in threads:
        th.join(10)
    assert runs[0] == [0] and sorted(runs[1]) == [1, 2, 3] and len(runs) == 2
    assert got == {0: 0, 1: 10, 2: 20, 3: 30}


def test_a_failed_round_fails_every_call_in_it_and_the_next_round_runs():
    def run(items):
        if "bad" in items:
            raise ValueError("lying party")
        return list(items)

    commit = GroupCommit(run)
    with pytest.raises(ValueError, match="lying party"):
        commit.submit("bad")
    assert commit.submit("ok") == "ok"


@dataclass(frozen=True)
class FakeDesc:
    version: int
    anchor: Anchor
    time: int = 0
    name: str = "accounts"


class FakeTable:
    def __init__(self, records: dict[bytes, bytes], desc: FakeDesc) -> None:
        self.records, self.desc, self.asked = records, desc, []

    @property
    def last_view(self):
        """The parties' (epoch id, identity) of the data the last read came from."""
        return (self.desc.version, f"identity-of-{self.desc.version}")

    def read_at(self, keys):
        self.asked.append(len(keys))
        return [self.records.get(bytes(k)) for k in keys], self.desc

    def descriptor(self, refresh=False):
        return self.desc


def _state(tables: dict[str, FakeTable]) -> PrivateState:
    state = PrivateState.__new__(PrivateState)
    state.seen_version, state.seen_block, state.latest = 0, 0, None
    state._calls = None
    state._lock = threading.Lock()
    from collections import OrderedDict

    state.codes = OrderedDict()
    state._views, state._left = OrderedDict(), OrderedDict()
    state._new_version, state._recent, state._announced = [], OrderedDict(), 0
    state.last_asked, state.max_age = float("-inf"), None
    state.chain_id, state._chain_read = None, False
    state.epoch_reads = 0

    class Parties:
        """GET /epoch of both parties: what the tables serve now."""

        def info(self, refresh=False):
            state.epoch_reads += 1
            version = tables["accounts"].desc.version
            return SimpleNamespace(epoch_ids=(version, version),
                                   identities=(f"identity-of-{version}",) * 2)

    state.pir = Parties()
    state._epochs = GroupCommit(lambda items: [state.pir.info(refresh=True)] * len(items))

    @contextmanager
    def clients():
        yield tables

    state.clients = clients
    return state


def test_a_round_is_padded_pinned_to_one_version_and_kept_for_the_version_it_read():
    at = Anchor(1, 9, "0x" + "ab" * 32)
    desc = FakeDesc(4, at)
    code_hash = keccak256(CODE)
    others = [bytes([0x60, i]) for i in range(1, 4)]  # PUSH1 i: three more codes
    records = dict([account_record(TOKEN, Account(1, 5, code_hash)), *code_records(CODE),
                    *(r for c in others for r in code_records(c))])
    word = (TOKEN, bytes(31) + b"\x05")
    records[storage_key(*word)] = (7).to_bytes(32, "big")
    tables = {t: FakeTable(records, desc) for t in ("accounts", "storage", "code")}
    state = _state(tables)
    cache = CallCache()
    assert state.read_round(HEAD, cache, [TOKEN, bytes(20)], [code_hash], [word]) == HEAD
    assert cache.accounts == {TOKEN: Account(1, 5, code_hash), bytes(20): None}
    assert cache.words == {word: 7} and state.known_code(code_hash) == CODE
    assert [t.asked for t in tables.values()] == [[4], [4], [CODE_READ_CHUNKS]]
    assert state.latest == HEAD
    # a padding round: accounts and storage; code known is not asked again, nor kept
    assert state.read_round(HEAD, CallCache(), [], [code_hash], []) == HEAD
    assert [len(t.asked) for t in tables.values()] == [2, 2, 1]
    assert [t.asked[-1] for t in tables.values()] == [4, 4, CODE_READ_CHUNKS]
    # five accounts and three code hashes: the next buckets
    assert state.read_round(HEAD, CallCache(), [bytes([i]) * 20 for i in range(5)],
                            [keccak256(c) for c in others], []) == HEAD
    assert [t.asked[-1] for t in tables.values()] == [8, 4, 4 * CODE_READ_CHUNKS]
    # the tables answered from two versions (a publication mid-round): nothing kept
    newer = FakeDesc(5, Anchor(1, 10, "0x" + "cd" * 32))
    tables["storage"].desc = newer
    torn = CallCache()
    assert state.read_round(HEAD, torn, [TOKEN], [], [word]) is None
    assert torn.accounts == {} and torn.words == {}
    # all at a newer version: kept for that version, not the call's, and named
    tables["accounts"].desc = newer
    old = CallCache()
    now = state.read_round(HEAD, old, [TOKEN], [], [word])
    assert (now.number, now.version) == (10, 5) and state.latest == now
    assert old.accounts == {} and state.call_cache(now).words == {word: 7}


def test_routes():
    routes = CallRoutes()
    reads = object()
    token = routes.open(reads)
    assert routes.reads(f"/call/{token}") is reads
    assert routes.reads("/call/" + "0" * 32) is None and routes.reads("/") is None
    routes.close(token)
    assert routes.reads(f"/call/{token}") is None


class ScriptedWorkers:
    """In place of pyrevm: a "contract" that reads the token's balance word through the
    run's loopback routes and returns it, the way the fork mode asks (account, then word)."""

    def __init__(self, routes: CallRoutes) -> None:
        self.routes, self.runs = routes, 0

    def run(self, url, block, tx, estimate, timeout_s, accounts=()):
        self.runs += 1
        self.preloaded = [a[0] for a in accounts]
        reads = self.routes.reads(url[url.index("/call/"):])
        at = hex(block["number"])
        t = tx["to"]
        if t not in self.preloaded:  # as the fork's cache: a preloaded account is not asked
            _ask(reads, "eth_getBalance", t, at)
        word = _ask(reads, "eth_getStorageAt", t, "0x5", at)["result"]
        return {"ok": True, "out": bytes.fromhex(word[2:]), "reason": "", "gas": 0}


def _calls(tables):
    from morphogen.wallet.evm import PrivateCalls

    state = _state(tables)
    routes = CallRoutes()
    workers = ScriptedWorkers(routes)
    calls = PrivateCalls(state, workers, routes, lambda: "http://loopback")
    state.head = _head(state, tables)
    return state, calls, workers


def _head(state, tables):
    """PrivateState.head over the fake tables: the accounts table's descriptor now."""
    def head() -> Served:
        state.heads = getattr(state, "heads", 0) + 1
        t = tables["accounts"]
        return state._accepted(t.desc, t.last_view)
    return head


def _tables(version: int, number: int, balance: int):
    """TOKEN's word 5 holds `balance`, TOKEN2's `balance` + 100."""
    desc = FakeDesc(version, Anchor(1, number, "0x" + f"{number:02x}" * 32))
    records = dict([account_record(TOKEN, Account(1, 5, keccak256(CODE))),
                    account_record(TOKEN2, Account(1, 5, keccak256(CODE))),
                    *code_records(CODE)])
    records[storage_key(TOKEN, bytes(31) + b"\x05")] = balance.to_bytes(32, "big")
    records[storage_key(TOKEN2, bytes(31) + b"\x05")] = (balance + 100).to_bytes(32, "big")
    return {t: FakeTable(records, desc) for t in ("accounts", "storage", "code")}


def _publish(tables, new) -> None:
    """The parties now serve `new`'s records and version in place of `tables`'."""
    for t, table in new.items():
        tables[t].records, tables[t].desc = table.records, table.desc


def test_tables_of_another_chain_signed_with_the_same_key_are_refused():
    """An owner's one key signing two chains' tables: the parties serving the other chain's
    at a newer version get no answer from it, nor does a reader told another chain."""
    from morphogen.keyword import KeywordIntegrityError
    from morphogen.wallet.versions import ServedVersions

    tables = _tables(1, 10, 5)
    state = _state(tables)
    state.head = _head(state, tables)
    assert state.head().chain_id == 1 and state.accounts([TOKEN])[1].chain_id == 1
    other = _tables(2, 11, 1000)
    for t in other.values():
        t.desc = FakeDesc(2, Anchor(11155111, 11, "0x" + "0b" * 32))
    _publish(tables, other)
    for read in (state.head, lambda: state.accounts([TOKEN]),
                 lambda: state.storage([(TOKEN, 5)])):
        with pytest.raises(KeywordIntegrityError, match=(
                "the servers serve chain 11155111 .keyword table 'accounts', version 2.; "
                "this client has read chain 1: tables of another chain")):
            read()
    assert state.latest.chain_id == 1 and state.seen_version == 1
    told = ServedVersions(None, chain_id=5)
    with pytest.raises(KeywordIntegrityError, match="serve chain 1 .* was given chain 5"):
        told._accepted(FakeDesc(1, Anchor(1, 10, "0x" + "0a" * 32)))
    for bad in (0, -1, True, "1"):
        with pytest.raises(ValueError, match="chain_id is a chain's id"):
            ServedVersions(None, chain_id=bad)


def test_a_call_answers_at_the_version_served_never_the_one_it_started_at():
    tables = _tables(4, 9, 7)
    state, calls, workers = _calls(tables)
    call = [{"to": "0x" + TOKEN.hex(), "data": "0x70a08231"}, "latest"]
    assert int(calls.eth_call(call), 16) == 7
    # first call: head, run (all unknown), one round, run: the answer
    assert workers.runs == 2 and calls.rounds.rounds == 1
    # the parties publish block 10 with another balance; the endpoint has not seen it: the
    # call starts at 9, the parties' /epoch names other data, so its memo round is read, at
    # 10, which names it; it answers 10's word
    _publish(tables, _tables(5, 10, 8))
    assert state.latest.number == 9
    assert int(calls.eth_call(call), 16) == 8
    assert state.latest.number == 10
    # a run on 9's reads while /epoch was read (thrown away), one round, one run
    assert workers.runs == 4 and calls.rounds.rounds == 2
    # nothing published since: both parties' /epoch name the data 10 was read from, so the
    # run on 10's reads is the answer, with no round (nothing asked about any key)
    epochs = state.epoch_reads
    assert int(calls.eth_call(call), 16) == 8
    assert workers.runs == 5 and calls.rounds.rounds == 2 and state.epoch_reads == epochs + 1
    # past the freshness bound, /epoch alone never confirms: a round reads it again (where
    # the tables' client refuses a version older than the bound: an error, never a number)
    state.max_age = 60
    assert int(calls.eth_call(call), 16) == 8
    assert workers.runs == 6 and calls.rounds.rounds == 3
    state.max_age = None
    # a specific block that is not served is refused, not answered from another
    with pytest.raises(NotServed, match="not the block served"):
        calls.eth_call([call[0], "0x9"])


def test_once_the_parties_left_a_version_its_first_round_reads_every_call_of_the_wallet():
    tables = _tables(4, 9, 7)
    state, calls, workers = _calls(tables)
    one = [{"to": "0x" + TOKEN.hex(), "data": "0x70a08231"}, "latest"]
    two = [{"to": "0x" + TOKEN2.hex(), "data": "0x70a08231"}, "latest"]
    assert (int(calls.eth_call(one), 16), int(calls.eth_call(two), 16)) == (7, 107)
    nine = state.latest
    _publish(tables, _tables(5, 10, 8))
    # the first call learns from /epoch that the parties left 9: its round is read at 10
    # and holds what both calls read (the working set), each padded as any round
    rounds = calls.rounds.rounds
    assert int(calls.eth_call(one), 16) == 8
    assert calls.rounds.rounds == rounds + 1 and state.left(nine)
    assert [t.asked[-1] for t in (tables["accounts"], tables["storage"])] == [4, 4]
    ten = state.latest
    assert ten.number == 10 and set(state.call_cache(ten).accounts) == {TOKEN, TOKEN2}
    # the other call then takes no round: its reads are 10's, /epoch confirms 10
    epochs, runs = state.epoch_reads, workers.runs
    assert int(calls.eth_call(two), 16) == 108
    assert calls.rounds.rounds == rounds + 1 and workers.runs == runs + 1
    assert state.epoch_reads == epochs + 1
    # a round at a version left reads the working set besides what the run read, which
    # stays as it was (the memo keeps it as the call's reads)
    from morphogen.wallet.rounds import Want

    read = Want({TOKEN})
    assert calls._naming(read, nine).accounts == {TOKEN, TOKEN2}
    assert read.accounts == {TOKEN} and calls._naming(read, ten) is read
    # a version known left is refused with no read of /epoch
    assert state.confirming(nine) is None and not state.still_served(nine)
    assert state.epoch_reads == epochs + 1 and not state.left(ten)


def test_a_batchs_calls_share_a_round_though_their_threads_start_apart():
    from morphogen.wallet.rounds import Rounds, Want

    class RoundState:
        def __init__(self) -> None:
            self.rounds: list[set[bytes]] = []

        def read_round(self, served, cache, accounts, code, words):
            self.rounds.append(set(accounts))
            return served

    def batch(announce: bool) -> list[set[bytes]]:
        state = RoundState()
        rounds = Rounds(state, gather_s=2.0)
        cache = CallCache()

        def call(i: int) -> None:
            time.sleep(0.05 * i)  # threads that start apart
            with rounds.coming() as coming:
                rounds.fetch(HEAD, cache, Want({bytes([i]) * 20}), coming)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
        if announce:
            with rounds.expecting(3):
                for th in threads:
                    th.start()
                for th in threads:
                    th.join(10)
        else:
            for th in threads:
                th.start()
            for th in threads:
                th.join(10)
        return state.rounds

    assert batch(True) == [{bytes([i]) * 20 for i in range(3)}]
    assert len(batch(False)) == 3  # each went alone: nobody was coming yet


def test_a_round_held_to_a_version_otherwise_reads_only_what_the_rounds_before_did_not():
    from morphogen.wallet.rounds import Rounds, Want

    class RoundState:
        def __init__(self) -> None:
            self.rounds: list[set[bytes]] = []

        def known_code(self, code_hash):
            return None

        def read_round(self, served, cache, accounts, code, words):
            self.rounds.append(set(accounts))
            for a in accounts:
                cache.accounts[a] = None
            return served

    state = RoundState()
    rounds, cache = Rounds(state), CallCache()
    a, b = bytes([1]) * 20, bytes([2]) * 20
    assert rounds.fetch(HEAD, cache, Want({a})) == (HEAD, True)  # names the version: read
    # a call whose version /epoch confirms: what an earlier round read is not read again,
    # and the answer says no round was read (the caller's confirmation is not the round's)
    assert rounds.fetch(HEAD, cache, Want({a}), held=True) == (HEAD, False)
    assert rounds.fetch(HEAD, cache, Want({a, b}), held=True) == (HEAD, True)
    assert state.rounds == [{a}, {b}]
    # padding rounds and rounds that name a version are read whatever the cache holds
    assert rounds.fetch(HEAD, cache, Want(), held=True) == (HEAD, True)
    assert rounds.fetch(HEAD, cache, Want({a})) == (HEAD, True)
    assert state.rounds == [{a}, {b}, set(), {a}] and rounds.rounds == 4


def test_the_working_set_is_read_at_a_new_version_before_the_wallet_asks():
    tables = _tables(4, 9, 7)
    state, calls, workers = _calls(tables)
    call = [{"to": "0x" + TOKEN.hex(), "data": "0x70a08231"}, "latest"]
    assert int(calls.eth_call(call), 16) == 7
    rounds, runs = calls.rounds.rounds, workers.runs
    # block 10 published; the watcher sees it and reads the working set in one round
    _publish(tables, _tables(5, 10, 8))
    ten = Served(1, 10, "0x" + "0a" * 32, 5, 0)
    calls.warm(ten)
    assert calls.rounds.rounds == rounds + 1 and state.latest.number == 10
    assert [t.asked[-1] for t in (tables["accounts"], tables["storage"])] == [4, 4]
    # the wallet's call then reads nothing: one run on what the round read, /epoch confirms
    assert int(calls.eth_call(call), 16) == 8
    assert calls.rounds.rounds == rounds + 1 and workers.runs == runs + 1
    # nothing asked for longer than WARM_IDLE_S: no round at the next version
    from morphogen.wallet.evm import WARM_IDLE_S

    state.last_asked = time.monotonic() - WARM_IDLE_S - 1
    calls.warm(Served(1, 11, "0x" + "0b" * 32, 6, 0))
    assert calls.rounds.rounds == rounds + 1


def test_a_head_read_that_finds_a_new_version_starts_the_working_sets_round():
    from morphogen.wallet.versions import _HOOK_POOL

    def told() -> None:  # the hooks run on one thread, in order: what was queued is done
        _HOOK_POOL.submit(lambda: None).result(timeout=10)

    tables = _tables(4, 9, 7)
    state, calls, workers = _calls(tables)
    call = [{"to": "0x" + TOKEN.hex(), "data": "0x70a08231"}, "latest"]
    assert int(calls.eth_call(call), 16) == 7
    rounds = calls.rounds.rounds
    # a wallet polling eth_blockNumber: the head read that finds block 10 has the working set
    # read there at once, not at the watcher's next look, and once
    _publish(tables, _tables(5, 10, 8))
    assert PrivateState.head(state).number == 10
    told()
    assert calls.rounds.rounds == rounds + 1
    assert PrivateState.head(state).number == 10
    told()
    assert calls.rounds.rounds == rounds + 1
    # the balances the wallet asks next read nothing: /epoch confirms 10
    assert int(calls.eth_call(call), 16) == 8 and calls.rounds.rounds == rounds + 1


def test_a_balance_read_at_the_served_block_is_answered_again_without_a_lookup():
    from morphogen.wallet.methods import eth_get_balance

    tables = _tables(4, 9, 7)
    state = _state(tables)
    t = "0x" + TOKEN.hex()
    assert eth_get_balance(state, [t, "latest"]) == "0x5"
    assert len(tables["accounts"].asked) == 1 and state.recent_accounts() == [TOKEN]
    assert eth_get_balance(state, [t, "latest"]) == "0x5"  # /epoch names the same data
    assert len(tables["accounts"].asked) == 1
    # block 10 published with another balance: /epoch names other data, so a lookup
    tables["accounts"].records = dict([account_record(TOKEN, Account(1, 6, keccak256(CODE)))])
    tables["accounts"].desc = FakeDesc(5, Anchor(1, 10, "0x" + "0a" * 32))
    assert eth_get_balance(state, [t, "latest"]) == "0x6"
    assert len(tables["accounts"].asked) == 2
    # a block asked by number is never answered from what was read for `latest`
    assert eth_get_balance(state, [t, "0xa"]) == "0x6"
    assert len(tables["accounts"].asked) == 3


class ChainedWorkers:
    """A "contract" that reads TOKEN's words 1, 2, 3 one after another (each word's slot
    known only once the one before is read: a round each), then ends as `tx["data"]` says:
    0 returns, 1 asks a block hash (refused: not read privately), 2 runs past its time."""

    def __init__(self, routes: CallRoutes, during=None, words: int = 3) -> None:
        self.routes, self.runs, self.during, self.words = routes, 0, during, words

    def run(self, url, block, tx, estimate, limit_s, accounts=()):
        from morphogen.wallet.workers import RunTimedOut

        self.runs += 1
        if self.during is not None:
            self.during(self.runs)
        reads = self.routes.reads(url[url.index("/call/"):])
        at = hex(block["number"])
        t = tx["to"]
        if t not in [a[0] for a in accounts]:
            _ask(reads, "eth_getBalance", t, at)
        for slot in range(1, self.words + 1):
            if int(_ask(reads, "eth_getStorageAt", t, hex(slot), at)["result"], 16) == 0:
                return {"ok": True, "out": b"", "reason": "", "gas": 0}  # thrown away
        end = tx["data"][:1]
        if end == b"\x01":
            _ask(reads, "eth_getBlockByNumber", at, False)
        if end == b"\x02":
            raise RunTimedOut("the EVM ran past its time")
        return {"ok": True, "out": b"\x2a", "reason": "", "gas": 0, "seconds": 0.0}


def _chained(version: int, number: int, words: int = 3):
    tables = _tables(version, number, 7)
    for slot in range(1, words + 1):
        tables["storage"].records[storage_key(TOKEN, slot.to_bytes(32, "big"))] = \
            (slot + 1).to_bytes(32, "big")
    return tables


@pytest.mark.parametrize("end", ["answer", "block hash", "timeout", "version change"])
def test_a_calls_rounds_reach_a_bucket_whatever_path_it_ends_on(end):
    """Four rounds for a call that reads three chained words (the account and word 1, words
    2 and 3, one padding round), whether it returns, stops at BLOCKHASH, runs out of time or
    moves to a newer version on the way (then 8: the rounds at both versions, padded
    together)."""
    from morphogen.wallet.costs import ROUND_BUCKETS
    from morphogen.wallet.evm import PrivateCalls
    from morphogen.wallet.workers import RunTimedOut

    tables = _chained(4, 9)
    state = _state(tables)
    state.head = _head(state, tables)
    routes = CallRoutes()

    def publish_mid_call(run: int) -> None:
        if end == "version change" and run == 3:
            _publish(tables, _chained(5, 10))

    workers = ChainedWorkers(routes, publish_mid_call)
    calls = PrivateCalls(state, workers, routes, lambda: "http://loopback")
    data = {"answer": "0x00", "block hash": "0x01", "timeout": "0x02",
            "version change": "0x00"}[end]
    call = [{"to": "0x" + TOKEN.hex(), "data": data}, "latest"]
    if end in ("answer", "version change"):
        assert calls.eth_call(call) == "0x2a"
    else:
        with pytest.raises(NotServed if end == "block hash" else RunTimedOut):
            calls.eth_call(call)
    assert calls.rounds.rounds in ROUND_BUCKETS
    assert calls.rounds.rounds == (8 if end == "version change" else 4)


@pytest.mark.parametrize("words, fail_at", [(3, k) for k in (1, 2, 3, 4)]
                         + [(4, 4), (5, 5), (5, 6), (6, 6), (6, 8)])
def test_a_round_a_party_fails_ends_the_calls_rounds_whichever_round_it_was(words, fail_at):
    """A party can make any round fail. A call that reads `words` chained words reads that
    many rounds of its own, padded to a bucket: failed at round k, the parties see k rounds,
    whether k was the call's own (the call then fails) or padding (the call answers).
    Padded after its own round failed, but not after a padding round, the count told the two
    apart, and so the length of the contract's path: 4 rounds of its own failed at the 4th
    showed 5 rounds, 3 failed at the 4th (padding) showed 4."""
    from morphogen.client import PirUnavailable
    from morphogen.wallet.evm import PrivateCalls

    tables = _chained(4, 9, words)
    state = _state(tables)
    state.head = _head(state, tables)
    routes = CallRoutes()
    calls = PrivateCalls(state, ChainedWorkers(routes, words=words), routes,
                         lambda: "http://loopback")
    real, sent = state.read_round, []

    def read_round(*args, **kwargs):
        sent.append(len(sent) + 1)
        if len(sent) == fail_at:
            raise PirUnavailable("party B: a round refused")
        return real(*args, **kwargs)

    state.read_round = read_round
    call = [{"to": "0x" + TOKEN.hex(), "data": "0x00"}, "latest"]
    if fail_at <= words:
        with pytest.raises(PirUnavailable):
            calls.eth_call(call)
    else:
        assert calls.eth_call(call) == "0x2a"
    assert len(sent) == fail_at


def test_a_call_whose_request_is_given_up_runs_and_reads_no_more():
    """Its client gone during the second run: no round and no run after it, the answer a
    timeout (-32002), the rounds read still a bucket."""
    from morphogen.wallet import Endpoint
    from morphogen.wallet.costs import ROUND_BUCKETS
    from morphogen.wallet.evm import PrivateCalls
    from morphogen.wallet.jsonrpc import TIMED_OUT
    from morphogen.wallet.workers import Request, client

    tables = _chained(4, 9)
    state = _state(tables)
    state.head = _head(state, tables)
    routes = CallRoutes()
    request = Request()

    def gone(run: int) -> None:
        if run == 2:
            request.cancel("its client went away")

    workers = ChainedWorkers(routes, gone)
    calls = PrivateCalls(state, workers, routes, lambda: "http://loopback")
    body = {"jsonrpc": "2.0", "id": 1, "method": "eth_call",
            "params": [{"to": "0x" + TOKEN.hex(), "data": "0x00"}, "latest"]}
    with client("a", request):
        answer = json.loads(Endpoint(state, calls=calls).handle(json.dumps(body).encode()))
    assert answer["error"]["code"] == TIMED_OUT
    assert "its client went away" in answer["error"]["message"]
    assert workers.runs == 2  # four without (test above)
    assert calls.rounds.rounds in ROUND_BUCKETS and calls.rounds.rounds < 4


def test_a_call_over_its_lookups_or_its_run_time_is_refused_with_a_clear_error():
    """A call whose runs would read more than MAX_CALL_LOOKUPS records is refused before the
    round that would pass it (-32005, naming the limit); one whose runs' EVM time passes
    `run_s` is a timeout (-32002), the time spent waiting for rounds not counted."""
    from morphogen.wallet import Endpoint
    from morphogen.wallet.costs import MAX_CALL_LOOKUPS
    from morphogen.wallet.evm import PrivateCalls
    from morphogen.wallet.jsonrpc import LIMIT_EXCEEDED, TIMED_OUT

    tables = _tables(4, 9, 7)
    state = _state(tables)
    state.head = _head(state, tables)
    routes = CallRoutes()

    class Greedy:
        """Reads a new word each of 1,000 per run: the 5th round would pass the limit."""

        runs, seconds = 0, 0.0

        def run(self, url, block, tx, estimate, limit_s, accounts=()):
            self.runs += 1
            self.limits = getattr(self, "limits", []) + [limit_s]
            reads = routes.reads(url[url.index("/call/"):])
            at = hex(block["number"])
            for slot in range(1000 * self.runs):
                _ask(reads, "eth_getStorageAt", tx["to"], hex(slot + 10), at)
            return {"ok": True, "out": b"", "reason": "", "gas": 0, "seconds": self.seconds}

    greedy = Greedy()
    calls = PrivateCalls(state, greedy, routes, lambda: "http://loopback", run_s=10.0)
    endpoint = Endpoint(state, calls=calls)
    body = {"jsonrpc": "2.0", "id": 1, "method": "eth_call",
            "params": [{"to": "0x" + TOKEN.hex()}, "latest"]}
    answer = json.loads(endpoint.handle(json.dumps(body).encode()))
    assert answer["error"]["code"] == LIMIT_EXCEEDED
    assert str(MAX_CALL_LOOKUPS) in answer["error"]["message"]
    assert greedy.runs == 5  # 4 rounds read (1,000 .. 4,000 words), the 5th refused
    # 4 s of EVM time a run: the third run has 2 s left, the fourth none
    greedy.runs, greedy.seconds, greedy.limits = 0, 4.0, []
    state2 = _state(_tables(4, 9, 7))
    state2.head = _head(state2, tables)
    calls = PrivateCalls(state2, greedy, routes, lambda: "http://loopback", run_s=10.0)
    answer = json.loads(Endpoint(state2, calls=calls).handle(json.dumps(body).encode()))
    assert answer["error"]["code"] == TIMED_OUT and "timed out" in answer["error"]["message"]
    assert greedy.limits == [10.0, 6.0, 2.0]


def test_a_call_from_an_address_with_code_is_not_answered_as_failed():
    """The EVM refuses a caller with code (EIP-3607, which nodes skip for calls): that is
    no execution failure (-32000) but a call not run privately, said so (-32001, or the
    upstream node's answer)."""
    from morphogen.wallet import Endpoint
    from morphogen.wallet.evm import PrivateCalls
    from morphogen.wallet.jsonrpc import NOT_SERVED

    tables = _tables(4, 9, 7)
    state = _state(tables)
    state.head = _head(state, tables)
    routes = CallRoutes()

    class Refusing:
        def run(self, url, block, tx, estimate, limit_s, accounts=()):
            return {"ok": False, "out": b"", "reason": "Transaction(RejectCallerWithCode)",
                    "gas": 0, "seconds": 0.0}

    calls = PrivateCalls(state, Refusing(), routes, lambda: "http://loopback")
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_call",
                       "params": [{"from": "0x" + TOKEN.hex(), "to": "0x" + TOKEN2.hex()},
                                  "latest"]}).encode()
    answer = json.loads(Endpoint(state, calls=calls).handle(body))
    assert answer["error"]["code"] == NOT_SERVED and "with code" in answer["error"]["message"]
    forwarded = Endpoint(state, calls=calls, forward=lambda r: {
        "jsonrpc": "2.0", "id": r["id"], "result": "0x01"})
    assert json.loads(forwarded.handle(body))["result"] == "0x01"
