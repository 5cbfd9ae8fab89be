"""What a party and its shards report to metrics, without Ray: one small interface.

`deployments/metrics.py` implements it with `ray.serve.metrics` (Prometheus through Ray's
metrics agent); tests and library users get `NullObserver`. Arguments are counts, durations,
route names, error codes and shard numbers only: a key, a page or a page number never reaches
an observer, so none can reach a label.
"""

from __future__ import annotations

from typing import Protocol


class Observer(Protocol):
    def request(self, route: str, status: int, seconds: float, queries: int) -> None:
        """One HTTP or handle request ended (`queries` answered, 0 on an error)."""

    def coalesced(self, keys: int) -> None:
        """One merged fan-out of `keys` keys left the router."""

    def scan(self, shard: int, keys: int, pages: int, phases: dict[str, float]) -> None:
        """A shard scanned `pages` pages for `keys` keys; seconds by phase."""

    def epoch(self, shard: int, epoch_id: int, pending_updates: int) -> None:
        """The epoch a shard serves now and the updates not yet folded into its pages."""

    def caught_up(self, shard: int, entries: int, seconds: float | None) -> None:
        """A shard replayed `entries` epoch-log entries (at start or to catch up) in
        `seconds`; None: the last replay reported again."""


class NullObserver:
    def request(self, route: str, status: int, seconds: float, queries: int) -> None:
        pass

    def coalesced(self, keys: int) -> None:
        pass

    def scan(self, shard: int, keys: int, pages: int, phases: dict[str, float]) -> None:
        pass

    def epoch(self, shard: int, epoch_id: int, pending_updates: int) -> None:
        pass

    def caught_up(self, shard: int, entries: int, seconds: float | None) -> None:
        pass
