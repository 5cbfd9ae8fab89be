"""Error reports that keep their cause but never carry request data.

A 500 must be debuggable (where it failed, through which calls) yet a log line must never hold
a key or a page: exception messages of lower layers can quote their arguments. So a report
keeps every frame and every exception type of the chain, and drops the messages, except those
of exception types that this project raises with messages it writes itself.
"""

from __future__ import annotations

import traceback

# Exceptions whose messages this project composes from numbers and names only.
_SAFE_MESSAGE_MODULES = ("morphogen.", "cluster.", "deployments.")


def _message_is_safe(exc: BaseException) -> bool:
    module = type(exc).__module__ or ""
    return module.startswith(_SAFE_MESSAGE_MODULES)


def redacted_traceback(exc: BaseException) -> str:
    """The traceback of `exc` and its causes, with messages withheld unless they are ours."""
    lines: list[str] = []
    seen: set[int] = set()
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        chain.append(cur)
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    for i, e in enumerate(reversed(chain)):
        if i:
            lines.append("\nwhich led to:\n")
        lines.append("Traceback (most recent call last):\n")
        lines.extend(traceback.format_list(traceback.extract_tb(e.__traceback__)))
        name = f"{type(e).__module__}.{type(e).__qualname__}"
        text = str(e) if _message_is_safe(e) else "(message withheld: it may quote request data)"
        lines.append(f"{name}: {text}\n")
    return "".join(lines)


def reason(exc: BaseException) -> str:
    """One line for a log: the type, and the message when it is ours."""
    name = type(exc).__name__
    return f"{name}: {exc}" if _message_is_safe(exc) else name
