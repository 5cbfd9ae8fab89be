"""What `morphogen serve` is asked to run, worked out from its flags (and a config file only
when `--config` names one) before anything starts: the parties with their names, routes and
validated configurations, and the HTTP address."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.errors import UsageError, validation_problem
from cluster.inputs import raw_page_file
from deployments.naming import app_name, check_app_name, check_route_prefix

DEFAULT_HOST = "127.0.0.1"
JOINED_HOST = "0.0.0.0"  # on someone else's cluster the ingress reaches the node from outside
DEFAULT_PORT = 8000


@dataclass(frozen=True)
class PartyPlan:
    name: str
    route_prefix: str
    config: Any  # PartyConfig (imported lazily: pydantic)


@dataclass(frozen=True)
class ServePlan:
    parties: tuple[PartyPlan, ...]
    host: str
    port: int
    http_given: bool  # the host or port came from a flag or the config file


@dataclass
class _App:
    name: str | None
    route_prefix: str | None
    args: dict[str, Any]
    source: str


def _config_apps(path: str, only: str | None) -> tuple[list[_App], dict[str, Any]]:
    """The applications of a Serve config file (all, or the one named `only`) and its
    http_options."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh) or {}
    except FileNotFoundError:
        raise UsageError(f"--config {path}: no such file") from None
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"--config {path}: cannot read it as YAML ({exc})") from None
    if not isinstance(doc, dict):
        raise UsageError(f"--config {path}: expected a Serve config (applications:, "
                         "http_options:), got a YAML {type(doc).__name__}")
    apps = doc.get("applications") or [{}]
    out = []
    for i, app in enumerate(apps):
        if not isinstance(app, dict):
            raise UsageError(f"--config {path}: applications[{i}] is not a mapping")
        out.append(_App(app.get("name"), app.get("route_prefix"), dict(app.get("args") or {}),
                        f"--config {path} application {app.get('name') or i}"))
    if only is not None:
        out = [a for a in out if a.name == only]
        if not out:
            names = ", ".join(str(a.get("name")) for a in apps if isinstance(a, dict))
            raise UsageError(f"--app {only}: no such application in {path} (it has: {names})")
    return out, dict(doc.get("http_options") or {})


def _resolved(path: str) -> str:
    """An absolute local path; a URI (s3://, gs://, https://) as it is."""
    from morphogen.storage.location import is_remote

    return path.rstrip("/") if is_remote(path) else str(Path(path).expanduser().resolve())


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """PartyConfig fields set by flags (the same for every party)."""
    out: dict[str, Any] = {}
    if args.matrix:
        out["snapshot"] = _resolved(args.matrix)
    for flag, key in (("shards", "num_shards"), ("shard_cpus", "shard_num_cpus"),
                      ("router_cpus", "router_num_cpus"), ("engine", "engine")):
        if getattr(args, flag) is not None:
            out[key] = getattr(args, flag)
    if args.admin_token_file is not None:
        out["admin_token_file"] = _resolved(args.admin_token_file)
    if args.admin_snapshot_dir is not None:
        out["admin_snapshot_dir"] = _resolved(args.admin_snapshot_dir)
    if getattr(args, "cors_origin", None):
        out["cors_origins"] = tuple(args.cors_origin)
    return out


def _apps(args: argparse.Namespace) -> tuple[list[_App], dict[str, Any]]:
    if args.config is not None:
        apps, http = _config_apps(args.config, args.app)
    else:
        if args.app is not None:
            raise UsageError("--app names an application of a --config file; there is none")
        apps, http = [_App(None, None, {}, "serve flags")], {}
    if args.parties is not None:
        if args.name is not None or args.route_prefix is not None:
            raise UsageError("--parties names the parties and routes (/NAME each): drop --name "
                             "and --route-prefix")
        if len(apps) != 1:
            raise UsageError("--parties gives every party the same settings: pick one "
                             "application of the config file with --app")
        names = [n.strip() for n in args.parties.split(",")]
        if len(names) < 2 or not all(names):
            raise UsageError(f"--parties {args.parties}: give two or more names, e.g. "
                             "--parties a,b")
        base = apps[0]
        apps = [_App(n, f"/{n}", dict(base.args), base.source) for n in names]
    elif args.name is not None or args.route_prefix is not None:
        if len(apps) != 1:
            raise UsageError("--name and --route-prefix set one party; the config file has "
                             f"{len(apps)}: pick one with --app")
        # each follows the other: --name b serves at /b, --route-prefix /b is named b
        try:
            if args.name is not None:
                check_app_name(args.name)
            prefix = args.route_prefix or f"/{args.name}"
            apps[0].route_prefix = check_route_prefix(prefix)
            apps[0].name = args.name or app_name(prefix)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return apps, http


def _party(app: _App, overrides: dict[str, Any], epoch_log: str | None,
           several: bool, pad: bool, matrix: str | None) -> PartyPlan:
    from pydantic import ValidationError

    from morphogen.config import PartyConfig

    prefix = app.route_prefix or (f"/{app.name}" if app.name and several else "/")
    try:
        check_route_prefix(prefix)
        name = check_app_name(app.name or app_name(prefix))
    except ValueError as exc:
        raise UsageError(f"{app.source}: {exc}") from None
    fields = {**app.args, **overrides}
    if epoch_log is not None:
        # one log per party: two parties appending to one log would corrupt each other
        fields["epoch_log_dir"] = _resolved(f"{epoch_log.rstrip('/')}/{name}" if several
                                            else epoch_log)
    try:
        cfg = PartyConfig.model_validate(fields)
    except ValidationError as exc:
        raise UsageError(validation_problem(exc, app.source)) from None
    except ValueError as exc:
        raise UsageError(f"{app.source}: {exc}") from None
    raw_page_file(f"--matrix {matrix}" if matrix else f"{app.source} snapshot {cfg.snapshot}",
                  cfg.snapshot, pad)
    return PartyPlan(name, prefix, cfg)


def plan(args: argparse.Namespace) -> ServePlan:
    apps, http = _apps(args)
    several = len(apps) > 1
    overrides = _overrides(args)
    parties = tuple(_party(a, overrides, args.epoch_log, several, args.pad_last_page,
                           args.matrix) for a in apps)
    for attr, what in (("name", "application name"), ("route_prefix", "route")):
        values = [getattr(p, attr) for p in parties]
        dup = {v for v in values if values.count(v) > 1}
        if dup:
            raise UsageError(f"two parties would share the {what} {sorted(dup)[0]}: every "
                             "party needs its own (--parties a,b, or distinct names and "
                             "route_prefix in the config file)")
    joining = getattr(args, "address", None) is not None
    host = args.host or http.get("host") or (JOINED_HOST if joining else DEFAULT_HOST)
    port = args.port if args.port is not None else int(http.get("port") or DEFAULT_PORT)
    given = args.host is not None or args.port is not None or bool(http)
    return ServePlan(parties, host, port, given)
