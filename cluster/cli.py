"""The `morphogen` command line: demo, serve, metrics-url, build, get, admin, lookup, records,
snapshot, chain, rpc.

This module only parses: each command is a thin function over a `cluster` module. Errors are
one line naming the input and the fix (`cluster.errors`), exit status 2 for bad input."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from cluster import admin_view, chain, inputs, records, snapshots, wallet
from cluster.errors import CommandFailed, UsageError, report
from cluster.report import eprint
from cluster.shutdown import StopRequested

# --------------------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace) -> int:
    if args.web:
        from cluster.demo_web import run_web_demo

        return run_web_demo(args)
    from cluster.demo import run_demo

    return run_demo(args)


# --------------------------------------------------------------------------- serve


def cmd_serve(args: argparse.Namespace) -> int:
    from cluster.serve_run import run

    return run(args)


def cmd_metrics_url(args: argparse.Namespace) -> int:
    from cluster.ray_access import joined_metrics_urls

    for url in joined_metrics_urls(args.address):
        print(url)
    return 0


# --------------------------------------------------------------------------- build, get


def cmd_build(args: argparse.Namespace) -> int:
    if args.records:
        if args.table:
            # a keyword table's pages are laid out by its builder, not by the operator
            raise UsageError("--table applies to --raw and --synthetic, not --records")
        return records.build_records(args)
    return snapshots.build(args)


def cmd_get(args: argparse.Namespace) -> int:
    from morphogen.client import PirClient, PirError, PirUnavailable

    url_a, url_b = inputs.two_parties(args.server_a, args.server_b)
    try:
        with PirClient(url_a, url_b, encoding=args.encoding, timeout_s=args.timeout) as c:
            pages = c.get(args.pages)
    except PirUnavailable as exc:
        raise CommandFailed(f"{exc} (check that both parties are serving, and their URLs "
                            "with the route prefix, e.g. http://127.0.0.1:8000/a)") from None
    except (PirError, ValueError) as exc:
        raise CommandFailed(str(exc)) from None
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
        return inputs.admin_token(args.token_file, args.token_env)
    return os.environ.get(args.token_env, "").strip() or None


def _read_updates(path: str) -> list[tuple[int, str, bytes]]:
    return inputs.read_updates(path)


def _admin_servers(args: argparse.Namespace) -> None:
    """`--server` may come before or after the action (`admin --server A status`, `admin
    status --server A --server B`): one list, in order, each URL checked."""
    servers = list(args.server or []) + list(getattr(args, "server_after", None) or [])
    if not servers:
        raise UsageError("admin: give each party's URL with --server (twice: party A, then B)")
    args.server = [inputs.server_url("--server", u) for u in servers]


def cmd_admin(args: argparse.Namespace) -> int:
    import httpx

    from morphogen.client import PirError
    from morphogen.client.admin import AdminClient

    token = _admin_token(args)
    if not token:
        eprint(f"error: no admin token (--token-file, or ${args.token_env})")
        return 2
    try:
        changes = _read_updates(args.file) if args.action == "updates" else []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        eprint(f"error: cannot read updates: {exc}")
        return 2
    from morphogen.client.admin import (
        common_digest_version,
        compare_parties,
        content_publication_id,
        publish_to_parties,
    )
    from morphogen.protocol.changes import ChangeBatch

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
                admin_view.show("status", url, res, args.json)
            diff = compare_parties(args.server, statuses)
            if diff:
                eprint(diff)
                return 1
            return 0
        # One publication id for every party: a party re-sent it answers it as done, so a
        # re-run of this command is always safe and ends with the parties on one identity.
        if args.action == "snapshot":
            pub = args.id or content_publication_id("snapshot", args.path.encode())
            results = publish_to_parties(clients, lambda c, p: c.snapshot(args.path, pub, p),
                                         retry_for_s=args.retry_for, publication=pub)
        else:
            with open(args.file, "rb") as fh:
                pub = args.id or content_publication_id("updates", fh.read())
            # under the digest both parties take: they name one identity
            sent = ChangeBatch.from_triples(changes).with_digest(common_digest_version(clients))
            results = publish_to_parties(clients, lambda c, p: c.updates(
                sent, pub, p, max_per_request=c.max_updates()),
                                         retry_for_s=args.retry_for, publication=pub)
    except (PirError, OSError, httpx.HTTPError) as exc:
        eprint(f"error: {type(exc).__name__}: {exc}")
        return 1
    finally:
        for c in clients:
            c.close()
    for url, res in zip(args.server, results, strict=True):
        admin_view.show(args.action, url, res, args.json)
    if any(r.get("duplicate") for r in results):
        eprint(f"publication {pub} was published before: nothing applied again (pass --id "
               "with a new id to publish the same content once more)")
    return 0


# --------------------------------------------------------------------------- main

SERVE_EXAMPLES = """\
examples:
  morphogen serve --parties a,b                  # two parties, /a and /b, on one local cluster
  morphogen serve --matrix /data/snap --shards 4 --shard-cpus 0.25
  morphogen serve --name a --epoch-log /var/lib/morphogen/log \\
      --admin-token-file /run/secrets/admin --admin-snapshot-dir /data/snapshots
  morphogen serve --address HOST:PORT --name b   # another party on a running cluster
  morphogen serve --config ray_config.yaml       # every application of a Serve config file

