"""Configuration of one party's server, validated once when the application is built.

`PartyConfig` is what `ray_config.yaml` passes as `args` to `deployments.app:build_app`, what
`morphogen serve` builds from its flags, and what every replica receives (already validated).
Documented environment variables: `MORPHOGEN_CACHE_DIR` (where synthetic snapshots are built)
and the admin token variable named by `admin_token_env` (default `MORPHOGEN_ADMIN_TOKEN`), read
by the router replicas when no `admin_token_file` is configured.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from morphogen.constants import KEYS_PER_QUERY, MAX_BATCH_QUERIES
from morphogen.protocol.codec import MAX_ADMIN_UPDATES, admin_body_bytes, max_body_bytes
from morphogen.protocol.cors import check_origins
from morphogen.storage.location import check_log_location
from morphogen.storage.settings import StoreSettings

DEFAULT_ADMIN_TOKEN_ENV = "MORPHOGEN_ADMIN_TOKEN"

EngineName = Literal["auto", "reference", "cpu", "gpu"]
# Serve's custom policy for the router: replicas from the queries its coalescers hold.
ROUTER_AUTOSCALING_POLICY = "morphogen.party.autoscaling:router_policy"
Placement = Literal["auto", "cpu", "gpu"]


def node_label() -> str:
    """This process's Ray node id where Ray runs (a replica), else the host name."""
    try:
        import ray

        if ray.is_initialized():
            # whole: the nodes of one machine (Ray's fake multi-node cluster) share a prefix
            return str(ray.get_runtime_context().get_node_id())
    except Exception:  # noqa: BLE001 - no Ray, or no node: the host names the node
        pass
    return socket.gethostname()


