"""Names and routes of the applications on a cluster's Serve (no Ray import: the command line
checks them before it starts anything).

One application is one party. Its name is what Serve keys applications by: deploying under a
name that exists replaces that application, so every party needs a name of its own. By default
the name follows the route (`/b` -> `b`); the party at `/` is `morphogen`, as in
`ray_config.yaml`.
"""

from __future__ import annotations

import re

DEFAULT_APP_NAME = "morphogen"
# JSON 404s for paths no party serves, deployed at `/` beside parties at other routes
INDEX_APP_NAME = "morphogen-index"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_PREFIX = re.compile(r"/|(/[A-Za-z0-9_.~-]+)+")


def check_route_prefix(prefix: str) -> str:
    """`prefix` when Serve takes it as a route (`/`, or `/` + path segments, no trailing `/`)."""
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"route prefix {prefix!r} must be / or /name (letters, digits, "
                         "_ . ~ -, segments separated by /, no trailing /)")
    return prefix


def check_app_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"application name {name!r} must be 1-63 letters, digits, _ . - "
                         "(starting with a letter or digit)")
    if name == INDEX_APP_NAME:
        raise ValueError(f"application name {name!r} is reserved")
    return name


def app_name(route_prefix: str) -> str:
    """The default application name of the party at `route_prefix`."""
    check_route_prefix(route_prefix)
    if route_prefix == "/":
        return DEFAULT_APP_NAME
    return route_prefix.strip("/").replace("/", "-")
