"""An object store's failure as one line an operator can read.

obstore's messages carry the request, the server's whole XML (or JSON) error body and then a
multi-line debug dump of the client's retry state: the first line says what failed, and the
body's code and message say why. The rest would take a screen per error.
"""

from __future__ import annotations

import re

from morphogen.storage.location import StorageError

_CODE = re.compile(r"<Code>([^<]*)</Code>")
_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")
_ELAPSED = re.compile(r" in [0-9.]+(?:ns|µs|us|ms|s)\b")
_LONGEST = 400


def short_reason(exc: BaseException) -> str:
    """What `exc` says, on one line: its first line, the server's error code and message in
    place of the response body, no timings."""
    text = str(exc)
    first = text.split("\n", 1)[0]
    first = first.split("<?xml", 1)[0].split("<Error>", 1)[0].rstrip(" :")
    first = _ELAPSED.sub("", first)
    code, message = _CODE.search(text), _MESSAGE.search(text)
    if code:
        first += f" ({code.group(1)}" + (f": {message.group(1)})" if message else ")")
    if len(first) > _LONGEST:
        first = first[:_LONGEST] + "..."
    return first or type(exc).__name__


def store_failure(uri: str, doing: str, exc: BaseException) -> StorageError:
    """A StorageError naming the URI, what was being done there, and why it failed."""
    return StorageError(f"{uri}: {doing}: {short_reason(exc)}")
