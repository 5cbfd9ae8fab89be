"""Every `morphogen` command line in the README and the book (docs/) parses against the CLI, so
that a renamed flag or command breaks this test, not a reader's copy of the recipe.

The shell code of the Markdown files is read (fenced blocks of shell or of no language, and
indented blocks): lines joined where they continue (a trailing backslash, an open quote),
here-documents skipped, each line cut into simple commands at `;`, `&`, `|`, `&&`, `||`,
parentheses and reserved words (`until`, `do`, ...), and every simple command that is
`morphogen ...` (after any `VAR=value` prefixes; redirections dropped) is parsed by the real
parser, `cluster.cli.build_parser()`, without running anything. Placeholders stand for values
the reader fills in: `<name>`, a shell variable (`$block`, `"$REPO/x"`), an elision (`0x..`,
`...`) or a name in capitals (`N`, `URL_A`); only those skip the conversion of an option's
value (an integer, a choice), every other word is parsed as the CLI would parse it."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
SHELL_LANGUAGES = {"", "sh", "bash", "shell", "console", "zsh"}
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
# Words that start a compound command or prefix a simple one: what follows is the command.
PREFIXES = {"!", "{", "}", "if", "then", "else", "elif", "do", "while", "until", "time",
            "exec", "nohup", "fi", "done"}
REDIRECTS = {"<", ">", ">>", ">&", "<&", "&>", "&>>", ">|", "<>"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
ANGLE = re.compile(r"<([A-Za-z][A-Za-z0-9_.:/-]*)>")
ANGLE_MARK = "__placeholder_"
DESCRIPTOR = re.compile(r"(^|(?<=\s))\d+(?=[<>])")  # the 2 of 2>&1
PLACEHOLDER = re.compile(rf"{ANGLE_MARK}|\$|\.\.|^[A-Z][A-Z0-9_]*$")


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.where}: morphogen {shlex.join(self.argv)}"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def code_blocks(text: str) -> Iterator[tuple[int, list[str]]]:
    """(first line number, lines) of each block of shell code: fenced blocks whose language is
    a shell or none, and indented blocks (4 spaces or more after a blank line)."""
    lines = text.splitlines()
    i, after_blank = 0, True
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence:
            indent, mark, language = fence.groups()
            body, j = [], i + 1
            while j < len(lines) and not lines[j].strip().startswith(mark):
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
                j += 1
            if language.lower() in SHELL_LANGUAGES:
                yield i + 2, body
            i, after_blank = j + 1, False
            continue
        if after_blank and line.strip() and _indent(line) >= 4:
            j = i
            while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) >= 4):
                j += 1
            while j > i and not lines[j - 1].strip():
                j -= 1
            body = lines[i:j]
            cut = min(_indent(b) for b in body if b.strip())
            yield i + 1, [b[cut:] for b in body]
            i, after_blank = j, False
            continue
        after_blank = not line.strip()
        i += 1


def _words(line: str) -> list[str] | None:
    """The shell words and operators of one logical line; None while a quote is open."""
    line = DESCRIPTOR.sub("", ANGLE.sub(rf"{ANGLE_MARK}\1", line))
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:
        return None


def logical_lines(first: int, body: list[str]) -> Iterator[tuple[int, list[str] | None, str]]:
    """(line number, words or None if they cannot be read, text) of each logical line."""
    i = 0
    while i < len(body):
        start, text = i, body[i]
        heredoc = HEREDOC.search(text)
        while True:
            continued = text.endswith("\\")
            words = None if continued else _words(text)
            if words is not None or i + 1 >= len(body):
                break
            i += 1
            text = (text[:-1] if continued else text + "\n") + body[i]
        if words is None and i > start:  # an open quote to the end: read line by line
            i = start
            text, words = body[i], _words(body[i])
        yield first + start, words, text
        i += 1
        if heredoc:
            while i < len(body) and body[i].strip() != heredoc.group(2):
                i += 1
            i += 1


def simple_commands(words: list[str]) -> Iterator[list[str]]:
    """The simple commands of a line's words, redirections and their targets dropped."""
    command: list[str] = []
    skip_target = False
    for word in words:
        if skip_target:
            skip_target = False
        elif word in REDIRECTS or (word[0] in "<>" and set(word) <= set("<>&|")):
            skip_target = True
        elif set(word) <= set(";&|()"):
            if command:
                yield command
            command = []
        elif not command and (word in PREFIXES or ASSIGNMENT.match(word)):
            continue
        else:
            command.append(word)
    if command:
        yield command


def commands_in(text: str, name: str) -> tuple[list[Command], list[str]]:
    """The `morphogen` commands of a Markdown text, and the lines naming `morphogen` that could
    not be read as shell."""
    found, unreadable = [], []
    for first, body in code_blocks(text):
        for number, words, line in logical_lines(first, body):
            if words is None:
                if re.search(r"(^|[\s;&|(])morphogen\s", line):
                    unreadable.append(f"{name}:{number}: {line.strip()}")
                continue
            for command in simple_commands(words):
                if command[0] == "morphogen":
                    found.append(Command(f"{name}:{number}", tuple(command[1:])))
    return found, unreadable


