"""How the command line fails: one line that names the input and the fix, never a traceback
unless `--debug` asks for one."""

from __future__ import annotations

import traceback
from typing import Any

from cluster.report import eprint


class UsageError(ValueError):
    """An input or setting that cannot work (a missing file, a bad URL, a cluster too small for
    the shards asked for). Exit status 2, like argparse's own errors, and never retried: running
    the same command again gives the same answer."""

    exit_code = 2


class CommandFailed(RuntimeError):
    """A well-formed command that did not succeed (a server unreachable or refusing). Exit
    status 1."""

    exit_code = 1


def one_line(text: object) -> str:
    """`text` on one line: messages of lower layers (pydantic, Ray) span several."""
    return " ".join(str(text).split())


def validation_problem(exc: Any, source: str) -> str:
    """A pydantic ValidationError as one line: each field and what is wrong with it."""
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ())) or "value"
        problems.append(f"{where}: {err.get('msg', 'invalid')}")
    return f"{source}: " + "; ".join(problems)


def report(exc: BaseException, debug: bool) -> int:
    """Print `exc` for the operator and return the exit status."""
    if debug:
        traceback.print_exception(exc)
    if isinstance(exc, UsageError | CommandFailed):
        eprint(f"error: {one_line(exc)}")
        return exc.exit_code
    hint = "" if debug else " (--debug shows the traceback)"
    eprint(f"error: {type(exc).__name__}: {one_line(exc)}{hint}")
    return 1
