"""Case 10: every command and option is described in `--help`, the commands that take files
or URLs show examples, the updates file format is spelled out, and `--version` answers."""

from __future__ import annotations

import argparse

import pytest

from cluster.cli import build_parser, main


def _parsers() -> dict[str, argparse.ArgumentParser]:
    out = {}

    def walk(prefix: str, parser: argparse.ArgumentParser) -> None:
        out[prefix] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(f"{prefix} {name}".strip(), sub)

    walk("", build_parser())
    return out


def test_every_option_and_argument_is_described() -> None:
    undescribed = []
    for name, parser in _parsers().items():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                undescribed.append(f"{name or 'morphogen'} {action.dest}")
    assert undescribed == []


def test_help_shows_examples_and_the_updates_format(capsys) -> None:
    for command in (["serve"], ["get"], ["build"], ["admin"], ["snapshot", "push"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        assert "examples:\n  morphogen " + command[0] in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["admin", "updates", "--help"])
    assert '{"updates": [{"page": 5, "diff": "0x<hex>"}' in capsys.readouterr().out


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("morphogen ") and len(out.split()) == 2


def test_serve_has_flags_for_what_admin_needs() -> None:
    args = build_parser().parse_args(
        ["serve", "--admin-token-file", "t", "--admin-snapshot-dir", "d", "--epoch-log", "l"])
    assert (args.admin_token_file, args.admin_snapshot_dir, args.epoch_log) == ("t", "d", "l")
