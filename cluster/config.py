"""Configuration of one party's server, validated once when the application is built.

`PartyConfig` is what `ray_config.yaml` passes as `args` to `deployments.app:build_app`, what
`morphogen serve` builds from its flags, and what every replica receives (already validated).
Documented environment overrides: `MORPHOGEN_CACHE_DIR` (where synthetic snapshots are built).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from morphogen.codec import KEYS_PER_QUERY, MAX_BATCH_QUERIES, max_body_bytes

EngineName = Literal["auto", "reference", "cpu", "gpu"]
Placement = Literal["auto", "cpu", "gpu"]


def default_cache_dir() -> Path:
    env = os.environ.get("MORPHOGEN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "morphogen"


class PartyConfig(BaseModel):
    """One party (server A or B): its snapshot, its shards and its router."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # -- data: a snapshot path, or (when None) a synthetic snapshot built once in the cache.
    snapshot: str | None = Field(
        None, description="manifest .json, snapshot directory or raw page file"
    )
    synthetic_pages: int = Field(4096, ge=1, le=1 << 32, description="pages when synthetic")
    synthetic_seed: int = Field(0, ge=0)
    synthetic_epoch: int = Field(1, ge=0)
    cache_dir: str | None = Field(None, description="default: $MORPHOGEN_CACHE_DIR or ~/.cache")
    verify_snapshot: bool = Field(False, description="checksum the data at shard start")

    # -- shards
    num_shards: int = Field(2, ge=1, le=4096)
    shard_replicas: int = Field(1, ge=1, le=1024, description="copies of each shard")
    engine: EngineName = "auto"
    placement: Placement = Field(
        "auto", description="gpu: one GPU per shard replica; auto: gpu when the engine is gpu"
    )
    shard_num_cpus: float = Field(0.5, ge=0, description="CPU slots per shard replica")
    shard_threads: int = Field(1, ge=1, le=64, description="concurrent scans per replica")
    shard_max_ongoing_requests: int = Field(16, ge=1)
    engine_options: dict[str, Any] = Field(default_factory=dict)
    warm_up: bool = Field(True, description="compile CPU kernels once before shards start")

    # -- router
    router_replicas: int = Field(1, ge=1, le=1024)
    router_num_cpus: float = Field(0.25, ge=0)
    router_max_ongoing_requests: int = Field(256, ge=1)
    router_max_queued_requests: int = Field(
        1024, ge=-1, description="requests queued past this are shed with 503 (-1: no limit)"
    )
    coalesce_window_ms: float = Field(2.0, ge=0, le=1000, description="0 turns coalescing off")
    coalesce_max_queries: int = Field(32, ge=1, le=4096, description="queries per merged scan")
    coalesce_max_in_flight: int = Field(2, ge=1, le=256, description="merged scans at once")
    max_batch_queries: int = Field(MAX_BATCH_QUERIES, ge=1, le=1024)
    max_body_bytes: int | None = Field(None, ge=1024, description="default: from the batch cap")

    # -- consistency and failure handling
    scan_attempts: int = Field(3, ge=1, le=20, description="fan-outs before answering 503")
    retry_backoff_ms: float = Field(50.0, ge=0)
    retry_after_s: int = Field(1, ge=0, description="Retry-After of a 503")
    shard_timeout_s: float = Field(60.0, gt=0)

    # -- Serve lifecycle
    health_check_period_s: float = Field(10.0, gt=0)
    health_check_timeout_s: float = Field(30.0, gt=0)
    graceful_shutdown_timeout_s: float = Field(5.0, ge=0)
    access_log: bool = Field(False, description="Serve access log lines (never contain keys)")

    # -- advertised metadata (GET /epoch), reference fields without meaning for page PIR
    block_number: int = Field(0, ge=0)
    seeds: tuple[int, int, int] = (0, 0, 0)
    rows_per_page: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _check(self) -> PartyConfig:
        if self.snapshot is None and self.synthetic_pages < self.num_shards:
            raise ValueError(
                f"{self.num_shards} shards for {self.synthetic_pages} pages: "
                "every shard needs at least one page"
            )
        return self

    # -- derived values

    @property
    def coalesce_window_s(self) -> float:
        return self.coalesce_window_ms / 1000.0

    @property
    def coalesce_max_keys(self) -> int:
        return self.coalesce_max_queries * KEYS_PER_QUERY

    def body_limit(self, domain_bits: int) -> int:
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        return max_body_bytes(domain_bits, self.max_batch_queries)

    def cache_path(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_dir()

    def wants_gpu(self, cluster_gpus: float = 0.0) -> bool:
        """Whether shard replicas ask Ray for a GPU each."""
        if self.placement == "gpu":
            return True
        if self.placement == "cpu":
            return False
        if self.engine == "gpu":
            return True
        return self.engine == "auto" and cluster_gpus >= 1


def shard_actor_options(cfg: PartyConfig, cluster_gpus: float = 0.0) -> dict[str, Any]:
    """Ray actor options of one shard replica: one whole GPU per replica on GPU placement (one
    GPU actor per device), fractional CPU slots otherwise."""
    if cfg.wants_gpu(cluster_gpus):
        return {"num_gpus": 1, "num_cpus": cfg.shard_num_cpus}
    return {"num_cpus": cfg.shard_num_cpus}


def resolved_engine(cfg: PartyConfig, gpu_placed: bool) -> str:
    """Engine a shard creates: `auto` becomes `gpu` on GPU placement (the shard then fails
    loudly if CuPy or the device is missing) and stays `auto` (engine's own choice) otherwise."""
    if cfg.engine == "auto" and gpu_placed:
        return "gpu"
    return cfg.engine
