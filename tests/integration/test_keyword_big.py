"""A keyword-table version touching 20,001 pages, published through two real parties: the
owner dies between the parties, the re-run finishes it without applying anything twice, the
records read back changed, and the small version after it publishes as a batch."""

from __future__ import annotations

import random

import pytest

from cluster.parties import HttpParties
from morphogen.keyword import KeywordClient, build_table
from morphogen.keyword.owner import Change, OwnerTable, create_owner_dir
from morphogen.keyword.publishing import publish
from morphogen.keyword.signing import generate_key_files, load_signing_key
from tests.integration.conftest import deploy

pytestmark = [pytest.mark.ray]

TOKEN = "kw-big-admin-token-0123456789"
RECORDS = 20_000
VALUE_SIZE = 4000  # one record a page: changing every value touches exactly RECORDS pages


class DiesAfterA(HttpParties):
    """The owner process killed once party A has the version and before B has it."""

    def _only_a(self, send):
        send(self.clients[0])
        raise KeyboardInterrupt("owner killed between the parties")

    def updates(self, publication, batch):
        self._only_a(lambda c: c.updates(batch, publication))

    def snapshot(self, publication, path):
        self._only_a(lambda c: c.snapshot(path, publication))


@pytest.fixture(scope="module")
def big(serve_instance, tmp_path_factory):
    root = tmp_path_factory.mktemp("kwbig")
    key_path, pub_path = generate_key_files(root / "owner.key")
    signing_key = load_signing_key(key_path)
    rng = random.Random(3)
    records = {rng.randbytes(20): rng.randbytes(VALUE_SIZE) for _ in range(RECORDS)}
    table = build_table(records.items(), value_size=VALUE_SIZE, signing_key=signing_key,
                        num_buckets=24_000)
    snapshot = create_owner_dir(table, root / "owner", full_every=4)
    (root / "token").write_text(TOKEN)
    (root / "snaps").mkdir()
    urls = []
    for name, shards in (("kbiga", 2), ("kbigb", 1)):
        deploy(serve_instance, name, snapshot=str(snapshot), num_shards=shards,
               admin_token_file=str(root / "token"), epoch_log_dir=str(root / f"log-{name}"),
               admin_snapshot_dir=str(root / "snaps"))
        urls.append(serve_instance.app_url(name))
    yield {"root": root, "urls": urls, "pub": pub_path, "key": signing_key, "records": records}
    from ray import serve

    for name in ("kbiga", "kbigb"):
        serve.delete(name)


def _geometry(owner):
    from morphogen.keyword.descriptor import unsigned

    return unsigned(owner.pages()[-1]).geometry


def _parties(big, cls=HttpParties):
    from morphogen.client.admin import AdminClient

    return cls([AdminClient(u, TOKEN) for u in big["urls"]], retry_for_s=60.0, max_updates=None)


def _read(big, keys):
    from morphogen.client import PirClient

    with PirClient(*big["urls"], encoding="msgpack", timeout_s=120.0) as pir:
        kc = KeywordClient(pir, big["pub"])
        return kc.descriptor(refresh=True).version, kc.get_many(keys)


def test_a_20000_page_version_publishes_whole_once_and_later_versions_follow(big) -> None:
    records, rng = big["records"], random.Random(5)
    owner = OwnerTable(big["root"] / "owner")
    changed = {k: rng.randbytes(VALUE_SIZE) for k in records}
    version, batch = owner.apply([Change("put", k, v) for k, v in changed.items()], big["key"],
                                 rng=rng.randrange)
    # every record's page, the tree pages on their paths (all of them here), the descriptor
    levels = _geometry(owner).levels
    assert len(batch) == RECORDS + sum(levels) + 1

    with pytest.raises(KeyboardInterrupt):
        publish(owner, _parties(big, DiesAfterA), snapshot_dir=str(big["root"] / "snaps"))
    statuses = [c.status() for c in _parties(big).clients]
    assert statuses[0]["epoch_log_head"]["publication"] == owner.publication_id(version)
    assert statuses[1]["epoch_log_head"] is None  # B never saw it

    done = publish(OwnerTable(big["root"] / "owner"), _parties(big))  # the recorded path
    assert [(p.version, p.mode) for p in done] == [(version, "rotation")]
    a, b = done[0].results
    assert a.get("duplicate") and not b.get("duplicate")  # applied once on each party
    assert a["identity"] == b["identity"]
    records.update(changed)
    sample = rng.sample(sorted(records), 64)
    assert _read(big, sample) == (version, [records[k] for k in sample])

    # the version after a big one: a small batch, published as one
    small = {k: rng.randbytes(VALUE_SIZE) for k in sample[:3]}
    later, _ = owner.apply([Change("put", k, v) for k, v in small.items()], big["key"],
                           rng=rng.randrange)
    done = publish(owner, _parties(big))
    assert [(p.version, p.mode) for p in done] == [(later, "updates")]
    records.update(small)
    assert _read(big, sample[:8]) == (later, [records[k] for k in sample[:8]])
