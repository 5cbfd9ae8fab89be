"""The router's Serve autoscaling policy: replicas from the queries the routers hold.

Serve's default policy scales a deployment on its ongoing requests. For the shards that signal
saturates: each router replica keeps at most `coalesce_max_in_flight` merged scans in flight, so
a shard sees that many requests per router replica however many queries wait behind them. The
offered load is visible at the routers instead: every query waiting in a coalescer or being
scanned. Router replicas record that count (`record_autoscaling_stats`), this policy sizes the
router deployment from it, and the shards follow on Serve's default policy, since every added
router replica adds merged scans in flight.

Serve's wrapper applies min/max replicas and the upscale/downscale delays to what this returns.
"""

from __future__ import annotations

from typing import Any

# The custom autoscaling metric a router replica records.
HELD_QUERIES = "held_queries"


def desired_routers(held: dict[Any, float], current: int, target: float) -> float:
    """Router replicas for `held` queries (per replica, averaged over the look-back window) at
    `target` queries per replica; the current count while no replica has reported yet."""
    if not held:
        return float(current)
    return sum(held.values()) / target


def router_policy(ctx: Any) -> tuple[float, dict[str, Any]]:
    """Serve policy function (`AutoscalingContext` -> desired replicas, policy state)."""
    if ctx.current_num_replicas == 0:
        return float(ctx.target_num_replicas), {}
    metrics = ctx.aggregated_metrics or {}
    target = float(ctx.config.get_target_ongoing_requests())
    return desired_routers(metrics.get(HELD_QUERIES, {}), ctx.current_num_replicas, target), {}
