"""Case 7 and 8: each bad input is one `error:` line naming the input and the fix, exit
status 2, no traceback, nothing retried; inputs that used to be accepted without a word (a raw
file ending inside a page, one server for both parties) are refused. Each command runs as the
operator runs it, in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.cli import main
from cluster.local import free_port
from morphogen.snapshot.open import open_any

REPO = Path(__file__).resolve().parents[2]


def _run(args: list[str], cwd: Path) -> tuple[int, str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), MORPHOGEN_CACHE_DIR=str(cwd / "cache"))
    env.pop("MORPHOGEN_ADMIN_TOKEN", None)
    proc = subprocess.run([sys.executable, "-m", "cluster.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def _refused(args: list[str], cwd: Path, *expected: str) -> str:
    rc, out, err = _run(args, cwd)
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.strip().splitlines()
    # argparse's own errors come after its usage lines; ours are the only line
    line = lines[-1]
    assert line.startswith(("error:", "morphogen")), err
    if line.startswith("error:"):
        assert len(lines) == 1, err
    for text in expected:
        assert text in line, line
    return line


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "token").write_text("cli-errors-token-0123456789\n")
    (tmp_path / "list.json").write_text(json.dumps([{"page": 1, "diff": "0x00"}]))
    (tmp_path / "ragged.bin").write_bytes(os.urandom(4096 * 2 + 100))
    return tmp_path


CASES = [
    # (argv, texts the line must contain)
    (["serve", "--matrix", "/nonexistent"], ["--matrix /nonexistent", "no such snapshot",
                                             "morphogen build"]),
    (["serve", "--shards", "0"], ["--shards", "0 is not >= 1"]),
    (["serve", "--shard-cpus", "-1"], ["--shard-cpus", "not > 0"]),
    (["serve", "--route-prefix", "b"], ["route prefix 'b' must be / or /name"]),
    (["serve", "--config", "missing.yaml"], ["--config missing.yaml: no such file"]),
    (["build", "--synthetic", "0", "--out", "x"], ["--synthetic", "0 is not >= 1"]),
    (["build", "--raw", "missing.bin", "--out", "x"], ["--raw missing.bin",
                                                       "raw page file not found"]),
    # a URI is never written as a local directory named "s3:" (issue 29): a web server's
    # cannot be written at all, and a keyword table is the owner's local directory
    (["build", "--synthetic", "4", "--out", "https://host/snap"],
     ["--out https://host/snap", "cannot be written", "s3://"]),
    (["build", "--records", "list.json", "--out", "gs://bucket/kw"],
     ["--out gs://bucket/kw", "local owner directory", "morphogen snapshot push"]),
    (["snapshot", "push", "snap", "https://host/snap"], ["https://host/snap",
                                                         "cannot be written"]),
    (["snapshot", "push", "snap", "elsewhere"], ["elsewhere: not an object store"]),
    (["snapshot", "push", "absent", "s3://bucket/snap"], ["absent: no such snapshot"]),
    (["admin", "--server", "http://127.0.0.1:1", "--token-file", "absent", "status"],
     ["--token-file absent: no such file"]),
    (["admin", "--token-file", "token", "updates", "list.json", "--server", "http://x:1"],
     ["updates file list.json", "a bare list", '{"updates": [']),
    (["admin", "status", "--server", "127.0.0.1:1", "--token-file", "token"],
     ["--server", "needs http:// or https://"]),
    (["get", "--server-a", "127.0.0.1:1", "--server-b", "http://127.0.0.1:2", "1"],
     ["--server-a", "'127.0.0.1:1' needs http://"]),
    # case 8: one server for both parties sees both keys
    (["get", "--server-a", "http://127.0.0.1:1/a", "--server-b", "http://127.0.0.1:1/a/", "1"],
     ["name the same server", "learns which pages"]),
    # case 8: a raw file that ends inside a page
    (["build", "--raw", "ragged.bin", "--out", "snap"], ["--raw ragged.bin", "8292 bytes",
                                                         "--pad-last-page"]),
    (["serve", "--matrix", "ragged.bin"], ["--matrix ragged.bin", "--pad-last-page"]),
]


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[" ".join(c[0][:3]) for c in CASES])
def test_bad_input_is_one_line_and_exit_2(files: Path, argv: list[str],
                                          expected: list[str]) -> None:
    _refused(argv, files, *expected)
    assert not [p for p in files.iterdir() if p.name in ("s3:", "gs:")]


def test_build_uploads_to_an_object_store_uri(files: Path, s3_bucket: str, monkeypatch,
                                             capsys) -> None:
    monkeypatch.chdir(files)
    uri = f"s3://{s3_bucket}/snap"
    assert main(["build", "--synthetic", "4", "--out", uri, "--work-dir", "work"]) == 0
    assert capsys.readouterr().out.startswith(f"snapshot {uri}: 4 pages")
    assert not [p for p in files.iterdir() if p.name in ("s3:", "gs:")]
    assert list((files / "work").iterdir()) == []
    with open_any(uri, cache_dir=files / "cache") as snap:
        assert snap.num_pages == 4


def test_a_url_without_scheme_is_not_retried(files: Path) -> None:
    started = time.monotonic()
    _refused(["get", "--server-a", "localhost:8000/a", "--server-b", "localhost:8000/b", "1"],
             files, "needs http://")
    assert time.monotonic() - started < 20  # the interpreter's start, no retry backoff


def test_an_unreachable_server_is_named(files: Path, capsys) -> None:
    port = free_port()
    rc = main(["get", "--server-a", f"http://127.0.0.1:{port}/a",
               "--server-b", f"http://127.0.0.1:{port}/b", "--timeout", "2", "1"])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"cannot reach http://127.0.0.1:{port}/" in err and "ConnectError" in err
    assert "check that both parties are serving" in err


def test_a_ragged_raw_file_is_built_when_asked(files: Path, capsys) -> None:
    assert main(["build", "--raw", str(files / "ragged.bin"), "--out", str(files / "snap"),
                 "--pad-last-page"]) == 0
    assert "snapshot" in capsys.readouterr().out and (files / "snap" / "manifest.json").is_file()
    # an existing snapshot: --force is the fix, and named
    assert main(["build", "--raw", str(files / "ragged.bin"), "--out", str(files / "snap"),
                 "--pad-last-page"]) == 2
    assert "(--force overwrites)" in capsys.readouterr().err


def test_unexpected_errors_are_one_line_unless_debug(monkeypatch, capsys) -> None:
    import cluster.cli as cli

    def boom(_args) -> int:
        raise RuntimeError("first line\nsecond line")

    monkeypatch.setattr(cli, "cmd_build", boom)
    argv = ["build", "--synthetic", "1", "--out", "x"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.strip() == ("error: RuntimeError: first line second line (--debug shows the "
                           "traceback)")
    assert cli.main(["--debug", *argv]) == 1
    assert "Traceback" in capsys.readouterr().err
    assert cli.main([*argv, "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err
