"""CORS on a party's query routes, for clients that run in a web page (clients/js).

A page's script may read another origin's answers only where that origin says so. A party says
so for the origins of its configuration's `cors_origins` (`*`: any), on the routes a client
reads (GET /epoch, the two query POSTs), and nowhere else: the admin routes never carry a CORS
header, so no page, whatever its origin, can make a browser publish with an operator's
credentials. An origin not listed gets no CORS header at all (the browser then hides the answer
from the page) and its preflight is refused.

A query's body is JSON or msgpack, neither a CORS-simple content type, so every browser query
is preceded by a preflight (OPTIONS): answered here with the method and the two headers the
client sends, and cached by the browser for PREFLIGHT_MAX_AGE_S. Retry-After is exposed: the
client waits as a 429 or 503 tells it to, and a browser hides that header otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from morphogen.protocol.codec import BATCH_PATH, EPOCH_PATH, QUERY_PATH

# the routes a client reads, and the method of each
CORS_ROUTES = {EPOCH_PATH: "GET", QUERY_PATH: "POST", BATCH_PATH: "POST"}
ALLOWED_HEADERS = "Content-Type, Accept"
EXPOSED_HEADERS = "Retry-After"
PREFLIGHT_MAX_AGE_S = 600
# scheme://host[:port], as a browser sends Origin: no path, no trailing slash
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s?#]+", re.IGNORECASE)


def check_origins(origins: Iterable[str]) -> tuple[str, ...]:
    """The configured origins, each `*` or scheme://host[:port]; ValueError names a bad one."""
    out = []
    for o in origins:
        if o != "*" and not _ORIGIN.fullmatch(o):
            raise ValueError(f"cors origin {o[:80]!r} is not '*' or scheme://host[:port] (as a "
                             "browser sends it: no path, no trailing slash)")
        out.append(o)
    return tuple(out)


class Cors:
    """The CORS headers of a party's answers, from its configured origins."""

    def __init__(self, origins: Iterable[str] = ()) -> None:
        self.origins = frozenset(check_origins(origins))

    def allowed(self, path: str, origin: str | None) -> str | None:
        """The Access-Control-Allow-Origin value for a request of `origin` on `path`, or None
        (no CORS header): a route a client does not read, or an origin not listed."""
        if origin is None or path not in CORS_ROUTES or not self.origins:
            return None
        if "*" in self.origins:
            return "*"
        return origin if origin in self.origins else None

    def headers(self, path: str, origin: str | None) -> dict[str, str]:
        """Headers added to an answer on `path` (errors included: a page reads why it was
        refused)."""
        if path not in CORS_ROUTES or not self.origins:
            return {}
        # the answer differs by origin where origins are listed: a cache must not give one
        # origin's answer to another
        out = {} if "*" in self.origins else {"Vary": "Origin"}
        allow = self.allowed(path, origin)
        if allow is not None:
            out["Access-Control-Allow-Origin"] = allow
            out["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
        return out

    def preflight(self, path: str, headers: Mapping[str, str]) -> dict[str, str] | None:
        """The headers of a 204 answering an OPTIONS preflight, or None where it is refused
        (not a route a client reads, an origin not listed, or another method)."""
        allow = self.allowed(path, headers.get("origin"))
        wanted = headers.get("access-control-request-method")
        if allow is None or wanted is None:
            return None
        method = CORS_ROUTES[path]
        if wanted != method and not (method == "GET" and wanted == "HEAD"):
            return None
        return {**self.headers(path, headers.get("origin")),
                "Access-Control-Allow-Methods": f"{method}, OPTIONS",
                "Access-Control-Allow-Headers": ALLOWED_HEADERS,
                "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S)}
