"""Keyword lookup through a real local Ray Serve: two parties serve a signed table of accounts,
clients look addresses up over HTTP and Serve handles, the owner publishes inserts (with their
eviction chains), changes and deletes, a party whose answers are tampered with is caught, and
long-lived clients meet a rotation to a smaller table alike, whatever key they look up."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import httpx
import msgpack
import pytest

from morphogen.keyword import (
    AsyncKeywordClient,
    KeywordClient,
    KeywordIntegrityError,
    build_table,
    request_sizes,
)
from morphogen.keyword.accounts import ACCOUNT_VALUE_SIZE, synthetic_accounts
from morphogen.keyword.owner import Change, OwnerTable, create_owner_dir
from morphogen.keyword.publishing import publish
from morphogen.keyword.signing import generate_key_files, load_signing_key
from morphogen.keyword.verify import ANSWER_FAILED
from tests.integration.conftest import delete_apps, deploy

pytestmark = [pytest.mark.ray]

TOKEN = "kw-admin-token-0123456789"


class Tamper(httpx.HTTPTransport):
    """Flips one bit of the first page of every answer from one server, once armed."""

    def __init__(self, victim: str) -> None:
        super().__init__()
        self.victim, self.armed, self.flipped = victim, False, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        resp = super().handle_request(request)
        if not (self.armed and request.method == "POST" and str(request.url).startswith(
                self.victim)):
            return resp
        doc = json.loads(resp.read())
        group = doc["results"][0]["pages"] if "results" in doc else doc["pages"]
        first = bytearray.fromhex(group[0][2:])
        first[1234] ^= 0x04
        group[0] = "0x" + first.hex()
        self.flipped += 1
        return httpx.Response(resp.status_code, headers={"content-type": "application/json"},
                              content=json.dumps(doc).encode())


@pytest.fixture(scope="module")
def table(serve_instance, tmp_path_factory):
    root = tmp_path_factory.mktemp("kw")
    key_path, pub_path = generate_key_files(root / "owner.key")
    signing_key = load_signing_key(key_path)
    accounts = dict(synthetic_accounts(3000, seed=4))
    # the reference's one-row buckets, nearly full: inserts evict along chains
    built = build_table(accounts.items(), value_size=ACCOUNT_VALUE_SIZE, signing_key=signing_key,
                        layout="row", row_size=128, load=0.86)
    snapshot = create_owner_dir(built, root / "owner")
    (root / "token").write_text(TOKEN)
    urls = {}
    for name, shards in (("kwa", 2), ("kwb", 1)):
        deploy(serve_instance, name, snapshot=str(snapshot), num_shards=shards,
               admin_token_file=str(root / "token"), epoch_log_dir=str(root / f"log-{name}"))
        urls[name] = serve_instance.app_url(name)
    yield {"urls": urls, "pub": pub_path, "key": signing_key, "accounts": accounts,
           "owner": root / "owner", "descriptor": built.descriptor}
    delete_apps("kwa", "kwb")


def _client(table, **kw):
    from morphogen.client import PirClient

    return PirClient(table["urls"]["kwa"], table["urls"]["kwb"], **kw)


def test_present_and_absent_keys_over_http_and_handles(table) -> None:
    from ray import serve

    from morphogen.client import AsyncPirClient, HandlePirClient

    accounts = table["accounts"]
    rng = random.Random(1)
    present = rng.sample(sorted(accounts), 40)
    absent = [rng.randbytes(20) for _ in range(10)]
    expected = [accounts[k] for k in present] + [None] * 10
    with _client(table, encoding="msgpack") as pir:
        kc = KeywordClient(pir, table["pub"])
        assert kc.get_many(present + absent) == expected
        assert kc.get(present[0]) == accounts[present[0]]
        assert kc.get(absent[0]) is None
        assert kc.descriptor().geometry.layout == "row"

    async def via_async() -> list:
        async with AsyncPirClient(table["urls"]["kwa"], table["urls"]["kwb"]) as pir:
            return await AsyncKeywordClient(pir, table["pub"]).get_many(present + absent)

    assert asyncio.run(via_async()) == expected
    handles = HandlePirClient(serve.get_app_handle("kwa"), serve.get_app_handle("kwb"))
    assert KeywordClient(handles, table["pub"]).get_many(present[:5]) == expected[:5]


class Tables(httpx.HTTPTransport):
    """Records the table each query request to one party names (None: the whole matrix)."""

    def __init__(self, party: str) -> None:
        super().__init__()
        self.party, self.tables = party, []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and str(request.url).startswith(self.party):
            self.tables.append(msgpack.unpackb(request.read()).get("table"))
        return super().handle_request(request)


def test_each_part_of_a_lookup_scans_its_own_table(table) -> None:
    accounts = table["accounts"]
    seen = Tables(table["urls"]["kwa"])
    with _client(table, encoding="msgpack", transport=seen) as pir:
        info = pir.info()
        geometry = table["descriptor"].geometry
        assert {name: (t.first_page, t.num_pages) for name, t in info.tables.items()} == {
            t["name"]: (t["first_page"], t["num_pages"]) for t in geometry.tables()}
        kc = KeywordClient(pir, table["pub"], whole_level_pages=1)
        keys = sorted(accounts)[:8] + [b"\x02" * 20]
        assert kc.get_many(keys) == [accounts.get(k) for k in keys]
        # the descriptor, the top level whole; then the data and each level below the top
        levels = [f"tree{k}" for k in range(1, len(geometry.levels))]
        assert seen.tables[:2] == ["descriptor", f"tree{len(geometry.levels)}"]
        assert sorted(seen.tables[2:]) == sorted(["data", *levels])
        assert None not in seen.tables


def test_a_tampered_party_gives_the_one_integrity_error_for_any_key(table) -> None:
    accounts = table["accounts"]
    tamper = Tamper(table["urls"]["kwb"])
    with _client(table, encoding="json", transport=tamper) as pir:
        kc = KeywordClient(pir, table["pub"])
        kc.descriptor()  # read clean; every lookup after it is tampered with
        tamper.armed = True
        messages = []
        for key in (sorted(accounts)[5], b"\x01" * 20):
            with pytest.raises(KeywordIntegrityError) as exc:
                kc.get(key)
            messages.append(str(exc.value))
    assert messages == [ANSWER_FAILED, ANSWER_FAILED]
    assert tamper.flipped >= 2


def test_inserts_changes_and_deletes_published_to_both_parties(table) -> None:
    from cluster.parties import HttpParties
    from morphogen.client.admin import AdminClient, publish_to_parties

    accounts = table["accounts"]
    owner = OwnerTable(table["owner"])
    rng = random.Random(7)
    new = {rng.randbytes(20): rng.randbytes(ACCOUNT_VALUE_SIZE) for _ in range(60)}
    changed = {k: rng.randbytes(ACCOUNT_VALUE_SIZE) for k in sorted(accounts)[:5]}
    deleted = sorted(accounts)[5:10]
    version, batch = owner.apply([Change("put", k, v) for k, v in {**new, **changed}.items()]
                                 + [Change("delete", k) for k in deleted], table["key"],
                                 rng=rng.randrange)
    assert len(batch) >= 10  # 70 changes over 190 pages, the descriptor last
    admins = [AdminClient(u, TOKEN) for u in table["urls"].values()]
    try:
        parties = HttpParties(admins, retry_for_s=30.0, max_updates=None)
        done = publish(owner, parties)
        assert [(p.version, p.mode) for p in done] == [(version, "updates")]
        assert publish(owner, parties) == []  # every version sent: nothing again
        pub = owner.publication_id(version)
        again = publish_to_parties(admins, lambda c: c.updates(batch, pub))
        assert all(r.get("duplicate") for r in again)  # a re-send applies nothing twice
    finally:
        for a in admins:
            a.close()
    accounts.update(new)
    accounts.update(changed)
    for k in deleted:
        del accounts[k]
    keys = [*new, *changed, *deleted, *rng.sample(sorted(accounts), 50)]
    with _client(table, encoding="msgpack") as pir:
        kc = KeywordClient(pir, table["pub"])
        assert kc.get_many(keys) == [accounts.get(k) for k in keys]
        assert kc.descriptor().version == version


def test_the_commands_build_apply_publish_and_look_up(table, tmp_path, capsys) -> None:
    from cluster.cli import main

    # the owner's commands on the served table: apply a changes file, publish to both parties
    accounts = table["accounts"]
    key_file = tmp_path / "owner.key"
    key_file.write_text(table["key"].private_bytes_raw().hex())
    (tmp_path / "token").write_text(TOKEN)
    target = sorted(accounts)[20]
    new = b"\x42" * 20
    (tmp_path / "changes.jsonl").write_text(
        json.dumps({"op": "put", "key": "0x" + new.hex(), "value": "0x" + "07" * 32}) + "\n"
        + json.dumps({"op": "delete", "key": "0x" + target.hex()}) + "\n")
    urls = list(table["urls"].values())
    assert main(["records", "apply", "--owner", str(table["owner"]), "--signing-key",
                 str(key_file), str(tmp_path / "changes.jsonl"), "--server", urls[0],
                 "--server", urls[1], "--token-file", str(tmp_path / "token")]) == 0
    out = capsys.readouterr().out
    assert "2 change(s)" in out and "published" in out
    # the command held the table as a follower does: mapped files, whole at the new version
    working = json.loads((Path(table["owner"]) / "working" / "working.json").read_text())
    assert working["clean"] and working["version"] == json.loads(
        (Path(table["owner"]) / "owner.json").read_text())["current"]
    accounts.pop(target)
    accounts[new] = b"\x07" * 32
    present = sorted(accounts)[30]
    assert main(["lookup", "--server-a", urls[0], "--server-b", urls[1], "--public-key",
                 str(table["pub"]), "0x" + present.hex(), "0x" + new.hex(),
                 "0x" + target.hex()]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"0x{present.hex()}\t0x{accounts[present].hex()}",
                     f"0x{new.hex()}\t0x{'07' * 32}", f"0x{target.hex()}\tabsent"]
    # a bound the served version does not meet: refused, nothing printed as a value
    assert main(["lookup", "--server-a", urls[0], "--server-b", urls[1], "--public-key",
                 str(table["pub"]), "--min-version", "99", "0x" + present.hex()]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "stale table" in captured.err and "version 99" in captured.err
    assert main(["lookup", "--server-a", urls[0], "--server-b", urls[1], "--public-key",
                 str(table["pub"]), "--max-age", "3600", "0x" + present.hex()]) == 0


def test_build_records_command_writes_an_owner_directory(tmp_path, capsys) -> None:
    from cluster.cli import main

    assert main(["records", "keygen", "--out", str(tmp_path / "o.key")]) == 0
    rows = synthetic_accounts(500, seed=9)
    (tmp_path / "r.csv").write_text("key,value\n" + "".join(
        f"0x{k.hex()},0x{v.hex()}\n" for k, v in rows))
    assert main(["build", "--records", str(tmp_path / "r.csv"), "--value-size", "32",
                 "--signing-key", str(tmp_path / "o.key"), "--out", str(tmp_path / "kw")]) == 0
    out = capsys.readouterr().out
    assert "500 records" in out and str(tmp_path / "kw" / "v000001" / "snapshot") in out
    # a wrong value size is refused naming the line, exit status 2
    assert main(["build", "--records", str(tmp_path / "r.csv"), "--value-size", "31",
                 "--signing-key", str(tmp_path / "o.key"), "--out", str(tmp_path / "kw2")]) == 2
    assert "r.csv:2: value is 32 bytes" in capsys.readouterr().err


class Counting(httpx.HTTPTransport):
    """Records what one client's requests look like to a party: ("epoch",) or
    ("query", number of queries in the request)."""

    def __init__(self, party: str) -> None:
        super().__init__()
        self.party, self.seen = party, []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and str(request.url).startswith(self.party):
            self.seen.append(("epoch",))
        elif request.method == "POST" and str(request.url).startswith(self.party):
            body = msgpack.unpackb(request.read())
            self.seen.append(("query", len(body["queries"]) if "queries" in body else 1))
        return super().handle_request(request)


def test_a_rotation_to_a_smaller_table_meets_every_key_alike(serve_instance, tmp_path) -> None:
    from ray import serve

    from morphogen.client import PirClient
    from morphogen.client.admin import AdminClient, publish_to_parties

    key_path, pub = generate_key_files(tmp_path / "owner.key")
    signing_key = load_signing_key(key_path)
    big, small = dict(synthetic_accounts(2500, seed=11)), dict(synthetic_accounts(400, seed=12))
    # one table rebuilt smaller: its dataset id stays (a client refuses another dataset's)
    dataset = bytes(range(16))
    for name, recs in (("big", big), ("small", small)):
        create_owner_dir(build_table(recs.items(), value_size=ACCOUNT_VALUE_SIZE,
                                     signing_key=signing_key, layout="row", row_size=128,
                                     load=0.8, dataset=dataset), tmp_path / name)
    (tmp_path / "token").write_text(TOKEN)
    urls = []
    for name in ("kwra", "kwrb"):
        deploy(serve_instance, name, snapshot=str(tmp_path / "big/v000001/snapshot"),
               num_shards=1, admin_token_file=str(tmp_path / "token"),
               admin_snapshot_dir=str(tmp_path), epoch_log_dir=str(tmp_path / f"log-{name}"))
        urls.append(serve_instance.app_url(name))
    rng = random.Random(3)
    # keys of the new table, of the old one only, and of neither: candidates all over
    keys = rng.sample(sorted(small), 2) + rng.sample(sorted(big), 2) + [rng.randbytes(20)]
    clients = []
    try:
        for _ in keys:  # one long-lived client per key, each warm on the old table
            count = Counting(urls[0])
            pir = PirClient(*urls, encoding="msgpack", transport=count)
            kc = KeywordClient(pir, pub)
            assert kc.get(sorted(big)[0]) == big[sorted(big)[0]]
            clients.append((pir, kc, count))
        admins = [AdminClient(u, TOKEN) for u in urls]
        try:
            publish_to_parties(admins, lambda c: c.snapshot("small/v000001/snapshot", "kw-rot"))
        finally:
            for a in admins:
                a.close()
        traffic = set()
        for key, (_, kc, count) in zip(keys, clients, strict=True):
            count.seen.clear()
            assert kc.get(key) == small.get(key)
            traffic.add(tuple(count.seen))
            assert kc.descriptor().records == len(small)
        assert len(traffic) == 1, traffic  # the same requests for every key
        # every lookup after it, at request shapes that are buckets only
        pir, kc, count = clients[0]
        count.seen.clear()
        wanted = keys + rng.sample(sorted(small), 40)
        assert kc.get_many(wanted) == [small.get(k) for k in wanted]
        assert [n for kind, *n in count.seen if kind == "query"] == [
            [n] for n in request_sizes(len(wanted), pir.info().max_batch_queries)]
    finally:
        for pir, _, _ in clients:
            pir.close()
        serve.delete("kwra")
        serve.delete("kwrb")
