"""The `morphogen` command line: demo, serve, build, get, admin."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cluster.report import eprint

DEFAULT_CONFIG = "ray_config.yaml"


# --------------------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace) -> int:
    from cluster.demo import run_demo

    return run_demo(args)


# --------------------------------------------------------------------------- serve


def _load_config_file(path: str | None, app_name: str | None) -> tuple[dict, dict, str, str]:
    """(app args, http options, app name, route prefix) from a Serve config file."""
    if path is None:
        if not Path(DEFAULT_CONFIG).is_file():
            return {}, {}, app_name or "morphogen", "/"
        path = DEFAULT_CONFIG
    import yaml

    with open(path, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh) or {}
    apps = doc.get("applications") or [{}]
    app = next((a for a in apps if a.get("name") == app_name), None) if app_name else apps[0]
    if app is None:
        raise SystemExit(f"no application named {app_name!r} in {path}")
    return (dict(app.get("args") or {}), dict(doc.get("http_options") or {}),
            app.get("name", "morphogen"), app.get("route_prefix", "/"))


def cmd_serve(args: argparse.Namespace) -> int:
    from cluster import local
    from morphogen.config import PartyConfig

    app_args, http, name, prefix = _load_config_file(args.config, args.app)
    if args.matrix:
        app_args["snapshot"] = str(Path(args.matrix).expanduser().resolve())
    if args.shards is not None:
        app_args["num_shards"] = args.shards
    if args.engine is not None:
        app_args["engine"] = args.engine
    if args.route_prefix is not None:
        prefix = args.route_prefix
    if args.epoch_log is not None:
        app_args["epoch_log_dir"] = str(Path(args.epoch_log).expanduser().resolve())
    cfg = PartyConfig.model_validate(app_args)  # validated once, before Ray starts
    host = args.host or http.get("host", "127.0.0.1")
    port = args.port if args.port is not None else int(http.get("port", 8000))

    from morphogen.snapshots import open_snapshot

    with open_snapshot(cfg, progress=True) as snap:
        summary = (f"{snap.num_pages} pages, domain {snap.domain_bits} bits, "
                   f"epoch {snap.epoch_id}")
    cluster = local.start(host=host, port=port, address=args.address, num_cpus=args.num_cpus,
                          quiet=not args.verbose)
    stop_event = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        eprint(f"[serve] {signal.Signals(signum).name}: shutting down")
        stop_event.set()

    # After ray.init: Ray's core worker installs its own SIGTERM handler, which exits at once.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        from ray import serve

        from deployments.app import build_app

        eprint(f"[serve] deploying {cfg.num_shards} shard(s): {summary}")
        serve.run(build_app(cfg), name=name, route_prefix=prefix, blocking=False)
        print(f"serving on {cluster.app_url(prefix)} (POST /query/page/gpu, "
              f"/query/page/gpu/batch; GET /epoch, /health); Ctrl-C to stop", flush=True)
        while not stop_event.wait(1.0):
            pass
    finally:
        from ray import serve

        if cluster.owns_ray:
            local.stop(cluster)
        else:
            serve.delete(name)
    eprint("[serve] stopped")
    return 0


# --------------------------------------------------------------------------- build, get


def cmd_build(args: argparse.Namespace) -> int:
    from morphogen.snapshot.manifest import SnapshotError
    from morphogen.snapshot.synthetic import build_synthetic
    from morphogen.snapshot.writer import import_raw

    try:
        if args.raw:
            m = import_raw(args.raw, args.out, epoch_id=args.epoch, progress=True,
                           overwrite=args.force)
        else:
            m = build_synthetic(args.out, args.synthetic, seed=args.seed, epoch_id=args.epoch,
                                progress=True, overwrite=args.force)
    except SnapshotError as exc:
        eprint(f"error: {exc} (--force overwrites)")
        return 1
    print(f"snapshot {args.out}: {m.num_pages} pages, domain {m.domain_bits} bits, "
          f"epoch {m.epoch_id}, {m.checksum}")
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    from morphogen.client import PirClient, PirError

    try:
        with PirClient(args.server_a, args.server_b, encoding=args.encoding,
                       timeout_s=args.timeout) as c:
            pages = c.get(args.pages)
    except (PirError, ValueError) as exc:
        eprint(f"error: {exc}")
        return 1
    if args.out:
        with open(args.out, "wb") as fh:
            for p in pages:
                fh.write(p)
        eprint(f"wrote {len(pages)} page(s) to {args.out}")
    else:
        for n, p in zip(args.pages, pages, strict=True):
            print(f"{n}\t0x{p.hex()}")
    return 0


# --------------------------------------------------------------------------- admin


def _admin_token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        return Path(args.token_file).expanduser().read_text().strip()
    return os.environ.get(args.token_env, "").strip() or None


def _read_updates(path: str) -> list[tuple[int, str, bytes]]:
    """`{"updates": [{"page": n, "diff" | "data": "0x..."}]}` (the route's JSON body)."""
    import json

    from morphogen.codec import from_hex

    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    out = []
    for i, item in enumerate(doc["updates"]):
        kind = "diff" if "diff" in item else "data"
        if kind not in item:
            raise ValueError(f"update {i}: needs 'diff' or 'data'")
        out.append((int(item["page"]), kind, from_hex(item[kind])))
    return out


def cmd_admin(args: argparse.Namespace) -> int:
    import json

    import httpx

    from morphogen.admin_client import AdminClient
    from morphogen.client import PirError

    token = _admin_token(args)
    if not token:
        eprint(f"error: no admin token (--token-file, or ${args.token_env})")
        return 2
    try:
        changes = _read_updates(args.file) if args.action == "updates" else []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        eprint(f"error: cannot read updates: {exc}")
        return 2
    from morphogen.admin_client import (
        compare_parties,
        content_publication_id,
        publish_to_parties,
    )

    clients = [AdminClient(url, token, timeout_s=args.timeout) for url in args.server]
    try:
        if args.action == "status":
            statuses = []
            for url, adm in zip(args.server, clients, strict=True):
                try:
                    res = adm.status()
                except (PirError, OSError, httpx.HTTPError) as exc:
                    eprint(f"error: {url}: {type(exc).__name__}: {exc}")
                    return 1
                statuses.append(res)
                print(json.dumps({"server": url, **res}), flush=True)
            diff = compare_parties(args.server, statuses)
            if diff:
                eprint(diff)
                return 1
            return 0
        # One publication id for every party: a party re-sent it answers it as done, so a
        # re-run of this command is always safe and ends with the parties on one identity.
        if args.action == "snapshot":
            pub = args.id or content_publication_id("snapshot", args.path.encode())
            results = publish_to_parties(clients, lambda c: c.snapshot(args.path, pub),
                                         retry_for_s=args.retry_for)
        else:
            with open(args.file, "rb") as fh:
                pub = args.id or content_publication_id("updates", fh.read())
            results = publish_to_parties(clients, lambda c: c.updates(changes, pub),
                                         retry_for_s=args.retry_for)
    except (PirError, OSError, httpx.HTTPError) as exc:
        eprint(f"error: {type(exc).__name__}: {exc}")
        return 1
    finally:
        for c in clients:
            c.close()
    for url, res in zip(args.server, results, strict=True):
        print(json.dumps({"server": url, **res}), flush=True)
    if any(r.get("duplicate") for r in results):
        eprint(f"publication {pub} was published before: nothing applied again (pass --id "
               "with a new id to publish the same content once more)")
    return 0


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="morphogen", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="two local parties, private fetches, verified bytes")
    demo.add_argument("--pages", type=int, default=4096, help="synthetic pages (4 KiB each)")
    demo.add_argument("--shards-a", type=int, default=3)
    demo.add_argument("--shards-b", type=int, default=2)
    demo.add_argument("--requests", type=int, default=12, help="requests per measured path")
    demo.add_argument("--engine", default="auto", choices=["auto", "reference", "cpu", "gpu"])
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--port", type=int, default=0, help="HTTP port (0: a free one)")
    demo.set_defaults(func=cmd_demo)

    srv = sub.add_parser("serve", help="run one party until interrupted")
    srv.add_argument("--config", default=None, help=f"Serve config file (default {DEFAULT_CONFIG} "
                                                    "when present)")
    srv.add_argument("--app", default=None, help="application name in the config file")
    srv.add_argument("--matrix", default=None, help="snapshot: manifest, directory or raw file")
    srv.add_argument("--shards", type=int, default=None)
    srv.add_argument("--engine", default=None, choices=["auto", "reference", "cpu", "gpu"])
    srv.add_argument("--host", default=None)
    srv.add_argument("--port", type=int, default=None)
    srv.add_argument("--route-prefix", default=None)
    srv.add_argument("--epoch-log", default=None, metavar="DIR",
                     help="this party's durable epoch log: admin updates and rotations survive "
                          "shard restarts (one directory per party)")
    srv.add_argument("--address", default=None, help="join a running Ray cluster")
    srv.add_argument("--num-cpus", type=int, default=None)
    srv.add_argument("--verbose", action="store_true", help="show Ray's logs")
    srv.set_defaults(func=cmd_serve)

    bld = sub.add_parser("build", help="raw page file or synthetic data -> snapshot")
    src = bld.add_mutually_exclusive_group(required=True)
    src.add_argument("--raw", help="raw page file (4096-byte pages back to back)")
    src.add_argument("--synthetic", type=int, metavar="PAGES", help="synthetic page count")
    bld.add_argument("--out", required=True, help="snapshot directory")
    bld.add_argument("--epoch", type=int, default=1)
    bld.add_argument("--seed", type=int, default=0)
    bld.add_argument("--force", action="store_true",
                     help="overwrite a snapshot already in --out (servers mapping it keep the "
                          "old data; a restarted one maps the new)")
    bld.set_defaults(func=cmd_build)

    get = sub.add_parser("get", help="fetch pages privately from two servers")
    get.add_argument("--server-a", required=True)
    get.add_argument("--server-b", required=True)
    get.add_argument("--encoding", default="json", choices=["json", "msgpack"])
    get.add_argument("--timeout", type=float, default=30.0)
    get.add_argument("--out", default=None, help="write the raw pages here instead of hex")
    get.add_argument("pages", type=int, nargs="+", metavar="PAGE")
    get.set_defaults(func=cmd_get)

    adm = sub.add_parser("admin", help="page updates, snapshot rotation, status (admin token)")
    adm.add_argument("--server", action="append", required=True,
                     help="a party's URL; repeat for both parties (applied in order)")
    adm.add_argument("--token-file", default=None, help="file holding the admin token")
    adm.add_argument("--token-env", default="MORPHOGEN_ADMIN_TOKEN",
                     help="variable holding it when no file is given")
    adm.add_argument("--timeout", type=float, default=600.0)
    adm.add_argument("--id", default=None,
                     help="publication id sent to every party (default: derived from the "
                          "file or path, so re-running a command never applies it twice)")
    adm.add_argument("--retry-for", type=float, default=120.0, metavar="S",
                     help="keep re-sending to a party that is unavailable this long")
    acts = adm.add_subparsers(dest="action", required=True)
    acts.add_parser("status", help="every shard's epoch, pending updates, rotation")
    snap = acts.add_parser("snapshot", help="rotate to a snapshot under admin_snapshot_dir")
    snap.add_argument("path")
    upd = acts.add_parser("updates", help='apply {"updates": [...]} from a JSON file')
    upd.add_argument("file")
    adm.set_defaults(func=cmd_admin)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
