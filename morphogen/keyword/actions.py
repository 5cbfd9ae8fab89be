"""What the keyword lookup logic asks of a page client: the actions it yields.

The logic (lookup.py) is a generator (`Machine`) of these actions, each a call it wants made of
the page client: the servers' info (`Info`), pages of one table (`Get`) or of several at once
(`GetAll`), or the caller's trusted bounds (`BOUND`). A driver performs each and sends the
answer back in, or throws the page client's `LookupError` in. Two drivers do (client.py): a
blocking one and an asyncio one, so both clients run the one logic, which itself does no I/O.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

Machine = Generator[Any, Any, Any]


@dataclass(frozen=True)
class Info:
    """Wanted: the page client's `ServerInfo` (read from both parties when `refresh`)."""

    refresh: bool


@dataclass(frozen=True)
class Get:
    """Wanted: `get_pinned(pages, num_pages, table=table)`, or the `LookupError` it raised
    thrown back in. `table` None is the whole matrix."""

    pages: list[int]
    num_pages: int
    table: str | None = None


@dataclass(frozen=True)
class GetAll:
    """Wanted: every `Get` of the list (at once where the driver can), answers in order;
    the first `LookupError` thrown back in."""

    gets: list[Get]


BOUND = object()  # wanted: the caller's trusted (version, block), each None when not given


def step(machine: Machine, reply: Any, failure: BaseException | None) -> tuple[bool, Any]:
    """The machine run on to its next action with `reply` sent in (or `failure` thrown in):
    (False, the action), or (True, its result) where it finished."""
    try:
        return False, machine.send(reply) if failure is None else machine.throw(failure)
    except StopIteration as done:
        return True, done.value
