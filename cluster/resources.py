"""Whether the parties about to be deployed fit the cluster, checked before deploying.

Ray places a replica only where its CPU (and GPU) slots are free; a replica that fits nowhere
waits forever, and Serve says so only in its logs, after half a minute. So `serve` adds up what
the shard and router replicas ask for, compares it with what the cluster has free (plus what its
autoscaler may still add), and refuses at once with the numbers and the flag that fixes it.
Ray's CPU slots are a placement budget, not a limit: a replica at 0.25 CPU scans with as many
threads as at 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from cluster.errors import UsageError
from morphogen.config import Autoscaling, PartyConfig

EPS = 1e-9


def _initial(replicas: int, scaling: Autoscaling | None) -> int:
    if scaling is None:
        return replicas
    return scaling.initial_replicas or scaling.min_replicas


def _num(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class PartyDemand:
    """What one party's replicas ask Ray for when it starts."""

    name: str
    num_shards: int
    shard_replicas: int  # per shard
    shard_cpus: float
    shard_gpus: float
    router_replicas: int
    router_cpus: float

    @classmethod
    def of(cls, name: str, cfg: PartyConfig, cluster_gpus: float) -> PartyDemand:
        return cls(name, cfg.num_shards, _initial(cfg.shard_replicas, cfg.shard_autoscaling),
                   cfg.shard_num_cpus, 1.0 if cfg.wants_gpu(cluster_gpus) else 0.0,
                   _initial(cfg.router_replicas, cfg.router_autoscaling), cfg.router_num_cpus)

    @property
    def shard_count(self) -> int:
        return self.num_shards * self.shard_replicas

    @property
    def router_total(self) -> float:
        return self.router_replicas * self.router_cpus

    @property
    def cpus(self) -> float:
        return self.shard_count * self.shard_cpus + self.router_total

    @property
    def gpus(self) -> float:
        return self.shard_count * self.shard_gpus

    def describe(self) -> str:
        copies = "" if self.shard_replicas == 1 else f" x {self.shard_replicas} replicas"
        routers = "" if self.router_replicas == 1 else f"{self.router_replicas} x "
        return (f"{self.name}: {self.num_shards} shards{copies} x {_num(self.shard_cpus)} + "
                f"router {routers}{_num(self.router_cpus)} = {_num(round(self.cpus, 4))}")


@dataclass(frozen=True)
class Capacity:
    """What the cluster can still give: free now, plus what its autoscaler may add."""

    free: dict[str, float]
    addable: dict[str, float] = field(default_factory=dict)
    largest_node: dict[str, float] = field(default_factory=dict)

    def can_give(self, resource: str) -> float:
        return self.free.get(resource, 0.0) + self.addable.get(resource, 0.0)

    @classmethod
    def of_cluster(cls) -> Capacity:
        """The connected cluster's, from Ray's view and its autoscaler's configuration."""
        import ray

        free = {k: float(v) for k, v in ray.available_resources().items()}
        total = {k: float(v) for k, v in ray.cluster_resources().items()}
        largest: dict[str, float] = {}
        for node in ray.nodes():
            if node.get("Alive"):
                for k in ("CPU", "GPU"):
                    largest[k] = max(largest.get(k, 0.0), float(node["Resources"].get(k, 0)))
        addable: dict[str, float] = {}
        for k, most, node_most in _autoscaler_limits():
            addable[k] = max(0.0, most - total.get(k, 0.0))
            largest[k] = max(largest.get(k, 0.0), node_most)
        return cls(free, addable, largest)


def _autoscaler_limits() -> list[tuple[str, float, float]]:
    """(resource, most the autoscaler may bring the cluster to, largest node type) for CPU and
    GPU; empty without an autoscaler."""
    try:
        from ray._private.state import state

        config = state.get_cluster_config()
        most = state.get_max_resources_from_cluster_config() or {}
    except Exception:  # noqa: BLE001 - an internal API: no autoscaler information then
        return []
    if config is None:
        return []
    out = []
    for k in ("CPU", "GPU"):
        node_most = max((float(g.resources.get(k, 0)) for g in config.node_group_configs),
                        default=0.0)
        if k in most:
            out.append((k, float(most[k]), node_most))
    return out


def _cpu_fix(demands: Sequence[PartyDemand], can_give: float, owns: bool) -> str:
    shards = sum(d.shard_count for d in demands)
    routers = sum(d.router_total for d in demands)
    fixes = []
    room = can_give - routers
    if shards and room > 0:
        step = 0.05 if room / shards >= 0.05 else 0.01
        fit = math.floor(room / shards / step + EPS) * step
        if fit >= 0.01:
            fixes.append(f"--shard-cpus {fit:.2f} fits")
    else:
        fixes.append("lower --router-cpus")
    fixes.append("fewer --shards")
    fixes.append("more CPUs (--num-cpus N)" if owns else "a larger cluster")
    return ", or ".join(fixes)


def check(demands: Sequence[PartyDemand], cap: Capacity, *, owns: bool,
          gpus: bool = True) -> None:
    """UsageError when `demands` cannot all be placed on the cluster (`gpus=False`: their
    CPUs only)."""
    what = "; ".join(d.describe() for d in demands)
    cpus = sum(d.cpus for d in demands)
    want_gpus = sum(d.gpus for d in demands)
    later = " (--skip-resource-check deploys anyway, for nodes about to join)"
    if gpus and want_gpus > cap.can_give("GPU") + EPS:
        raise UsageError(
            f"the shards ask for {_num(want_gpus)} GPU(s), one per shard replica, and the cluster "
            f"can give {_num(cap.can_give('GPU'))}: fewer --shards, or --engine cpu{later}"
        )
    if cpus > cap.can_give("CPU") + EPS:
        added = cap.addable.get("CPU", 0.0)
        have = (f"{_num(cap.free.get('CPU', 0.0))} free"
                + (f" + {_num(added)} the autoscaler may add" if added else ""))
        who = "the parties ask" if len(demands) > 1 else "the party asks"
        raise UsageError(
            f"{who} Ray for {_num(round(cpus, 4))} CPUs ({what}) and the cluster has "
            f"{have}: {_cpu_fix(demands, cap.can_give('CPU'), owns)}{later}"
        )
    for d in demands:
        for kind, need in (("shard", d.shard_cpus), ("router", d.router_cpus)):
            node = cap.largest_node.get("CPU", math.inf)
            if need > node + EPS:
                flag = "--shard-cpus" if kind == "shard" else "--router-cpus"
                raise UsageError(
                    f"party {d.name}: one {kind} replica asks for {_num(need)} CPUs and the "
                    f"largest node has {_num(node)}: lower {flag}{later}"
                )