Stops on SIGINT (Ctrl-C) or SIGTERM within 15 s; a second signal forces."""

GET_EXAMPLES = """\
examples:
  morphogen get --server-a http://127.0.0.1:8000/a --server-b http://127.0.0.1:8000/b 17 4242
  morphogen get --server-a http://a:8000 --server-b http://b:8000 --out pages.bin 0 1 2"""

ADMIN_EXAMPLES = f"""\
examples:
  morphogen admin --server http://a:8000 --server http://b:8000 --token-file T status
  morphogen admin --token-file T updates changes.json --server URL_A --server URL_B
  morphogen admin --token-file T snapshot epoch-2 --server URL_A --server URL_B

The updates file: {inputs.UPDATES_FORMAT}.
Send every operation to both parties (they are applied in the order of --server)."""

BUILD_EXAMPLES = """\
examples:
  morphogen build --synthetic 65536 --out /data/snap      # 256 MiB of pseudo-random pages
  morphogen build --raw pages.bin --out /data/snap --epoch 7
  morphogen build --raw pages.bin --out s3://bucket/snapshots/epoch-7 --epoch 7
  morphogen build --records accounts.jsonl --value-size 32 --signing-key owner.key --out /data/kw"""


def _admin_options(p: argparse.ArgumentParser, after: bool) -> None:
    """The admin options, accepted before and after the action. After it they default to
    SUPPRESS so that an option given only before is not reset."""
    keep = {"default": argparse.SUPPRESS} if after else {}
    p.add_argument("--server", action="append", dest="server_after" if after else "server",
                   metavar="URL", default=None,
                   help="a party's URL with its route (http://host:port/a); give it once per "
                        "party, A then B: operations are sent in this order")
    p.add_argument("--token-file", metavar="FILE", help="file holding the admin token (the "
                   "party's admin_token_file)", **(keep or {"default": None}))
    p.add_argument("--token-env", metavar="VAR", help="variable holding the token when no "
                   "file is given (default MORPHOGEN_ADMIN_TOKEN)",
                   **(keep or {"default": "MORPHOGEN_ADMIN_TOKEN"}))
    p.add_argument("--timeout", type=float, metavar="S", help="seconds to wait for each "
                   "server (default 600: a rotation may load a large snapshot)",
                   **(keep or {"default": 600.0}))
    p.add_argument("--json", action="store_true", help="print each answer as one JSON line "
                   "instead of a table", **(keep or {"default": False}))
    p.add_argument("--id", metavar="ID", help="publication id sent to every party (default: "
                   "derived from the updates file or the snapshot path, so that re-running a "
                   "command never applies it twice)", **(keep or {"default": None}))
    p.add_argument("--retry-for", type=float, metavar="S", help="keep re-sending to a party "
                   "that is unavailable this long (default 120)",
                   **(keep or {"default": 120.0}))


