"""The command line against the shared local cluster: `admin status` as a table (case 11) and
`--json`, `admin updates` under the digest the party takes, and the resource check reading
the cluster's free CPUs (case 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.cli import main
from cluster.errors import UsageError
from cluster.resources import Capacity, PartyDemand, check
from morphogen.config import PartyConfig
from morphogen.protocol.changes import ChangeBatch

from .conftest import NUM_PAGES, deploy

pytestmark = pytest.mark.ray


def test_admin_status_is_a_table_and_json_when_asked(serve_instance, tmp_path: Path,
                                                     capsys) -> None:
    from ray import serve

    token = tmp_path / "token"
    token.write_text("cli-status-token-0123456789\n")
    deploy(serve_instance, "adminview", num_shards=2, admin_token_file=str(token),
           epoch_log_dir=str(tmp_path / "log"))
    url = serve_instance.app_url("adminview")
    try:
        assert main(["admin", "status", "--server", url, "--token-file", str(token)]) == 0
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert lines[0].startswith(f"{url}: epoch 1 (0x")
        assert f"{NUM_PAGES} pages, domain 10 bits, consistent" in lines[0]
        assert lines[1].split()[:2] == ["epoch", "log"]  # admin needs one
        assert lines[2].split()[:3] == ["shard", "pages", "epoch"]
        assert lines[4].split()[:3] == ["0", "0-319", "1"]
        assert lines[5].split()[:3] == ["1", "320-639", "1"]
        assert len(out) < 800  # was 1.5 kB of JSON on one line

        assert main(["admin", "--server", url, "status", "--token-file", str(token),
                     "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["server"] == url and len(doc["shards"]) == 2

        # `admin updates` names the digest the party takes (2): the log's batch file is
        # named by it, and a re-run is answered as done
        changes = tmp_path / "changes.json"
        changes.write_text(json.dumps({"updates": [{"page": 5, "diff": "0x" + "07" * 4096},
                                                   {"page": 9, "data": "0x0102"}]}))
        run = ["admin", "--server", url, "--token-file", str(token), "updates", str(changes),
               "--json"]
        assert main(run) == 0
        done = json.loads(capsys.readouterr().out)
        assert done["epoch_id"] == 2
        batch = ChangeBatch.from_triples([(5, "diff", b"\x07" * 4096), (9, "data", b"\x01\x02")])
        assert [f.name.split("-")[2] for f in (tmp_path / "log").rglob("updates-*.bin")] == [
            batch.with_digest(2).digest[:16] + ".bin"]
        assert main(run) == 0
        assert json.loads(capsys.readouterr().out)["duplicate"]
    finally:
        serve.delete("adminview")


def test_capacity_is_read_from_the_cluster(serve_instance) -> None:
    import ray

    cap = Capacity.of_cluster()
    assert 0 < cap.free["CPU"] <= ray.cluster_resources()["CPU"]
    assert cap.largest_node["CPU"] == ray.cluster_resources()["CPU"]
    assert cap.addable == {}  # no autoscaler
    too_many = PartyDemand.of("big", PartyConfig(synthetic_pages=NUM_PAGES, num_shards=64), 0)
    with pytest.raises(UsageError, match="asks Ray for 32.25 CPUs"):
        check([too_many], cap, owns=False)
