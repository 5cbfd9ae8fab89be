"""The KubeRay example deploys what PartyConfig accepts, with the placement, storage, scaling
bounds and secrets a GPU cluster needs (validated here: no Kubernetes needed). The resources
are read the way Ray reads them: the RayCluster spec through the KubeRay autoscaler's own
translation, a shard's request through Ray's own conversion of its actor options."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from morphogen.config import PartyConfig, shard_actor_options, shard_scaling

REPO = Path(__file__).parents[2]
EXAMPLE = REPO / "deployments" / "kuberay" / "rayservice.yaml"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by NVIDIA's GPU feature discovery


def _doc() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def _party(doc: dict[str, Any]) -> PartyConfig:
    (app,) = yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"]
    return PartyConfig.model_validate(app["args"])


def _pods(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    cluster = doc["spec"]["rayClusterConfig"]
    yield "head", cluster["headGroupSpec"]["template"]["spec"]
    for group in cluster["workerGroupSpecs"]:
        yield group["groupName"], group["template"]["spec"]


def _gpu_group(doc: dict[str, Any]) -> dict[str, Any]:
    (gpu,) = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return gpu


def test_every_application_of_the_example_is_a_valid_party() -> None:
    doc = _doc()
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


def test_every_pod_mounts_a_cache_its_user_can_write() -> None:
    """The head too: the application builder opens the snapshot there, which creates the
    cache directory. The Ray image's user is not root, so the volume must be made writable
    for it: fsGroup where Kubernetes applies it, a root initContainer's chown on a hostPath
    (which fsGroup leaves alone)."""
    doc = _doc()
    cache = Path(_party(doc).snapshot_cache_dir)
    for name, pod in _pods(doc):
        ctx = pod.get("securityContext", {})
        uid = ctx.get("runAsUser")
        assert ctx.get("runAsNonRoot") is True and uid not in (None, 0), name
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            mounts = [m for m in container.get("volumeMounts", [])
                      if cache.is_relative_to(m["mountPath"])]
            assert mounts, f"{name}/{container['name']}: nothing mounted above {cache}"
            mount = max(mounts, key=lambda m: len(m["mountPath"]))
            assert mount["mountPath"] == str(cache.parent), name
            assert not mount.get("readOnly", False), name
            volume = volumes[mount["name"]]
            if "hostPath" in volume:
                chowns = [
                    c for c in pod.get("initContainers", [])
                    if c.get("securityContext", {}).get("runAsUser") == 0
                    and any(m["name"] == mount["name"] for m in c.get("volumeMounts", []))
                    and re.search(rf"\bchown\b.*\b{uid}\b", " ".join(
                        c.get("command", []) + c.get("args", [])))
                ]
                assert chowns, f"{name}: a hostPath cache nobody chowns to uid {uid}"
            else:
                assert set(volume) & {"emptyDir", "ephemeral", "persistentVolumeClaim"}, name
                assert ctx.get("fsGroup") is not None, f"{name}: cache volume without fsGroup"
                assert ctx["fsGroup"] == ctx.get("runAsGroup", ctx["fsGroup"]), name


def test_the_gpu_group_selects_the_gpu_shard_accelerator_type_names() -> None:
    """The node selector, the resource the group declares to the autoscaler and what the
    shards ask for name one GPU. The product label is the NVML device name with spaces made
    dashes, which Ray maps to the accelerator type it detects on the node."""
    from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

    doc = _doc()
    cfg = _party(doc)
    gpu = _gpu_group(doc)
    product = gpu["template"]["spec"]["nodeSelector"][GPU_PRODUCT_LABEL]
    detected = NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(
        product.replace("-", " "))
    assert detected == cfg.shard_accelerator_type, product
    declared = json.loads(gpu["rayStartParams"]["resources"][1:-1].replace("\\", ""))
    assert declared == {f"accelerator_type:{cfg.shard_accelerator_type}": 1}
    # the head has no GPU and no toleration for GPU nodes: it stays off them
    head = doc["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert not head["template"]["spec"].get("tolerations")


def test_the_gpu_group_lets_every_shard_reach_its_max_replicas() -> None:
    """Read as the autoscaler reads it: a GPU pod holds as many shard replicas as its
    resources fit, at most shard_max_replicas_per_node of one shard; the group's maxReplicas
    must hold every shard at its max_replicas at once, or scale-up stops short of it."""
    from ray._common.utils import resources_from_ray_options
    from ray.autoscaler._private.kuberay.autoscaling_config import (
        _derive_autoscaling_config_from_ray_cr,
    )

    doc = _doc()
    cfg = _party(doc)
    ray_cluster = {"metadata": {"name": doc["metadata"]["name"], "namespace": "default"},
                   "spec": doc["spec"]["rayClusterConfig"]}
    node_types = _derive_autoscaling_config_from_ray_cr(ray_cluster)["available_node_types"]
    gpu = _gpu_group(doc)
    node = node_types[gpu["groupName"]]
    assert node["min_workers"] == 0 and gpu["replicas"] == 0  # no idle GPU pods

    demand = resources_from_ray_options(shard_actor_options(cfg, cluster_gpus=0))
    fits = min(math.floor(node["resources"].get(r, 0) / q) for r, q in demand.items() if q)
    assert fits >= 1, (demand, node["resources"])
    assert not all(node_types["headgroup"]["resources"].get(r, 0) >= q
                   for r, q in demand.items()), "a shard replica fits on the head"
    assert cfg.shard_autoscaling is not None
    most = cfg.shard_autoscaling.max_replicas
    per_node = min(fits, cfg.shard_max_replicas_per_node or fits)
    pods = max(math.ceil(cfg.num_shards * most / fits), math.ceil(most / per_node))
    assert node["max_workers"] >= pods, (
        f"{cfg.num_shards} shards x {most} replicas need {pods} GPU pods, "
        f"the group allows {node['max_workers']}")


def test_the_routers_fit_on_the_head() -> None:
    """A router that finds no CPU would make the autoscaler add a GPU pod for it."""
    from ray.autoscaler._private.kuberay.autoscaling_config import (
        _derive_autoscaling_config_from_ray_cr,
    )

    doc = _doc()
    cfg = _party(doc)
    ray_cluster = {"metadata": {"name": doc["metadata"]["name"], "namespace": "default"},
                   "spec": doc["spec"]["rayClusterConfig"]}
    head = _derive_autoscaling_config_from_ray_cr(ray_cluster)["available_node_types"][
        "headgroup"]
    routers = cfg.router_autoscaling.max_replicas if cfg.router_autoscaling else \
        cfg.router_replicas
    assert head["resources"]["CPU"] >= routers * cfg.router_num_cpus, (
        f"{routers} routers x {cfg.router_num_cpus} CPU on a head of {head['resources']['CPU']}")


def test_every_container_runs_one_built_image() -> None:
    doc = _doc()
    images = {c["image"] for _, pod in _pods(doc)
              for c in pod.get("initContainers", []) + pod["containers"]}
    assert len(images) == 1, images
    (image,) = images
    assert not image.startswith("ghcr.io/example"), image
    assert re.fullmatch(r"[\w.-]+(:\d+)?(/[\w.-]+)+:[\w.-]+", image), image  # a tagged name


def test_credentials_and_the_admin_token_come_from_secrets() -> None:
    """In every container (a router replica may run on any node), never as literal values;
    and the book's KubeRay steps (docs/operating.md) create every secret the manifest reads,
    with the keys it reads."""
    doc = _doc()
    cfg = _party(doc)
    referenced: dict[str, set[str]] = {}
    for name, pod in _pods(doc):
        for container in pod["containers"]:
            env = {e["name"]: e for e in container.get("env", [])}
            token = env[cfg.admin_token_env]["valueFrom"]["secretKeyRef"]
            referenced.setdefault(token["name"], set()).add(token["key"])
            for var, entry in env.items():
                if re.search(r"KEY|SECRET|TOKEN|PASSWORD", var):
                    assert "value" not in entry, f"{name}: {var} written into the manifest"
            refs = [s["secretRef"]["name"] for s in container.get("envFrom", [])
                    if "secretRef" in s]
            assert refs, f"{name}: no S3 credentials"
            for ref in refs:
                referenced.setdefault(ref, set())
    steps = (REPO / "docs" / "operating.md").read_text()
    for secret, keys in referenced.items():
        created = re.search(
            rf"kubectl create secret generic {re.escape(secret)}\b((?:\\\n|[^\n])*)", steps)
        assert created, f"docs/operating.md does not create the secret {secret}"
        for key in keys:
            assert f"--from-literal={key}=" in created.group(1), (secret, key)
