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
