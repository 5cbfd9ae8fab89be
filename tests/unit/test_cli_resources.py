"""Case 2: what the parties ask Ray for, against what the cluster can give, with the numbers and
the flag that fixes it when they do not fit."""

from __future__ import annotations

import pytest

from cluster.errors import UsageError
from cluster.resources import Capacity, PartyDemand, check
from morphogen.config import PartyConfig


def _demand(name: str = "a", **fields) -> PartyDemand:
    return PartyDemand.of(name, PartyConfig(synthetic_pages=64, **fields), cluster_gpus=0)


def test_the_readme_example_on_two_cores_does_not_fit() -> None:
    d = _demand("morphogen", num_shards=4)
    assert d.cpus == 2.25 and d.gpus == 0
    with pytest.raises(UsageError) as exc:
        check([d], Capacity({"CPU": 2.0}), owns=True)
    msg = str(exc.value)
    assert "asks Ray for 2.25 CPUs (morphogen: 4 shards x 0.5 + router 0.25 = 2.25)" in msg
    assert "the cluster has 2 free" in msg
    assert "--shard-cpus 0.40 fits" in msg and "--num-cpus N" in msg
    # the fix it names does fit
    check([_demand("morphogen", num_shards=4, shard_num_cpus=0.4)], Capacity({"CPU": 2.0}),
          owns=True)


def test_two_default_parties_on_two_cores() -> None:
    parties = [_demand("a"), _demand("b")]
    with pytest.raises(UsageError, match=r"the parties ask Ray for 2.5 CPUs \(a: .*; b: .*"
                                         r"--shard-cpus 0.35 fits"):
        check(parties, Capacity({"CPU": 2.0}), owns=True)
    check([_demand("a", shard_num_cpus=0.25), _demand("b", shard_num_cpus=0.25)],
          Capacity({"CPU": 2.0}), owns=True)


def test_replicas_and_autoscaling_count_what_starts() -> None:
    d = _demand(num_shards=2, shard_replicas=3, router_replicas=2)
    assert (d.shard_count, d.cpus) == (6, 6 * 0.5 + 2 * 0.25)
    scaled = _demand(num_shards=2, shard_autoscaling={"min_replicas": 2, "max_replicas": 8},
                     router_autoscaling={"min_replicas": 1, "max_replicas": 4},
                     placement="cpu")
    assert scaled.shard_count == 4
    assert "2 shards x 2 replicas x 0.5" in scaled.describe()


def test_an_autoscaler_may_add_what_is_missing() -> None:
    d = _demand(num_shards=8)  # 4.25 CPUs
    check([d], Capacity({"CPU": 1.0}, addable={"CPU": 4.0}), owns=False)
    with pytest.raises(UsageError, match="1 free \\+ 2 the autoscaler may add: .*a larger "
                                         "cluster"):
        check([d], Capacity({"CPU": 1.0}, addable={"CPU": 2.0}), owns=False)


def test_gpus_one_per_shard_replica() -> None:
    d = PartyDemand.of("g", PartyConfig(synthetic_pages=64, num_shards=3, placement="gpu"), 0)
    assert d.gpus == 3
    with pytest.raises(UsageError, match="3 GPU\\(s\\), one per shard replica, and the cluster "
                                         "can give 1: fewer --shards, or --engine cpu"):
        check([d], Capacity({"CPU": 8.0, "GPU": 1.0}), owns=True)


def test_a_replica_larger_than_any_node() -> None:
    d = _demand(num_shards=1, shard_num_cpus=3)
    with pytest.raises(UsageError, match="one shard replica asks for 3 CPUs and the largest node "
                                         "has 2: lower --shard-cpus"):
        check([d], Capacity({"CPU": 8.0}, largest_node={"CPU": 2.0}), owns=False)


def test_the_check_before_ray_starts_leaves_gpus_to_the_one_after() -> None:
    # before a local cluster starts, Ray has not counted its GPUs: only the CPUs are checked
    gpu_party = PartyDemand.of("a", PartyConfig(synthetic_pages=64, placement="gpu"), 0)
    check([gpu_party], Capacity({"CPU": 2.0}), owns=True, gpus=False)
    with pytest.raises(UsageError, match="GPU"):
        check([gpu_party], Capacity({"CPU": 2.0}), owns=True)
    with pytest.raises(UsageError, match="2.25 CPUs"):
        check([_demand("a", num_shards=4)], Capacity({"CPU": 2.0}), owns=True, gpus=False)