def _serve_parser(sub: Any) -> None:
    srv = sub.add_parser(
        "serve", help="run one or more parties until SIGINT/SIGTERM",
        description="Run PIR parties (Serve applications) on a local Ray cluster started\n"
                    "here, or on a running one with --address. Without --config no file is\n"
                    "read: the flags and morphogen.config.PartyConfig's defaults are all.",
        epilog=SERVE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    who = srv.add_argument_group("parties")
    who.add_argument("--parties", metavar="A,B",
                     help="several parties with the same settings, each at /NAME (one "
                          "command for both parties of a local deployment)")
    who.add_argument("--name", help="this party's application name (default: from the route, "
                                    "morphogen for /); sets the route /NAME too")
    who.add_argument("--route-prefix", metavar="/PATH",
                     help="the party's route (default /, or /NAME with --name)")
    who.add_argument("--config", metavar="FILE",
                     help="a Serve config file (like ray_config.yaml): its applications' args "
                          "and http_options; flags override them. Read only when given")
    who.add_argument("--app", metavar="NAME",
                     help="serve only this application of the --config file (default: all)")
    data = srv.add_argument_group("data and shards")
    data.add_argument("--matrix", metavar="PATH",
                      help="snapshot: a manifest, a snapshot directory, or a raw page file "
                           "(default: a synthetic snapshot, built once in the cache)")
    data.add_argument("--pad-last-page", action="store_true",
                      help="serve a raw page file that ends inside a page, zero-padded "
                           "(refused otherwise: a truncated copy looks the same)")
    data.add_argument("--shards", type=inputs.positive_int, metavar="N",
                      help="shards per party, each scanning its page range (default 2)")
    data.add_argument("--shard-cpus", type=inputs.cpu_slots, metavar="X",
                      help="Ray CPU slots per shard replica (default 0.5): a placement budget "
                           "that must fit the cluster, not a thread count")
    data.add_argument("--router-cpus", type=inputs.cpu_slots, metavar="X",
                      help="Ray CPU slots per router replica (default 0.25)")
    data.add_argument("--engine", choices=["auto", "reference", "cpu", "gpu"],
                      help="scan engine: auto (gpu where CuPy sees a device, else cpu), cpu "
                           "(numba), gpu (CUDA), reference (NumPy, slow)")
    adm = srv.add_argument_group("admin (live updates, rotation)")
    adm.add_argument("--admin-token-file", metavar="FILE",
                     help="file holding the admin bearer token: turns the admin routes on "
                          "(else $MORPHOGEN_ADMIN_TOKEN where set); needs --epoch-log")
    adm.add_argument("--admin-snapshot-dir", metavar="DIR",
                     help="rotations load snapshots only from under DIR (unset: no rotation)")
    adm.add_argument("--epoch-log", metavar="DIR",
                     help="durable epoch log, required by the admin routes: publications are "
                          "decided once, survive restarts, and a re-sent one is never applied "
                          "twice (with several parties, one subdirectory each)")
    net = srv.add_argument_group("cluster and HTTP")
    net.add_argument("--host", help="HTTP host to bind (default 127.0.0.1 on a cluster serve "
                                    "starts; 0.0.0.0, every interface, when it joins one with "
                                    "--address or $RAY_ADDRESS and Serve does not run there "
                                    "yet)")
    net.add_argument("--port", type=inputs.positive_int,
                     help="HTTP port (default 8000); with --address, the port Serve already "
                          "uses on that cluster (another one is refused)")
    net.add_argument("--address", metavar="HOST:PORT",
                     help="join this running Ray cluster (the `ray address` a serve printed) "
                          "instead of starting one")
    net.add_argument("--cors-origin", action="append", metavar="ORIGIN",
                     help="a web page origin (scheme://host[:port], or * for any) whose "
                          "scripts may read /epoch and the query routes (the TypeScript "
                          "client in a browser); repeat for several. Never the admin routes")
    net.add_argument("--num-cpus", type=inputs.positive_int, metavar="N",
                     help="CPU slots of the cluster started here (default: the machine's "
                          "cores)")
    net.add_argument("--metrics-port", type=inputs.positive_int, metavar="PORT",
                     help="Prometheus port of the cluster started here (default: a free one, "
                          "printed at start)")
    net.add_argument("--skip-resource-check", action="store_true",
                     help="deploy even when the replicas do not fit the cluster now (nodes "
                          "about to join); they wait until they fit")
    net.add_argument("--verbose", action="store_true", help="show Ray's logs")
    srv.set_defaults(func=cmd_serve)


def _admin_parser(sub: Any) -> None:
    adm = sub.add_parser(
        "admin", help="page updates, snapshot rotation, status (admin token)",
        description="Drive both parties' admin routes, in the order of --server.",
        epilog=ADMIN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _admin_options(adm, after=False)
    acts = adm.add_subparsers(dest="action", required=True, metavar="ACTION")
    status = acts.add_parser("status", help="every shard's epoch, pending updates, replicas")
    snap = acts.add_parser("snapshot", help="rotate to a snapshot under admin_snapshot_dir")
    snap.add_argument("path", help="the snapshot, relative to the party's admin_snapshot_dir "
                                   "(a directory with manifest.json)")
    upd = acts.add_parser("updates", help="publish page updates from a JSON file",
                          epilog=f"file format: {inputs.UPDATES_FORMAT}")
    upd.add_argument("file", help='JSON file: {"updates": [{"page": N, "diff" | "data": '
                                  '"0x..."}, ...]}')
    for p in (status, snap, upd):
        _admin_options(p, after=True)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the traceback of an unexpected error")
    adm.set_defaults(func=cmd_admin)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="morphogen",
        description="Two-server private information retrieval of 4 KiB pages on Ray Serve: "
                    "serve parties, build snapshots, fetch pages privately, publish updates.",
        epilog="`morphogen COMMAND --help` describes each command, with examples.")
    parser.add_argument("--version", action="version", version=f"morphogen {_version()}")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an unexpected error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="two local parties, private fetches, verified bytes")
    demo.add_argument("--pages", type=inputs.positive_int, default=4096,
                      help="synthetic pages (4 KiB each; default 4096)")
    demo.add_argument("--shards-a", type=inputs.positive_int, default=3,
                      help="party A's shards (default 3)")
    demo.add_argument("--shards-b", type=inputs.positive_int, default=2,
                      help="party B's shards (default 2)")
    demo.add_argument("--requests", type=inputs.positive_int, default=12,
                      help="requests per measured path (default 12)")
    demo.add_argument("--engine", default="auto", choices=["auto", "reference", "cpu", "gpu"],
                      help="scan engine (default auto)")
    demo.add_argument("--seed", type=int, default=0, help="synthetic data and page choice")
    demo.add_argument("--port", type=int, default=0, help="HTTP port (0: a free one)")
    demo.add_argument("--records", type=int, default=2000, metavar="N",
                      help="synthetic accounts in the keyword lookup part (0 skips it), "
                           "or in the chain --web serves")
    demo.add_argument("--web", action="store_true",
                      help="serve a page that reads a balance and a token balance privately "
                           "(viem over the TypeScript client), until interrupted; it prints "
                           "the page's address")
    demo.add_argument("--web-port", type=int, default=0, metavar="PORT",
                      help="the page's port with --web (0: a free one)")
    demo.set_defaults(func=cmd_demo)

    _serve_parser(sub)

    mu = sub.add_parser("metrics-url", help="the Prometheus endpoints of a running cluster",
                        description="Print every node's Prometheus endpoint (morphogen_* and "
                                    "Ray metrics) of the cluster at --address.")
    mu.add_argument("--address", required=True, metavar="HOST:PORT",
                    help="the cluster's address (the `ray address` serve printed)")
    mu.set_defaults(func=cmd_metrics_url)

    bld = sub.add_parser("build", help="raw page file or synthetic data -> snapshot",
                         epilog=BUILD_EXAMPLES,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    src = bld.add_mutually_exclusive_group(required=True)
    src.add_argument("--raw", metavar="FILE",
                     help="raw page file (4096-byte pages back to back, the reference's format)")
    src.add_argument("--synthetic", type=inputs.positive_int, metavar="PAGES",
                     help="this many pseudo-random pages (from --seed)")
    bld.add_argument("--out", required=True, metavar="DIR|URI",
                     help="snapshot directory to write (pages.bin + manifest.json), or an "
                          "s3:// or gs:// prefix to upload it to (`snapshot push`)")
    bld.add_argument("--epoch", type=int, default=1,
                     help="epoch id the manifest names (default 1); each new snapshot of the "
                          "same data set takes a higher one")
    bld.add_argument("--seed", type=int, default=0, help="seed of --synthetic pages")
    bld.add_argument("--table", action="append", type=inputs.table_spec,
                     metavar="NAME=FIRST:COUNT",
                     help="a named table: pages [FIRST, FIRST+COUNT) of the matrix, queried on "
                          "their own (repeat for several)")
    bld.add_argument("--pad-last-page", action="store_true",
                     help="accept a raw file that ends inside a page and zero-pad it (refused "
                          "otherwise: a truncated copy looks the same)")
    bld.add_argument("--force", action="store_true",
                     help="overwrite a snapshot already in --out (servers mapping it keep the "
                          "old data; a restarted one maps the new)")
    records.add_build_options(bld, src)
    snapshots.add_build_options(bld)
    bld.set_defaults(func=cmd_build)

    get = sub.add_parser("get", help="fetch pages privately from two servers",
                         epilog=GET_EXAMPLES,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    get.add_argument("--server-a", required=True, metavar="URL",
                     help="party A's URL with its route, e.g. http://127.0.0.1:8000/a")
    get.add_argument("--server-b", required=True, metavar="URL",
                     help="party B's URL: another party than A (one server given both keys "
                          "learns the page)")
    get.add_argument("--encoding", default="json", choices=["json", "msgpack"],
                     help="request and answer body encoding (default json)")
    get.add_argument("--timeout", type=float, default=30.0, metavar="S",
                     help="seconds per request (default 30)")
    get.add_argument("--out", default=None, metavar="FILE",
                     help="write the raw pages here instead of printing hex")
    get.add_argument("pages", type=int, nargs="+", metavar="PAGE",
                     help="page numbers to fetch (0 .. pages-1), in this order")
    get.set_defaults(func=cmd_get)

    _admin_parser(sub)
    keyword_parsers = records.add_parsers(sub)
    for p in (demo, mu, bld, get, *keyword_parsers, *snapshots.add_parsers(sub),
              *chain.add_parsers(sub), *wallet.add_parsers(sub),
              *(sub.choices[n] for n in ("serve", "admin"))):
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the traceback of an unexpected error")
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("morphogen")
    except PackageNotFoundError:
        return "(not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "admin":
            _admin_servers(args)
        return int(args.func(args) or 0)
    except (KeyboardInterrupt, StopRequested):
        return 130
    except Exception as exc:  # noqa: BLE001 - one line for the operator, see cluster.errors
        return report(exc, args.debug)


if __name__ == "__main__":
    sys.exit(main())
