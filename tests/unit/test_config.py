"""Party configuration: validation, derived limits, placement."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from morphogen.config import PartyConfig, resolved_engine, shard_actor_options
from morphogen.protocol.codec import max_body_bytes
from morphogen.snapshot.source import ensure_synthetic, open_snapshot


def test_defaults_are_valid_and_frozen() -> None:
    cfg = PartyConfig()
    assert cfg.num_shards == 2 and cfg.snapshot is None
    assert cfg.coalesce_max_keys == 96
    assert cfg.body_limit(25) == max_body_bytes(25, 32)
    with pytest.raises(ValidationError):
        cfg.num_shards = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "bad",
    [
        {"num_shards": 0},
        {"engine": "tpu"},
        {"placement": "fpga"},
        {"coalesce_window_ms": -1},
        {"shard_num_cpus": -0.5},
        {"unknown_field": 1},
        {"synthetic_pages": 2, "num_shards": 3},
        {"max_body_bytes": 10},
    ],
)
def test_invalid_configs_refused(bad: dict) -> None:
    with pytest.raises(ValidationError):
        PartyConfig(**bad)


def test_cpu_placement_is_fractional_cpus() -> None:
    cfg = PartyConfig(engine="cpu", shard_num_cpus=0.25)
    assert shard_actor_options(cfg, cluster_gpus=8) == {"num_cpus": 0.25}
    assert resolved_engine(cfg, False) == "cpu"


def test_gpu_engine_gets_one_gpu_per_replica() -> None:
    cfg = PartyConfig(engine="gpu")
    assert shard_actor_options(cfg, cluster_gpus=0)["num_gpus"] == 1
    assert resolved_engine(cfg, True) == "gpu"


def test_auto_follows_the_cluster() -> None:
    cfg = PartyConfig(engine="auto")
    assert "num_gpus" not in shard_actor_options(cfg, cluster_gpus=0)
    assert shard_actor_options(cfg, cluster_gpus=4)["num_gpus"] == 1
    assert resolved_engine(cfg, True) == "gpu"
    assert resolved_engine(cfg, False) == "auto"


def test_explicit_placement_overrides() -> None:
    assert shard_actor_options(PartyConfig(engine="cpu", placement="gpu"))["num_gpus"] == 1
    assert "num_gpus" not in shard_actor_options(PartyConfig(engine="gpu", placement="cpu"))


def test_synthetic_snapshot_built_once(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MORPHOGEN_CACHE_DIR", str(tmp_path))
    cfg = PartyConfig(synthetic_pages=40, synthetic_seed=3)
    first = ensure_synthetic(cfg)
    mtime = (first / "pages.bin").stat().st_mtime_ns
    assert ensure_synthetic(cfg) == first
    assert (first / "pages.bin").stat().st_mtime_ns == mtime
    with open_snapshot(cfg) as snap:
        assert snap.num_pages == 40 and snap.domain_bits == 6


def test_admin_settings() -> None:
    from morphogen.protocol.codec import admin_body_bytes

    cfg = PartyConfig()
    assert cfg.admin_token_file is None and cfg.admin_token_env == "MORPHOGEN_ADMIN_TOKEN"
    assert cfg.admin_snapshot_dir is None and not cfg.admin_supported
    assert cfg.admin_body_limit() == admin_body_bytes(1024)
    assert PartyConfig(admin_max_body_bytes=4096).admin_body_limit() == 4096
    # what a party reports as the largest batch: the count cap, or what its body cap holds
    assert cfg.admin_updates_cap() == 1024
    small = PartyConfig(admin_max_body_bytes=admin_body_bytes(100))
    assert 80 <= small.admin_updates_cap() <= 100
    assert admin_body_bytes(small.admin_updates_cap()) <= small.admin_body_limit()
    # publication ids must outlive a router replica (and replicas catch up from the log):
    # admin needs a log, whatever the replica counts (issue 28, hole 1)
    for more in ({}, {"shard_replicas": 2}, {"router_replicas": 2},
                 {"shard_autoscaling": {"min_replicas": 1, "max_replicas": 4},
                  "placement": "gpu"}):
        with pytest.raises(ValidationError, match="need epoch_log_dir.*applied twice"):
            PartyConfig(admin_token_file="/run/secrets/t", **more)
        assert not PartyConfig(admin_token_env=None, **more).admin_supported
        assert PartyConfig(admin_token_file="/run/secrets/t", epoch_log_dir="/shared/log-a",
                           **more).admin_supported


def test_autoscaling_options() -> None:
    from morphogen.config import ROUTER_AUTOSCALING_POLICY, router_scaling, shard_scaling

    cfg = PartyConfig()
    assert shard_scaling(cfg) == {"num_replicas": 1} and router_scaling(cfg) == {
        "num_replicas": 1}
    cfg = PartyConfig(
        coalesce_max_in_flight=3, coalesce_max_queries=16,
        shard_autoscaling={"min_replicas": 1, "max_replicas": 4, "upscale_delay_s": 2},
        placement="cpu",
        router_autoscaling={"max_replicas": 3, "target": 8, "initial_replicas": 2},
    )
    shard = shard_scaling(cfg)["autoscaling_config"]
    assert shard["max_replicas"] == 4 and shard["upscale_delay_s"] == 2
    assert shard["target_ongoing_requests"] == 3.0  # one router replica's scans in flight
    assert "policy" not in shard  # Serve's default: ongoing requests
    router = router_scaling(cfg)["autoscaling_config"]
    assert router["target_ongoing_requests"] == 8 and router["initial_replicas"] == 2
    assert router["policy"] == {"policy_function": ROUTER_AUTOSCALING_POLICY}
    with pytest.raises(ValidationError, match="max_replicas 1 < min_replicas 2"):
        PartyConfig(shard_autoscaling={"min_replicas": 2, "max_replicas": 1}, placement="gpu")
    with pytest.raises(ValidationError, match="initial_replicas"):
        PartyConfig(router_autoscaling={"max_replicas": 2, "initial_replicas": 3})
    # Serve accepts what we build, and imports the policy by its path
    from ray.serve.config import AutoscalingConfig

    parsed = AutoscalingConfig(**router)
    assert parsed.policy.get_policy() is not None


def test_router_policy_sizes_routers_by_the_queries_they_hold() -> None:
    from types import SimpleNamespace

    from morphogen.party.autoscaling import HELD_QUERIES, router_policy

    def ctx(held: dict, current: int = 2) -> SimpleNamespace:
        config = SimpleNamespace(get_target_ongoing_requests=lambda: 32.0)
        return SimpleNamespace(current_num_replicas=current, target_num_replicas=current,
                               aggregated_metrics={HELD_QUERIES: held}, config=config)

    assert router_policy(ctx({"r1": 64.0, "r2": 96.0}))[0] == 5.0  # 160 queries / 32
    assert router_policy(ctx({"r1": 0.0, "r2": 0.0}))[0] == 0.0  # Serve clamps to min
    assert router_policy(ctx({}))[0] == 2.0  # nothing reported yet: stay


def test_grafana_dashboard_charts_every_emitted_metric() -> None:
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    board = json.loads((root / "deployments" / "grafana_dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in board["panels"] for t in p["targets"])
    emitted = set(re.findall(r'"(morphogen_[a-z_]+)"', (root / "deployments" /
                                                          "metrics.py").read_text()))
    charted = {m for m in emitted if f"ray_{m}" in exprs}
    assert emitted and charted == emitted, emitted - charted


def test_autoscaled_shards_need_an_explicit_placement() -> None:
    scaled = {"min_replicas": 1, "max_replicas": 4}
    with pytest.raises(ValidationError, match="shard_autoscaling needs an explicit placement"):
        PartyConfig(shard_autoscaling=scaled)
    assert shard_actor_options(PartyConfig(shard_autoscaling=scaled, placement="gpu"),
                               cluster_gpus=0)["num_gpus"] == 1  # asks even from zero GPUs
    assert "num_gpus" not in shard_actor_options(
        PartyConfig(shard_autoscaling=scaled, placement="cpu"))
    assert PartyConfig(shard_autoscaling=scaled, engine="gpu").wants_gpu(0)


def test_gpu_cluster_placement_options_reach_the_shards() -> None:
    from ray.serve import deployment

    from morphogen.config import shard_scaling

    cfg = PartyConfig(placement="gpu", shard_accelerator_type="H100",
                      shard_resources={"pir_pool": 1}, shard_max_replicas_per_node=2,
                      shard_label_selector={"ray.io/accelerator-type": "H100"},
                      shard_runtime_env={"env_vars": {"MORPHOGEN_GPU_KERNEL": "sliced"}},
                      shard_replicas=4)
    opts = shard_actor_options(cfg, cluster_gpus=0)
    assert opts == {"num_cpus": 0.5, "num_gpus": 1, "accelerator_type": "H100",
                    "resources": {"pir_pool": 1}, "label_selector": {
                        "ray.io/accelerator-type": "H100"},
                    "runtime_env": {"env_vars": {"MORPHOGEN_GPU_KERNEL": "sliced"}}}
    assert shard_scaling(cfg) == {"num_replicas": 4, "max_replicas_per_node": 2}

    # Serve takes them as they are
    @deployment
    class Probe:
        pass

    Probe.options(ray_actor_options=opts, **shard_scaling(cfg))
