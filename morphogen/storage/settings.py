"""How long and how hard this process's object-store requests try: one `StoreSettings` per
process, set once at start (a replica, a router, the CLI) from the party's config.

The defaults are sized for two failures an operator meets:
- a hung store (it accepts connections and never answers): every request ends after
  `timeout_s`, is retried while `retry_s` has not passed since the first try, and so fails
  after two tries, 40 s: well within a minute, where the store's library default is six;
- a store down for a while (refused connections, 5xx): a request fails after `retry_s` of
  retries, and the callers that start a party (opening a snapshot, fetching its chunks, reading
  the log at a replica's start) try again until `outage_s` has passed since the first failure,
  so a first deploy rides out an outage of a minute and more.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from typing import Any

ENV_PREFIX = "MORPHOGEN_STORE_"


@dataclass(frozen=True)
class StoreSettings:
    timeout_s: float = 20.0  # one request, from connecting to its last byte
    connect_timeout_s: float = 5.0
    retry_s: float = 30.0  # the store library's retries of one request end after this
    max_retries: int = 10
    outage_s: float = 90.0  # how long starting a party waits for an unreachable store
    concurrency: int = 8  # ranged GETs in flight per chunk fetch

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"store setting {f.name} must be a finite number >= 0, "
                                 f"not {value!r}")
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0 or self.concurrency < 1:
            raise ValueError("store timeouts must be > 0 and concurrency >= 1")

    def hung_failure_s(self) -> float:
        """The longest a request to a hung store takes to fail: tries of `timeout_s` each,
        started while `retry_s` has not passed (backoff aside)."""
        tries = min(self.max_retries + 1, max(1, math.ceil(self.retry_s / self.timeout_s)))
        return tries * self.timeout_s

    def client_options(self) -> dict[str, Any]:
        return {"timeout": timedelta(seconds=self.timeout_s),
                "connect_timeout": timedelta(seconds=self.connect_timeout_s)}

    def retry_config(self) -> dict[str, Any]:
        return {"max_retries": int(self.max_retries),
                "retry_timeout": timedelta(seconds=self.retry_s)}

    @classmethod
    def from_env(cls, base: StoreSettings | None = None) -> StoreSettings:
        """`base` (the defaults) with any ``MORPHOGEN_STORE_<FIELD>`` variable applied, so a
        command that has no party config (build, push) can be tuned too."""
        base = base or cls()
        changes: dict[str, Any] = {}
        for f in fields(cls):
            text = os.environ.get(ENV_PREFIX + f.name.upper())
            if text is None or not text.strip():
                continue
            try:
                changes[f.name] = int(text) if f.type in ("int", int) else float(text)
            except ValueError:
                raise ValueError(f"${ENV_PREFIX}{f.name.upper()}={text!r}: not a number") from None
        return replace(base, **changes)


_current = StoreSettings.from_env()


def configure(settings: StoreSettings) -> None:
    """Use `settings` for the stores this process opens from now on."""
    global _current
    _current = settings


def current() -> StoreSettings:
    return _current
