"""Named tables through a real local Ray Serve over HTTP: two parties (two and three shards)
serve a snapshot with two tables beside the whole matrix; PirClient reads each (JSON and
msgpack), an unknown table is a 400, and one page update touching both tables reaches both."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from morphogen.client import PirClient, UnknownTable
from morphogen.client.admin import AdminClient, publish_to_parties
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages
from tests.integration.conftest import apply_changes, delete_apps, deploy

pytestmark = [pytest.mark.ray]

TOKEN = "tables-admin-token-0123456789abcdef"
PAGES = 120
SEED = 21
# party A's shards: [0, 60) [60, 120); party B's: [0, 40) [40, 80) [80, 120)
TABLES = [{"name": "users", "first_page": 10, "num_pages": 45},   # within A's first shard
          {"name": "code", "first_page": 55, "num_pages": 50}]    # straddles shards of both


@pytest.fixture(scope="module")
def served(serve_instance, tmp_path_factory):
    root = tmp_path_factory.mktemp("tables")
    build_synthetic(root / "snaps" / "base", PAGES, seed=SEED, epoch_id=1, progress=False,
                    tables=TABLES)
    (root / "token").write_text(TOKEN)
    urls = []
    for name, shards in (("ta", 2), ("tb", 3)):
        deploy(serve_instance, name, snapshot=str(root / "snaps" / "base"), num_shards=shards,
               admin_token_file=str(root / "token"), epoch_log_dir=str(root / f"log-{name}"))
        urls.append(serve_instance.app_url(name))
    yield urls
    delete_apps("ta", "tb")


def _page(model: np.ndarray, name: str, i: int) -> bytes:
    first = next(t["first_page"] for t in TABLES if t["name"] == name)
    return model[first + i].tobytes()


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_each_table_and_the_whole_matrix_read_through_pir_client(served, encoding):
    model = synthetic_pages(SEED, 0, PAGES)
    with PirClient(*served, encoding=encoding) as client:
        info = client.info()
        assert info.num_pages == PAGES
        assert info.tables["users"] == (10, 45, 6) and info.tables["code"] == (55, 50, 6)
        assert client.get([0, 44, 7], table="users") == [
            _page(model, "users", i) for i in (0, 44, 7)]
        assert client.get([0, 5, 49], table="code") == [
            _page(model, "code", i) for i in (0, 5, 49)]
        assert client.get([10, 119]) == [model[10].tobytes(), model[119].tobytes()]
        answer = client.get_pinned([3], num_pages=45, table="users")
        assert answer.pages == [_page(model, "users", 3)]
        with pytest.raises(UnknownTable):
            client.get([0], table="nope")


def test_an_unknown_table_is_a_400_naming_it(served):
    body = {"keys": ["0x00"] * 3, "table": "nope"}
    resp = httpx.post(f"{served[0]}/query/page/gpu", json=body, timeout=30)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "unknown_table" and "'nope'" in error["message"]
    doc = httpx.get(f"{served[1]}/epoch", timeout=30).json()
    assert doc["tables"] == {"users": {"first_page": 10, "num_pages": 45, "domain_bits": 6},
                             "code": {"first_page": 55, "num_pages": 50, "domain_bits": 6}}


def test_a_page_update_touching_both_tables_reaches_both(served):
    rng = np.random.default_rng(3)
    changes = [(12, "diff", rng.integers(0, 256, 4096, np.uint8).tobytes()),
               (60, "data", rng.integers(0, 256, 300, np.uint8).tobytes())]
    with AdminClient(served[0], TOKEN) as adm_a, AdminClient(served[1], TOKEN) as adm_b:
        publish_to_parties([adm_a, adm_b], lambda adm: adm.updates(changes))
    model = apply_changes(synthetic_pages(SEED, 0, PAGES), changes)
    with PirClient(*served) as client:
        client.info(refresh=True)
        assert client.get([2], table="users") == [model[12].tobytes()]
        assert client.get([5], table="code") == [model[60].tobytes()]
        assert client.get([12, 60]) == [model[12].tobytes(), model[60].tobytes()]
