"""GPU placement checked with logical GPUs and the CPU engine: one GPU per shard replica."""

from __future__ import annotations

import pytest

from morphogen.client import PirClient

from .conftest import LOGICAL_GPUS, deploy

pytestmark = pytest.mark.ray


def test_one_gpu_per_shard_replica(parties, pages) -> None:
    from ray import serve

    deploy(parties, "g", num_shards=LOGICAL_GPUS, placement="gpu", engine="cpu")
    infos = [
        serve.get_deployment_handle(f"shard_{i}", app_name="g").info.remote().result()
        for i in range(LOGICAL_GPUS)
    ]
    gpu_ids = [tuple(i["gpu_ids"]) for i in infos]
    assert all(len(ids) == 1 for ids in gpu_ids)
    assert len(set(gpu_ids)) == LOGICAL_GPUS  # each replica its own device
    assert all(i["engine"] == "cpu" for i in infos)
    with PirClient(parties.app_url("g"), parties.app_url("a")) as c:
        assert c.get([0, 100, 639]) == [pages[p].tobytes() for p in (0, 100, 639)]
    serve.delete("g")


def test_cpu_shards_hold_no_gpu(parties) -> None:
    from ray import serve

    info = serve.get_deployment_handle("shard_0", app_name="a").info.remote().result()
    assert info["gpu_ids"] == []
