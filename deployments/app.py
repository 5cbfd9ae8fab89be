"""The Serve application builder named by `ray_config.yaml` (`deployments.app:build_app`).

One application is one party: a router (the ingress) bound to one deployment per shard
(`shard_0` ... `shard_{n-1}`). The configuration is validated once here; a synthetic snapshot is
built (once, cached) before any replica starts so that replicas only map it. Applications are
named after their route (`deployments.naming`); `build_index_app` answers the paths between
them.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray
from ray.serve import Application

from deployments.index import Index
from deployments.router import Router
from deployments.shard import Shard
from morphogen.config import (
    ADMIN_NEEDS_LOG,
    PartyConfig,
    resolved_engine,
    router_scaling,
    shard_actor_options,
    shard_scaling,
)
from morphogen.party.shard import warm_up
from morphogen.publication.log import EpochLog
from morphogen.snapshot.layout import shard_ranges
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.source import open_snapshot
from morphogen.storage.failures import ride_out
from morphogen.storage.location import is_remote
from morphogen.storage.settings import configure

log = logging.getLogger(__name__)


def _cluster_gpus() -> float:
    if not ray.is_initialized():
        return 0.0
    return float(ray.cluster_resources().get("GPU", 0.0))


def _warm_up(snap: Snapshot, engine: str, cfg: PartyConfig) -> None:
    """Compile a jitted engine's kernels here, once, into its on-disk cache: shards starting
    together on a cold cache would otherwise each compile them, all at once (minutes on two
    cores). Only an optimisation: a failure is logged and the shards compile for themselves."""
    try:
        warm_up(snap, engine, cfg.engine_options)
    except Exception as exc:  # noqa: BLE001
        log.warning("engine warm-up skipped: %s", exc)


def build_app(args: PartyConfig) -> Application:
    """Build one party's application from `args` (a dict or a PartyConfig)."""
    cfg = args if isinstance(args, PartyConfig) else PartyConfig.model_validate(args or {})
    if not cfg.admin_supported and cfg.admin_token_env and os.environ.get(cfg.admin_token_env):
        raise ValueError(f"{cfg.admin_token_env} is set: {ADMIN_NEEDS_LOG}")
    configure(cfg.store_settings())
    if cfg.epoch_log_dir and cfg.epoch_log_id is None:
        # made here, once, and named: every router and shard replica checks that its node
        # sees this very log, not an empty directory of the same path (a first deploy waits
        # out a store that is down for a while)
        log_id = ride_out(lambda: EpochLog(cfg.epoch_log_dir, create=True).log_id,
                          f"the epoch log {cfg.epoch_log_dir}")
        cfg = cfg.model_copy(update={"epoch_log_id": log_id})
    gpus = _cluster_gpus()
    placed_on_gpu = cfg.wants_gpu(gpus)
    if placed_on_gpu and ray.is_initialized() and gpus < 1:
        log.warning("shards ask for one GPU each but the cluster has none (yet)")
    engine = resolved_engine(cfg, placed_on_gpu)
    snap = open_snapshot(cfg, progress=False)
    try:
        # Refuses more shards than pages before any replica is scheduled.
        shard_ranges(snap.num_pages, cfg.num_shards)
        # a remote snapshot is only its manifest here: no pages fetched onto the builder's node
        if cfg.warm_up and not placed_on_gpu and not is_remote(cfg.snapshot or ""):
            _warm_up(snap, engine, cfg)
    finally:
        snap.close()
    common: dict[str, Any] = {
        "graceful_shutdown_timeout_s": cfg.graceful_shutdown_timeout_s,
        "graceful_shutdown_wait_loop_s": min(2.0, max(0.1, cfg.graceful_shutdown_timeout_s)),
        "health_check_period_s": cfg.health_check_period_s,
        "health_check_timeout_s": cfg.health_check_timeout_s,
        "logging_config": {"enable_access_log": cfg.access_log},
    }
    shards = [
        Shard.options(
            name=f"shard_{i}",
            **shard_scaling(cfg),
            ray_actor_options=shard_actor_options(cfg, gpus),
            max_ongoing_requests=cfg.shard_max_ongoing_requests,
            **common,
        ).bind(cfg, i, engine)
        for i in range(cfg.num_shards)
    ]
    return Router.options(
        name="router",
        **router_scaling(cfg),
        ray_actor_options={"num_cpus": cfg.router_num_cpus},
        max_ongoing_requests=cfg.router_max_ongoing_requests,
        max_queued_requests=cfg.router_max_queued_requests,
        **common,
    ).bind(cfg, *shards)


def build_index_app(routes: dict[str, str]) -> Application:
    """The application (deployed as `deployments.naming.INDEX_APP_NAME`, at `/`) answering
    JSON 404s for the paths no party of `routes` ({name: route prefix}) serves."""
    return Index.bind(dict(routes))
