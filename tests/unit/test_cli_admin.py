"""`morphogen admin`: token sources and the updates file, without a server."""

from __future__ import annotations

import json

from cluster.cli import _read_updates, main


def test_admin_needs_a_token(monkeypatch, capsys) -> None:
    monkeypatch.delenv("MORPHOGEN_ADMIN_TOKEN", raising=False)
    assert main(["admin", "--server", "http://127.0.0.1:1", "status"]) == 2
    assert "no admin token" in capsys.readouterr().err


def test_admin_reports_an_unreachable_server(tmp_path, capsys) -> None:
    token = tmp_path / "token"
    token.write_text("cli-admin-token-0123456789\n")
    rc = main(["admin", "--server", "http://127.0.0.1:1", "--token-file", str(token),
               "--timeout", "2", "status"])
    err = capsys.readouterr().err
    assert rc == 1 and "127.0.0.1:1" in err and "cli-admin-token" not in err


def test_updates_file(tmp_path, capsys) -> None:
    path = tmp_path / "u.json"
    path.write_text(json.dumps({"updates": [{"page": 3, "diff": "0x" + "01" * 4096},
                                            {"page": 4, "data": "0xabcd"}]}))
    assert _read_updates(str(path)) == [(3, "diff", b"\x01" * 4096), (4, "data", b"\xab\xcd")]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"updates": [{"page": 3}]}))
    assert main(["admin", "--server", "http://x", "--token-file", str(path), "updates",
                 str(bad)]) == 2


def test_server_before_and_after_the_action_in_order() -> None:
    import argparse

    from cluster.cli import _admin_servers, build_parser

    args = build_parser().parse_args(["admin", "--server", "http://a:1/a", "status",
                                      "--server", "http://b:1/b", "--json"])
    _admin_servers(args)
    assert args.server == ["http://a:1/a", "http://b:1/b"] and args.json is True
    args = build_parser().parse_args(["admin", "--token-file", "t", "snapshot", "next",
                                      "--server", "http://a:1"])
    _admin_servers(args)
    assert (args.server, args.token_file, args.path) == (["http://a:1"], "t", "next")
    assert isinstance(args, argparse.Namespace)


def test_admin_without_a_server(capsys) -> None:
    assert main(["admin", "status"]) == 2
    assert "--server" in capsys.readouterr().err


STATUS = {
    "epoch_id": 3, "pending_updates": 2,
    "rotation_in_progress": False, "consistent": True, "num_pages": 640, "domain_bits": 10,
    "admin_busy": False, "epoch_log": "/var/log/a", "epoch_log_head":
        {"epoch_id": 3, "kind": "updates", "identity": "0x" + "ab" * 16},
    "shards": [
        {"shard": 0, "epoch_id": 3, "identity": "0x" + "ab" * 16, "first_page": 0,
         "stop_page": 320, "pending_updates": 2, "engine": "cpu", "scans": 17,
         "replicas": [{"replica": "r0", "node_id": "n", "epoch_id": 3}]},
        {"shard": 1, "epoch_id": 3, "identity": "0x" + "ab" * 16, "first_page": 320,
         "stop_page": 640, "pending_updates": 2, "engine": "cpu", "scans": 12,
         "replicas": [{"replica": "r1"}, {"replica": "r2"}]},
    ],
}


def test_status_is_a_table(capsys) -> None:
    from cluster.admin_view import show

    show("status", "http://a:8000/a", STATUS, as_json=False)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == ("http://a:8000/a: epoch 3 (0xababababab..), 640 pages, domain 10 bits, "
                        "consistent, 2 pending update(s), rotation no, admin busy no")
    assert lines[1] == "  epoch log /var/log/a: head epoch 3 (updates)"
    assert lines[2].split() == ["shard", "pages", "epoch", "identity", "pending", "replicas",
                                "engine", "scans"]
    assert lines[4].split() == ["0", "0-319", "3", "0xababababab..", "2", "1", "cpu", "17"]
    assert lines[5].split() == ["1", "320-639", "3", "0xababababab..", "2", "2", "cpu", "12"]
    show("status", "http://a:8000/a", STATUS, as_json=True)
    assert json.loads(capsys.readouterr().out) == {"server": "http://a:8000/a", **STATUS}


def test_fields_a_server_does_not_send_are_dashes(capsys) -> None:
    from cluster.admin_view import show

    show("status", "http://b", {"epoch_id": 1, "shards": [{"shard": 0}]}, as_json=False)
    out = capsys.readouterr().out
    assert "pages, domain - bits" in out and out.splitlines()[3].split()[:3] == ["0", "-", "-"]
    show("updates", "http://b", {"epoch_id": 4, "applied": 2}, as_json=False)
    assert capsys.readouterr().out == "http://b: updates done: epoch_id 4, applied 2\n"


def test_status_shows_replicas_that_fetch_or_failed_to_start(capsys) -> None:
    from cluster.admin_view import show

    doc = {**STATUS, "replica_starts": [
        {"line": "shard_1 on node 0123456789abcdef: failed to start: node n: s3://b/s chunk "
                 "4 (pages [64, 80)): 7 chunk(s) need 0.4 MiB in /c, which has 0.2 MiB free"},
        {"line": "shard_0 on node fedcba9876543210: fetching 12.0 of 48.0 MiB of s3://b/s "
                 "(3 chunk(s)) on node n, 6.0 MiB/s, 6 s left"}]}
    show("status", "http://a:8000/a", doc, as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == ("  replica shard_1 on node 0123456789abcdef: failed to start: node n: "
                        "s3://b/s chunk 4 (pages [64, 80)): 7 chunk(s) need 0.4 MiB in /c, "
                        "which has 0.2 MiB free")
    assert lines[3].startswith("  replica shard_0 on node fedcba9876543210: fetching 12.0 of")
