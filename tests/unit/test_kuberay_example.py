"""The KubeRay example deploys what PartyConfig accepts, with the placement and storage a GPU
cluster needs (validated here: no Kubernetes needed)."""

from __future__ import annotations

from pathlib import Path

import yaml

from morphogen.config import PartyConfig, shard_actor_options, shard_scaling

EXAMPLE = Path(__file__).parents[2] / "deployments" / "kuberay" / "rayservice.yaml"


def test_every_application_of_the_example_is_a_valid_party() -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    assert doc["kind"] == "RayService"
    serve_config = yaml.safe_load(doc["spec"]["serveConfigV2"])
    apps = serve_config["applications"]
    assert apps and all(a["import_path"] == "deployments.app:build_app" for a in apps)
    for app in apps:
        cfg = PartyConfig.model_validate(app["args"])
        # nothing on a shared disk: snapshot, rotations and log in object storage
        for uri in (cfg.snapshot, cfg.admin_snapshot_dir, cfg.epoch_log_dir):
            assert uri.startswith("s3://"), uri
        # shards ask for a GPU even when none is up yet: the autoscaler adds GPU pods
        opts = shard_actor_options(cfg, cluster_gpus=0)
        assert opts["num_gpus"] == 1 and opts["accelerator_type"] == "H100"
        assert shard_scaling(cfg)["max_replicas_per_node"] == 1
        assert cfg.admin_token_env == "MORPHOGEN_ADMIN_TOKEN" and cfg.admin_supported


def test_the_gpu_group_scales_from_zero_and_carries_the_cache_volume() -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    cluster = doc["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    (gpu,) = cluster["workerGroupSpecs"]
    assert gpu["minReplicas"] == 0 and gpu["rayStartParams"]["num-gpus"] == "1"
    container = gpu["template"]["spec"]["containers"][0]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    app = yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"][0]["args"]
    assert any(app["snapshot_cache_dir"].startswith(m) for m in mounts)
    env = {e["name"] for e in container["env"]}
    assert "MORPHOGEN_ADMIN_TOKEN" in env
