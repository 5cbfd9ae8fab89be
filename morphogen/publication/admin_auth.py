"""Bearer-token check for the admin routes.

The token comes from a secret file or an environment variable named in the configuration,
read once. No token configured means the admin routes are off (403); a missing or wrong token
is 401. The comparison takes the same time wherever the first differing byte is, and the token
itself never reaches a log line, an error message or a repr.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path


class AdminAccess(Enum):
    GRANTED = "granted"
    DISABLED = "disabled"  # no token configured: 403
    DENIED = "denied"  # missing or wrong token: 401


class AdminTokenError(ValueError):
    """The configured token source cannot be read or holds no usable token."""


@dataclass(frozen=True)
class AdminGuard:
    _token: bytes | None = field(default=None, repr=False)
    problem: str | None = None  # why no token is configured on this node, for the 403

    @property
    def enabled(self) -> bool:
        return self._token is not None

    @classmethod
    def from_sources(
        cls, token_file: str | None = None, token_env: str | None = None
    ) -> AdminGuard:
        """The token from `token_file` (first) or the variable `token_env`; none = disabled."""
        token: str | None = None
        if token_file:
            try:
                token = Path(token_file).expanduser().read_text().strip()
            except OSError as e:
                raise AdminTokenError(f"cannot read the admin token file {token_file}: {e}") from e
            if not token:
                raise AdminTokenError(f"the admin token file {token_file} is empty")
        elif token_env:
            token = os.environ.get(token_env, "").strip() or None
        if token is not None and len(token) < 16:
            raise AdminTokenError("an admin token must be at least 16 characters")
        return cls(token.encode() if token is not None else None)

    def check(self, authorization: str | None) -> AdminAccess:
        """Judge an HTTP `Authorization` header value."""
        if self._token is None:
            return AdminAccess.DISABLED
        if not authorization:
            return AdminAccess.DENIED
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return AdminAccess.DENIED
        ok = hmac.compare_digest(presented.strip().encode(), self._token)
        return AdminAccess.GRANTED if ok else AdminAccess.DENIED


class WatchedAdminGuard:
    """A router's guard: never fails the router's start, follows a rotated secret.

    A token source that this node cannot read (a secret not mounted here, an unset variable)
    leaves the admin routes answering 403 with where the token was looked for, while queries
    are served as ever. A token file (a mounted Kubernetes secret, say) is read again when it
    changes, so rotating the secret needs no restart.
    """

    def __init__(self, token_file: str | None, token_env: str | None) -> None:
        self._file, self._env = token_file, token_env
        self._stamp: tuple[int, int] | None = None
        self._guard = self._load()

    def _where(self) -> str:
        if self._file:
            return f"the file {self._file}"
        return f"the variable {self._env}" if self._env else "no token source configured"

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = Path(self._file).expanduser().stat() if self._file else None
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_ino) if st else None

    def _load(self) -> AdminGuard:
        self._stamp = self._file_stamp()
        try:
            guard = AdminGuard.from_sources(self._file, self._env)
        except AdminTokenError as exc:
            return AdminGuard(None, f"{exc}")
        if not guard.enabled and (self._file or self._env):
            return AdminGuard(None, f"no admin token in {self._where()} on this node")
        return guard

    @property
    def enabled(self) -> bool:
        return self._guard.enabled

    @property
    def problem(self) -> str | None:
        return self._guard.problem

    def check(self, authorization: str | None) -> AdminAccess:
        if self._file and self._file_stamp() != self._stamp:
            self._guard = self._load()
        return self._guard.check(authorization)