def _tolerant(action: argparse.Action):
    convert = action.type

    def value(text: str):
        if PLACEHOLDER.search(text):
            return action.choices[0] if action.choices else text
        return convert(text) if callable(convert) else text

    value.__name__ = getattr(convert, "__name__", "str")
    return value


def _parser() -> argparse.ArgumentParser:
    """The CLI's parser, each option's conversion letting placeholders through, and no option
    abbreviated (a flag renamed to a longer one would still take the old name as a prefix)."""
    parser = build_parser()

    def walk(p: argparse.ArgumentParser) -> None:
        p.allow_abbrev = False
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in dict.fromkeys(action.choices.values()):
                    walk(sub)
            elif action.type is not None or action.choices is not None:
                if isinstance(action.choices, dict):  # not the subcommands: listed above
                    continue
                action.choices = list(action.choices) if action.choices is not None else None
                action.type = _tolerant(action)

    walk(parser)
    return parser


def parse_error(parser: argparse.ArgumentParser, command: Command) -> str | None:
    """Why the CLI would refuse the command line, or None when it parses."""
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            parser.parse_args(list(command.argv))
    except SystemExit as exc:
        if exc.code not in (0, None):  # --help and --version exit 0
            return err.getvalue().strip().splitlines()[-1] if err.getvalue() else str(exc)
    return None


def _documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_every_documented_command_parses() -> None:
    parser = _parser()
    failures, total, per_file = [], 0, {}
    for path in _documents():
        name = path.relative_to(REPO).as_posix()
        found, unreadable = commands_in(path.read_text(), name)
        failures += [f"{line}: not readable as shell" for line in unreadable]
        for command in found:
            why = parse_error(parser, command)
            if why:
                failures.append(f"{command}\n    {why}")
        per_file[name] = len(found)
        total += len(found)
    assert not failures, "documented commands the CLI refuses:\n" + "\n".join(failures)
    # not vacuous: the README's and the book's recipes are all read
    assert total > 40, per_file
    assert per_file["README.md"] >= 2, per_file
    assert "morphogen demo" in (REPO / "README.md").read_text()


DOC = """\
Some prose naming `morphogen serve --bogus` inline (not a command line).

```sh
FOO=1 morphogen serve --parties a,b --shards 1 --matrix snap \\
    --port 8000 > serve.log 2>&1 &
until curl -sf http://127.0.0.1:8000/b/health; do sleep 1; done
until morphogen lookup --server-a http://a --server-b http://b --public-key owner.pub \\
    --min-block "$block" 0x<address>; do sleep 1; done
python - <<'EOF'
morphogen serve --this-is-python-not-shell
EOF
morphogen build --synthetic N --out snap   # a comment's "quote
```

```text
morphogen serve --output-is-not-checked
```

    morphogen get --server-a http://a --server-b http://b 17 4242
"""


def test_the_reader_finds_commands_through_the_shell() -> None:
    found, unreadable = commands_in(DOC, "doc.md")
    assert unreadable == []
    assert [c.where for c in found] == ["doc.md:4", "doc.md:7", "doc.md:12", "doc.md:19"]
    assert found[0].argv == ("serve", "--parties", "a,b", "--shards", "1", "--matrix", "snap",
                             "--port", "8000")
    assert found[1].argv[-3:] == ("--min-block", "$block", f"0x{ANGLE_MARK}address")
    assert found[2].argv == ("build", "--synthetic", "N", "--out", "snap")
    parser = _parser()
    assert [parse_error(parser, c) for c in found] == [None] * 4


@pytest.mark.parametrize("line, message", [
    ("morphogen serve --matrix snap --no-such-flag", "unrecognized arguments: --no-such-flag"),
    ("morphogen serve --shard-cpu 0.25", "unrecognized arguments: --shard-cpu"),
    ("morphogen sevre --matrix snap", "invalid choice: 'sevre'"),
    ("morphogen get --server-a http://a --server-b http://b seventeen", "invalid int value"),
    ("morphogen serve --shards 0", "--shards"),
    ("morphogen serve --engine gpus", "invalid choice: 'gpus'"),
    ("morphogen lookup --public-key owner.pub 0x11", "required"),
])
def test_a_wrong_command_fails_naming_file_and_line(line: str, message: str) -> None:
    found, _ = commands_in(f"Text.\n\n```sh\necho start\n{line}\n```\n", "bad.md")
    (command,) = found
    assert str(command).startswith("bad.md:5: morphogen ")
    why = parse_error(_parser(), command)
    assert why is not None and message in why, why
