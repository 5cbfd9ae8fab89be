"""Prometheus metrics of a party through `ray.serve.metrics` (Ray's metrics agent exports them on
each node's metrics port; `deployments/grafana_dashboard.json` charts them).

The `morphogen.party.observe.Observer` of a router or shard replica. Serve adds the application,
deployment and replica tags itself; the tags here are route names, error statuses, shard
numbers and scan phases, a fixed small set: no key, page or page number ever becomes a label.
"""

from __future__ import annotations

from typing import Any

from ray.serve import metrics

_LATENCY_S = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
_KEYS = [3, 6, 12, 24, 48, 96, 192, 384]


class ServeMetrics:
    """Every metric this project emits; create one per replica (metrics live in the process
    that records them)."""

    def __init__(self) -> None:
        self.queries = metrics.Counter(
            "morphogen_queries", description="queries answered (3 keys each)", tag_keys=("route",))
        self.keys = metrics.Counter(
            "morphogen_keys", description="DPF keys answered", tag_keys=("route",))
        self.errors = metrics.Counter(
            "morphogen_errors", description="requests answered with an error, by status",
            tag_keys=("route", "status"))
        self.latency = metrics.Histogram(
            "morphogen_request_seconds", description="request latency at the router",
            boundaries=_LATENCY_S, tag_keys=("route",))
        self.batch = metrics.Histogram(
            "morphogen_coalesced_keys", description="keys per merged fan-out to the shards",
            boundaries=_KEYS)
        self.scan_s = metrics.Histogram(
            "morphogen_scan_seconds", description="shard scan time by phase (GPU: CUDA events)",
            boundaries=_LATENCY_S, tag_keys=("shard", "phase"))
        self.scanned = metrics.Counter(
            "morphogen_scanned_bytes", description="page bytes scanned (pages x 4096 per scan)",
            tag_keys=("shard",))
        self.epoch_id = metrics.Gauge(
            "morphogen_epoch", description="epoch id a shard serves", tag_keys=("shard",))
        self.pending = metrics.Gauge(
            "morphogen_pending_updates", description="page updates not yet folded into pages",
            tag_keys=("shard",))
        self.replayed = metrics.Gauge(
            "morphogen_catch_up_entries",
            description="epoch-log entries a shard replayed in its last catch-up (its lag)",
            tag_keys=("shard",))
        self.fetched = metrics.Counter(
            "morphogen_snapshot_fetched_bytes",
            description="snapshot bytes fetched from object storage and verified")
        self.fetch_left = metrics.Gauge(
            "morphogen_snapshot_fetch_remaining_bytes",
            description="bytes a replica's snapshot fetch still has to go")
        self.fetch_rate = metrics.Gauge(
            "morphogen_snapshot_fetch_bytes_per_second",
            description="rate of a replica's snapshot fetch so far")
        self.fetch_eta = metrics.Gauge(
            "morphogen_snapshot_fetch_seconds_left",
            description="time a replica's snapshot fetch still needs at its rate (-1: unknown)")
        self.starts = metrics.Gauge(
            "morphogen_replica_starts",
            description="shard replicas now fetching or that failed to start, by state (the "
            "reasons: admin status)", tag_keys=("shard", "state"))
        self.replay_s = metrics.Histogram(
            "morphogen_catch_up_seconds", description="time of a shard's epoch-log replay",
            boundaries=_LATENCY_S, tag_keys=("shard",))

    def snapshot_fetch(self, progress: Any) -> None:
        """A `morphogen.snapshot.chunk_cache.FetchProgress` after a chunk landed."""
        self.fetched.inc(progress.last)
        self.fetch_left.set(progress.total - progress.done)
        self.fetch_rate.set(progress.rate)
        left = progress.seconds_left
        self.fetch_eta.set(left if left is not None else -1)

    def replica_starts(self, counts: dict[tuple[str, str], int]) -> None:
        """Counts by (shard number, state) of the start board's unsettled entries."""
        for (shard, state), n in counts.items():
            self.starts.set(n, tags={"shard": shard, "state": state})

    def request(self, route: str, status: int, seconds: float, queries: int) -> None:
        tags = {"route": route}
        self.latency.observe(seconds, tags=tags)
        if status >= 400:
            self.errors.inc(tags={"route": route, "status": str(status)})
        elif queries:
            self.queries.inc(queries, tags=tags)
            self.keys.inc(3 * queries, tags=tags)

    def coalesced(self, keys: int) -> None:
        self.batch.observe(keys)

    def scan(self, shard: int, keys: int, pages: int, phases: dict[str, float]) -> None:
        for phase, seconds in phases.items():
            self.scan_s.observe(seconds, tags={"shard": str(shard), "phase": phase})
        self.scanned.inc(pages * 4096, tags={"shard": str(shard)})

    def epoch(self, shard: int, epoch_id: int, pending_updates: int) -> None:
        self.epoch_id.set(epoch_id, tags={"shard": str(shard)})
        self.pending.set(pending_updates, tags={"shard": str(shard)})

    def caught_up(self, shard: int, entries: int, seconds: float | None) -> None:
        self.replayed.set(entries, tags={"shard": str(shard)})
        if seconds is not None:  # None: the same replay, its gauge refreshed
            self.replay_s.observe(seconds, tags={"shard": str(shard)})