def default_cache_dir() -> Path:
    env = os.environ.get("MORPHOGEN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "morphogen"


class Autoscaling(BaseModel):
    """Serve autoscaling of one deployment (the router, or every shard deployment).

    `target`: for the shards, merged scans in flight per replica (Serve's ongoing requests;
    default `coalesce_max_in_flight`, what one router replica keeps in flight); for the router,
    queries held per replica (queued in its coalescer or being scanned; default
    `coalesce_max_queries`). The router scales on the offered load it holds, and shards follow
    the scans the added routers send.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_replicas: int = Field(1, ge=1, le=1024)
    max_replicas: int = Field(1, ge=1, le=1024)
    initial_replicas: int | None = Field(None, ge=1, le=1024)
    target: float | None = Field(None, gt=0, description="load per replica Serve aims for")
    upscale_delay_s: float = Field(10.0, ge=0)
    downscale_delay_s: float = Field(60.0, ge=0)
    # Serve averages the load over this window; it must exceed its 10 s metrics interval
    look_back_period_s: float = Field(15.0, gt=10)

    @model_validator(mode="after")
    def _check(self) -> Autoscaling:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas {self.max_replicas} < min_replicas "
                             f"{self.min_replicas}")
        if self.initial_replicas is not None and not (
            self.min_replicas <= self.initial_replicas <= self.max_replicas
        ):
            raise ValueError("initial_replicas must lie in [min_replicas, max_replicas]")
        return self


class PartyConfig(BaseModel):
    """One party (server A or B): its snapshot, its shards and its router."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # -- data: a snapshot path, or (when None) a synthetic snapshot built once in the cache.
    snapshot: str | None = Field(
        None, description="manifest .json, snapshot directory or raw page file; or a URI "
        "(s3://, gs://, https://) of a snapshot's prefix or manifest, fetched by each replica "
        "into snapshot_cache_dir, only the chunks of its own range"
    )
    synthetic_pages: int = Field(4096, ge=1, le=1 << 32, description="pages when synthetic")
    synthetic_seed: int = Field(0, ge=0)
    synthetic_epoch: int = Field(1, ge=0)
    cache_dir: str | None = Field(None, description="default: $MORPHOGEN_CACHE_DIR or ~/.cache")
    verify_snapshot: bool = Field(False, description="checksum the data at shard start")
    snapshot_cache_dir: str | None = Field(
        None, description="node-local directory for chunks of remote snapshots (default: "
        "<cache_dir>/snapshots); every replica on a node shares it, one download per chunk. "
        "{node} in it stands for the Ray node id (nodes that share a disk, one cache each)")

    # -- object stores (snapshots and logs in s3://, gs://, https://)
    store_timeout_s: float = Field(
        20.0, gt=0, le=3600, description="one request to the store, connect to last byte; a "
        "hung store fails after two such tries")
    store_retry_s: float = Field(
        30.0, ge=0, le=3600, description="a failed request is retried for this long")
    store_outage_s: float = Field(
        90.0, ge=0, le=86400, description="starting a party (snapshot, chunks, epoch log) "
        "waits this long for a store that cannot be reached")
    store_concurrency: int = Field(8, ge=1, le=256, description="ranged GETs in flight per "
                                   "chunk fetch")

    # -- shards
    num_shards: int = Field(2, ge=1, le=4096)
    shard_replicas: int = Field(1, ge=1, le=1024, description="copies of each shard")
    shard_autoscaling: Autoscaling | None = Field(
        None, description="scale each shard's replicas (shard_replicas then unused)"
    )
    engine: EngineName = "auto"
    placement: Placement = Field(
        "auto", description="gpu: one GPU per shard replica; auto: gpu when the engine is gpu"
    )
    shard_num_cpus: float = Field(0.5, ge=0, description="CPU slots per shard replica")
    # -- where shard replicas may run on a GPU cluster (Ray actor options)
    shard_accelerator_type: str | None = Field(
        None, description="GPU model shards need, as Ray names it (H100, A100, L4, ...): the "
        "node must carry the accelerator_type:<name> resource")
    shard_resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources per shard replica, e.g. "
        "{gpu_pool: 1} to keep shards on nodes that advertise it")
    shard_label_selector: dict[str, str] = Field(
        default_factory=dict, description="node labels a shard replica must run on (Ray "
        "label selectors, e.g. {ray.io/accelerator-type: H100})")
    shard_max_replicas_per_node: int | None = Field(
        None, ge=1, description="at most this many shard replicas on one node (spreads "
        "copies of a shard over nodes)")
    shard_runtime_env: dict[str, Any] | None = Field(
        None, description="runtime_env of the shard replicas, e.g. {pip: [\"morphogen"
        "[gpu-cuda12]\"]} where the image lacks CuPy (an image with it is faster to start)")
    shard_threads: int = Field(1, ge=1, le=64, description="concurrent scans per replica")
    shard_max_ongoing_requests: int = Field(16, ge=1)
    engine_options: dict[str, Any] = Field(default_factory=dict)
    warm_up: bool = Field(True, description="compile CPU kernels once before shards start")

    # -- router
    router_replicas: int = Field(1, ge=1, le=1024)
    router_autoscaling: Autoscaling | None = Field(
        None, description="scale router replicas (router_replicas then unused)"
    )
    router_num_cpus: float = Field(0.25, ge=0)
    router_max_ongoing_requests: int = Field(256, ge=1)
    router_max_queued_requests: int = Field(
        1024, ge=-1, description="requests queued past this are shed with 503 (-1: no limit)"
    )
    coalesce_window_ms: float = Field(2.0, ge=0, le=1000, description="0 turns coalescing off")
    coalesce_max_queries: int = Field(32, ge=1, le=4096, description="queries per merged scan")
    coalesce_max_in_flight: int = Field(
        2, ge=1, le=256, description="scans in flight per router replica (a bound)"
    )
    max_batch_queries: int = Field(MAX_BATCH_QUERIES, ge=1, le=1024)
    cors_origins: tuple[str, ...] = Field(
        (), description="web page origins (scheme://host[:port], or * for any) whose scripts "
        "may read GET /epoch and the query routes (morphogen/protocol/cors.py); none: no "
        "page may. The admin routes are never open to pages")
    max_body_bytes: int | None = Field(None, ge=1024, description="default: from the batch cap")

    # -- consistency and failure handling
    scan_attempts: int = Field(3, ge=1, le=20, description="fan-outs before answering 503")
    retry_backoff_ms: float = Field(50.0, ge=0)
    retry_after_s: int = Field(1, ge=0, description="Retry-After of a 503")
    shard_timeout_s: float = Field(60.0, gt=0)

    # -- admin: live page updates and snapshot rotation (POST /admin/updates, /admin/snapshot).
    # Off unless a token is configured: a secret file, else the environment variable named here
    # (read on the router's node). Admin needs the epoch log: publication ids must outlive the
    # router that saw them (ADMIN_NEEDS_LOG says why), so a token file without one is refused
    # here and the routers refuse publications without one whatever the token source.
    admin_token_file: str | None = Field(None, description="file holding the admin token")
    admin_token_env: str | None = Field(
        DEFAULT_ADMIN_TOKEN_ENV, description="variable holding the admin token (no file)"
    )
    admin_snapshot_dir: str | None = Field(
        None, description="rotations load snapshots only from under here: a directory, or an "
        "object-store prefix (s3://bucket/snapshots) for snapshots by URI (None: no rotation)"
    )
    admin_max_updates: int = Field(MAX_ADMIN_UPDATES, ge=1, le=65536)
    admin_max_body_bytes: int | None = Field(None, ge=1024, description="default: from the cap")
    admin_max_sparse_updates: int = Field(
        16384, ge=1, le=1 << 20, description="pages one updates body of changed bytes "
        "({\"batch\": ..}) may carry: its batch is whole pages in memory, 4 KiB a page")
    admin_max_publication_pages: int = Field(
        65536, ge=1, le=1 << 24, description="pages a publication in parts may carry in all: "
        "its parts are whole pages in memory once the last arrives, 4 KiB a page")
    admin_timeout_s: float = Field(300.0, gt=0, description="one shard's prepare or commit")
    admin_stale_stage_s: float = Field(
        600.0, gt=0, description="a staged epoch nobody committed may be replaced after this"
    )
    epoch_log_dir: str | None = Field(
        None,
        description="this party's durable epoch log: a directory every node sees (a shared "
        "file system whose flock works across nodes), or an object-store prefix (s3://, "
        "gs://) holding one write-once object per record; one per party. Published updates "
        "and rotations survive a replica restart, and admin needs it; None: no publications",
    )
    epoch_log_id: str | None = Field(
        None, description="the log's id (its log.json), set by the application builder: a "
        "replica whose epoch_log_dir holds another log, or none, refuses to start")
    admin_lease_s: float = Field(
        5.0, gt=0, le=300, description="a publisher renews its lease on the log this often x3; "
        "a publication whose publisher died is aborted by the next one after this")
    admin_failpoint_file: str | None = Field(
        None, description="testing only: a file naming a publication step (proposed, "
        "prepared, decided) at which the next publisher stops for good (morphogen.party.failpoint."
        "FileFailpoint)")
    catch_up_wait_s: float = Field(
        10.0, ge=0, description="a scan waits this long for its replica to catch up, then 503"
    )
    fold_interval_s: float = Field(
        1.0, ge=0, description="background fold of pending updates into pages (0: off)"
    )
    fold_threshold: int = Field(64, ge=1, description="pending updates that trigger a fold")
    fold_chunk_pages: int = Field(1024, ge=1, description="the chunk a fold counts written pages "
                                  "in (and copies, for an engine that scans its own copy)")

    # -- Serve lifecycle
    health_check_period_s: float = Field(10.0, gt=0)
    health_check_timeout_s: float = Field(30.0, gt=0)
    graceful_shutdown_timeout_s: float = Field(5.0, ge=0)
    access_log: bool = Field(False, description="Serve access log lines (never contain keys)")

    # -- advertised metadata (GET /epoch), reference fields without meaning for page PIR
    block_number: int = Field(0, ge=0)
    seeds: tuple[int, int, int] = (0, 0, 0)
    rows_per_page: int = Field(1, ge=1)

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, origins: tuple[str, ...]) -> tuple[str, ...]:
        return check_origins(origins)

    @model_validator(mode="after")
    def _check(self) -> PartyConfig:
        if self.snapshot is None and self.synthetic_pages < self.num_shards:
            raise ValueError(
                f"{self.num_shards} shards for {self.synthetic_pages} pages: "
                "every shard needs at least one page"
            )
        if self.epoch_log_dir is not None:
            check_log_location(self.epoch_log_dir)
        if self.admin_token_file is not None and not self.admin_supported:
            raise ValueError(ADMIN_NEEDS_LOG)
        if self.shard_autoscaling is not None and self.placement == "auto" \
                and self.engine != "gpu":
            raise ValueError(
                "shard_autoscaling needs an explicit placement: with placement auto, a party "
                "built where no GPU is seen yet (scale from zero) would place its shards on "
                "CPU and never ask the autoscaler for a GPU node. Set placement: gpu (each "
                "replica asks for a GPU) or placement: cpu (CPU replicas, on purpose)")
        return self

    @property
    def max_shard_replicas(self) -> int:
        if self.shard_autoscaling is not None:
            return self.shard_autoscaling.max_replicas
        return self.shard_replicas

    @property
    def admin_supported(self) -> bool:
        """Whether publications can be decided once: only a durable epoch log keeps their ids
        past a router's restart and across router replicas (and lets replicas catch up)."""
        return self.epoch_log_dir is not None

    def admin_updates_cap(self) -> int:
        """The most updates one request may carry: the count cap, and what the body cap holds
        in the larger (JSON) encoding."""
        n = self.admin_max_updates
        while n > 1 and admin_body_bytes(n) > self.admin_body_limit():
            n = max(1, n * 7 // 8)
        return n

    def admin_body_limit(self) -> int:
        if self.admin_max_body_bytes is not None:
            return self.admin_max_body_bytes
        return admin_body_bytes(self.admin_max_updates)

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

    def store_settings(self) -> StoreSettings:
        return StoreSettings.from_env(StoreSettings(
            timeout_s=self.store_timeout_s, retry_s=self.store_retry_s,
            outage_s=self.store_outage_s, concurrency=self.store_concurrency))

    def snapshot_cache_path(self) -> Path:
        if self.snapshot_cache_dir:
            return Path(self.snapshot_cache_dir.replace("{node}", node_label())).expanduser()
        return self.cache_path() / "snapshots"

    def wants_gpu(self, cluster_gpus: float = 0.0) -> bool:
        """Whether shard replicas ask Ray for a GPU each."""
        if self.placement == "gpu":
            return True
        if self.placement == "cpu":
            return False
        if self.engine == "gpu":
            return True
        return self.engine == "auto" and cluster_gpus >= 1


ADMIN_NEEDS_LOG = (
    "the admin routes need epoch_log_dir: without it no publication id outlives the router "
    "replica that saw it, so a publication re-sent after a router restart or to another "
    "router replica would be applied twice (an XOR diff then cancels itself), and a replica "
    "that misses a publication could not catch up; set epoch_log_dir (morphogen serve "
    "--epoch-log DIR: a local directory for a party on one node, one every node sees, or "
    "s3://...) or drop the admin token"
)


def autoscaling_config(spec: Autoscaling, default_target: float,
                       policy: str | None = None) -> dict[str, Any]:
    """Serve's `autoscaling_config` for `spec`."""
    out: dict[str, Any] = {
        "min_replicas": spec.min_replicas,
        "max_replicas": spec.max_replicas,
        "target_ongoing_requests": spec.target or default_target,
        "upscale_delay_s": spec.upscale_delay_s,
        "downscale_delay_s": spec.downscale_delay_s,
        "look_back_period_s": spec.look_back_period_s,
    }
    if spec.initial_replicas is not None:
        out["initial_replicas"] = spec.initial_replicas
    if policy is not None:
        out["policy"] = {"policy_function": policy}
    return out


def shard_scaling(cfg: PartyConfig) -> dict[str, Any]:
    """Serve options that size a shard deployment: a fixed count or an autoscaling config."""
    per_node = ({"max_replicas_per_node": cfg.shard_max_replicas_per_node}
                if cfg.shard_max_replicas_per_node else {})
    if cfg.shard_autoscaling is None:
        return {"num_replicas": cfg.shard_replicas, **per_node}
    return {"autoscaling_config": autoscaling_config(
        cfg.shard_autoscaling, float(cfg.coalesce_max_in_flight)), **per_node}


def router_scaling(cfg: PartyConfig) -> dict[str, Any]:
    """Serve options that size the router deployment."""
    if cfg.router_autoscaling is None:
        return {"num_replicas": cfg.router_replicas}
    return {"autoscaling_config": autoscaling_config(
        cfg.router_autoscaling, float(cfg.coalesce_max_queries), ROUTER_AUTOSCALING_POLICY)}


def shard_actor_options(cfg: PartyConfig, cluster_gpus: float = 0.0) -> dict[str, Any]:
    """Ray actor options of one shard replica: one whole GPU per replica on GPU placement (one
    GPU actor per device), fractional CPU slots otherwise."""
    out: dict[str, Any] = {"num_cpus": cfg.shard_num_cpus}
    if cfg.wants_gpu(cluster_gpus):
        out["num_gpus"] = 1
    if cfg.shard_accelerator_type:
        out["accelerator_type"] = cfg.shard_accelerator_type
    if cfg.shard_resources:
        out["resources"] = dict(cfg.shard_resources)
    if cfg.shard_label_selector:
        out["label_selector"] = dict(cfg.shard_label_selector)
    if cfg.shard_runtime_env:
        out["runtime_env"] = dict(cfg.shard_runtime_env)
    return out


def resolved_engine(cfg: PartyConfig, gpu_placed: bool) -> str:
    """Engine a shard creates: `auto` becomes `gpu` on GPU placement (the shard then fails
    loudly if CuPy or the device is missing) and stays `auto` (engine's own choice) otherwise."""
    if cfg.engine == "auto" and gpu_placed:
        return "gpu"
    return cfg.engine
