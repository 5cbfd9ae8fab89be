"""`morphogen chain export|build|import|follow`: a node's state into keyword tables, block by block.

`export` writes the state export file (`morphogen.chain.export`) from a node, checked against
the node's standard answers; `build` turns one into an owner directory holding the accounts,
storage and code tables in one matrix, version 1 anchored at the export's block (chain id,
number, hash); `follow` applies every later block to it and publishes each to both parties as
one publication (`morphogen.chain.follow`). `import` builds the same owner directory from a
node's own state dump (geth's JSON lines, anvil's JSON), its ranges encoded in parallel on Ray
(`cluster.chain_import`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cluster.errors import CommandFailed, UsageError
from cluster.parties import add_publish_options


def cmd_chain(args: argparse.Namespace) -> int:
    if args.chain_action == "export":
        return _export(args)
    if args.chain_action == "follow":
        return _follow(args)
    if args.chain_action == "import":
        return _import(args)
    return _build(args)


def _export(args: argparse.Namespace) -> int:
    from morphogen.chain import ChainError, EthRpc, export_from_node

    sample = None if args.check == "all" else args.check
    try:
        with EthRpc(args.rpc, timeout_s=args.timeout) as rpc:
            if args.chain_id is not None:
                rpc.check_chain_id(args.chain_id)
            header = export_from_node(rpc, args.out, sample=sample)
    except ChainError as exc:
        raise CommandFailed(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"--out {args.out}: {exc.strerror or exc}") from None
    b = header.block
    print(f"state of chain {header.chain_id} at block {b.number} ({b.hash}) written to "
          f"{args.out}")
    return 0


def _build(args: argparse.Namespace) -> int:
    from morphogen.chain import ExportError, read_header, state_records
    from morphogen.chain.tables import build_chain_tables
    from morphogen.keyword.descriptor import Anchor
    from morphogen.keyword.owner import create_owner_dir
    from morphogen.keyword.signing import load_signing_key

    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out} is not empty; build into a new directory")
    try:
        key = load_signing_key(args.signing_key)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--signing-key {exc}") from None
    try:
        header = read_header(args.state)
        anchor = Anchor(header.chain_id, header.block.number, header.block.hash)
        table = build_chain_tables(state_records(args.state), key, anchor,
                                   room=args.room, min_records=args.min_records)
        snapshot = create_owner_dir(table, out)
    except (ExportError, OSError) as exc:
        raise UsageError(f"--state {args.state}: {exc}") from None
    except ValueError as exc:  # a record the table refuses (RecordError, TableFullError)
        raise UsageError(f"--state {args.state}: {exc}") from None
    from morphogen.keyword.descriptor import parts_of

    for part in parts_of(table.pages):
        d = part.descriptor
        print(f"{d.name}: {d.records} records in {d.geometry.capacity} slots, "
              f"{d.geometry.num_pages} pages")
    print(f"block {header.block.number} ({header.block.hash}) of chain {header.chain_id}: "
          f"serve {snapshot}; clients need the public key "
          f"{table.descriptor.public_key.hex()}")
    return 0


def _import(args: argparse.Namespace) -> int:
    import tempfile

    from cluster.chain_import import import_dump, resolve_anchor
    from morphogen.chain import anvil_dump, dumps
    from morphogen.keyword.signing import load_signing_key, public_bytes

    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out} is not empty; import into a new directory")
    try:
        key = load_signing_key(args.signing_key)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--signing-key {exc}") from None
    if args.log is not None:  # the progress lines, time-stamped, besides the terminal
        import logging

        handler = logging.FileHandler(args.log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger = logging.getLogger("morphogen.chain.import")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    with tempfile.TemporaryDirectory(prefix="anvil-lines-", dir=out.parent) as tmp:
        try:
            dump = Path(args.dump)
            if args.format == "anvil":
                info = anvil_dump.anvil_lines(dump, Path(tmp) / (dump.name + ".jsonl"))
                dump = Path(tmp) / (dump.name + ".jsonl")
            else:
                info = dumps.info(dump)
            anchor = resolve_anchor(info, chain_id=args.chain_id, block=args.block,
                                    block_hash=args.block_hash, rpc=args.rpc,
                                    timeout_s=args.timeout)
            snapshot = import_dump(dump, out, signing_key=key, anchor=anchor,
                                   workers=args.workers, address=args.address, room=args.room,
                                   min_records=args.min_records, body=info.body,
                                   range_bytes=int(args.range_mb * (1 << 20)))
        except (dumps.DumpError, FileExistsError) as exc:
            raise UsageError(f"--dump {args.dump}: {exc}") from None
        except ValueError as exc:  # the anchor, or a record the table refuses
            raise UsageError(str(exc)) from None
    print(f"block {anchor.number} ({anchor.hash}) of chain {anchor.chain_id}: serve "
          f"{snapshot}; clients need the public key "
          f"{public_bytes(key.public_key()).hex()}")
    return 0


def _follow(args: argparse.Namespace) -> int:
    import httpx

    from cluster.parties import admin_parties
    from morphogen.chain import ChainError, EthRpc
    from morphogen.chain.follow import Follower
    from morphogen.chain.progress import serve_metrics
    from morphogen.client import PirError
    from morphogen.keyword.owner import OwnerTable, WriterBusy, writer_lock
    from morphogen.keyword.publishing import PublishError
    from morphogen.keyword.signing import load_signing_key

    try:
        owner = OwnerTable(args.owner)
        key = load_signing_key(args.signing_key)
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    parties = admin_parties([args.server_a, args.server_b], args)
    try:
        lock = writer_lock(owner.root)
    except WriterBusy as exc:
        raise CommandFailed(str(exc)) from None
    blocks = args.blocks
    try:
        with lock, EthRpc(args.rpc, timeout_s=args.timeout) as rpc:
            follower = Follower(rpc, owner, parties, key, confirmations=args.confirmations,
                                keep=args.keep, snapshot_dir=args.snapshot_dir,
                                report=lambda line: print(line, flush=True))
            server = serve_metrics(follower.progress, args.metrics_port) \
                if args.metrics_port is not None else None
            number, digest = follower.tip()
            print(f"following chain {follower.chain_id} from block {number} ({digest[:12]}..) "
                  f"at {rpc.shown}", flush=True)
            start = follower.progress.blocks
            try:
                follower.run(until=lambda: blocks is not None
                             and follower.progress.blocks - start >= blocks,
                             last=args.until_block, poll_s=args.poll)
            finally:
                follower.close()
                if server is not None:
                    server.shutdown()
    except KeyboardInterrupt:
        return 130
    except (ChainError, PublishError, PirError, httpx.HTTPError, ValueError) as exc:
        raise CommandFailed(f"{type(exc).__name__}: {exc}") from None
    finally:
        for c in parties.clients:
            c.close()
    return 0


def _check_count(text: str) -> int | str:
    if text == "all":
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is neither a count nor 'all'")
    return int(text)


def add_parsers(sub: argparse._SubParsersAction) -> list[argparse.ArgumentParser]:
    ch = sub.add_parser("chain", help="Ethereum state into keyword tables",
                        description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    acts = ch.add_subparsers(dest="chain_action", required=True, metavar="ACTION")
    ex = acts.add_parser("export", help="write a node's state at its head block to a file")
    ex.add_argument("--rpc", required=True, metavar="URL", help="the node's JSON-RPC URL")
    ex.add_argument("--out", required=True, metavar="FILE", help="the state export to write")
    ex.add_argument("--chain-id", type=int, default=None, metavar="N",
                    help="refuse a node on another chain")
    ex.add_argument("--check", default=64, type=_check_count, metavar="N|all",
                    help="accounts asked again through the standard calls before writing "
                         "(default 64; all: every one)")
    ex.add_argument("--timeout", type=float, default=60.0, metavar="S",
                    help="seconds a node's answer may take")
    bd = acts.add_parser("build", help="a state export -> the accounts, storage and code "
                                       "tables in one owner directory")
    bd.add_argument("--state", required=True, metavar="FILE", help="a state export")
    bd.add_argument("--signing-key", required=True, metavar="FILE",
                    help="the owner's Ed25519 key (morphogen records keygen)")
    bd.add_argument("--out", required=True, metavar="DIR",
                    help="the owner directory to create (its v000001/snapshot is served)")
    bd.add_argument("--room", type=float, default=4.0, metavar="X",
                    help="slots for X times the records each table starts with, for the "
                         "chain to grow into (default 4)")
    bd.add_argument("--min-records", type=int, default=4096, metavar="N",
                    help="slots for at least N records a table (default 4096)")
    im = acts.add_parser("import", help="a node's state dump (geth's JSON lines or anvil's "
                                        "JSON) -> an owner directory, encoded on Ray")
    im.add_argument("--dump", required=True, metavar="FILE",
                    help="geth `dump --iterative` / `snapshot dump` output, or anvil's "
                         "--dump-state file")
    im.add_argument("--format", choices=("geth", "anvil"), default="geth",
                    help="the dump's format (default geth: JSON lines)")
    im.add_argument("--signing-key", required=True, metavar="FILE",
                    help="the owner's Ed25519 key (morphogen records keygen)")
    im.add_argument("--out", required=True, metavar="DIR",
                    help="the owner directory to create (`chain follow --owner` starts from it)")
    im.add_argument("--rpc", default=None, metavar="URL",
                    help="ask this node for the chain id and the block's hash (and check the "
                         "dump's state root against it)")
    im.add_argument("--chain-id", type=int, default=None, metavar="N", help="the chain's id")
    im.add_argument("--block", type=int, default=None, metavar="N",
                    help="the block the dump is at (anvil's dump says it)")
    im.add_argument("--block-hash", default=None, metavar="0x..", help="that block's hash")
    im.add_argument("--address", default=None, metavar="ADDR",
                    help="a Ray cluster to encode on (default: a local Ray instance)")
    im.add_argument("--workers", type=int, default=None, metavar="N",
                    help="ranges encoded at once (default: every CPU Ray has)")
    im.add_argument("--range-mb", type=float, default=32.0, metavar="MB",
                    help="MiB of the dump a task encodes (default 32)")
    im.add_argument("--room", type=float, default=4.0, metavar="X",
                    help="slots for X times the records each table starts with (default 4)")
    im.add_argument("--min-records", type=int, default=4096, metavar="N",
                    help="slots for at least N records a table (default 4096)")
    im.add_argument("--timeout", type=float, default=60.0, metavar="S",
                    help="seconds the node's answer may take (with --rpc)")
    im.add_argument("--log", default=None, metavar="FILE",
                    help="append the progress lines (records, records/s, time left) to FILE")
    fw = acts.add_parser("follow", help="apply every new block to the tables and publish it "
                                        "to both parties")
    fw.add_argument("--rpc", required=True, metavar="URL", help="the node's JSON-RPC URL")
    fw.add_argument("--owner", required=True, metavar="DIR",
                    help="the owner directory `chain build` made")
    fw.add_argument("--signing-key", required=True, metavar="FILE",
                    help="the owner's Ed25519 key the tables were built with")
    fw.add_argument("--server-a", required=True, metavar="URL", help="party A's URL")
    fw.add_argument("--server-b", required=True, metavar="URL", help="party B's URL")
    fw.add_argument("--confirmations", type=int, default=0, metavar="N",
                    help="follow N blocks behind the head (default 0)")
    fw.add_argument("--keep", type=int, default=64, metavar="K",
                    help="blocks whose changes are kept to revert a reorg (default 64)")
    add_publish_options(fw)
    fw.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                    help="serve Prometheus metrics (head, served block, lag, blocks/s) on "
                         "127.0.0.1:PORT/metrics")
    fw.add_argument("--poll", type=float, default=0.5, metavar="S",
                    help="seconds between looks at the node's head (default 0.5)")
    fw.add_argument("--timeout", type=float, default=60.0, metavar="S",
                    help="seconds a node's answer may take")
    fw.add_argument("--blocks", type=int, default=None, metavar="N",
                    help="stop after N blocks (default: follow until stopped)")
    fw.add_argument("--until-block", type=int, default=None, metavar="N",
                    help="stop once block N is published")
    ch.set_defaults(func=cmd_chain)
    return [ch]
