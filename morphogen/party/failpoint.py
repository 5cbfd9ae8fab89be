"""Fault injection for the crash tests: a publisher awaits a `Pause` at each step boundary
with the step's name (docs/publication.md, section 4)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

Pause = Callable[[str], Awaitable[None]]


class FileFailpoint:
    """A one-shot failpoint armed by a file (the crash tests on a real Serve): when `path`
    holds a step name, the publisher that reaches that step deletes the file, writes its pid
    to `path + ".fired"` and stops there for good, as a router killed at that step would."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def __call__(self, step: str) -> None:
        try:
            with open(self.path) as fh:
                armed = fh.read().strip()
        except OSError:
            return
        if armed != step:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return  # another publisher took it
        with open(self.path + ".fired", "w") as fh:
            fh.write(str(os.getpid()))
        log.warning("failpoint: publisher stopped at step %s", step)
        await asyncio.Event().wait()
