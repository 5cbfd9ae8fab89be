"""`morphogen chain export|build`: a node's state at one block into keyword tables.

`export` writes the state export file (`morphogen.chain.export`) from a node, checked against
the node's standard answers; `build` turns one into the three owner directories of the
accounts, storage and code tables, each version 1 anchored at the export's block (chain id,
number, hash), ready to serve and to update."""

from __future__ import annotations

import argparse
from pathlib import Path

from cluster.errors import CommandFailed, UsageError

TABLES = ("accounts", "storage", "code")


def cmd_chain(args: argparse.Namespace) -> int:
    if args.chain_action == "export":
        return _export(args)
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
    from morphogen.chain.state import ACCOUNT_VALUE_SIZE, CODE_VALUE_SIZE, STORAGE_VALUE_SIZE
    from morphogen.keyword import build_table
    from morphogen.keyword.descriptor import Anchor
    from morphogen.keyword.owner import create_owner_dir
    from morphogen.keyword.signing import load_signing_key

    out = Path(args.out)
    taken = [name for name in TABLES if (out / name).exists()]
    if taken:
        raise UsageError(f"--out {out}: {', '.join(taken)} already exist(s); build into a new "
                         "directory")
    try:
        key = load_signing_key(args.signing_key)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--signing-key {exc}") from None
    try:
        header = read_header(args.state)
        records = state_records(args.state)
        anchor = Anchor(header.chain_id, header.block.number, header.block.hash)
        sizes = {"accounts": ACCOUNT_VALUE_SIZE, "storage": STORAGE_VALUE_SIZE,
                 "code": CODE_VALUE_SIZE}
        for name in TABLES:
            table = build_table(getattr(records, name), value_size=sizes[name],
                                signing_key=key, anchor=anchor)
            snapshot = create_owner_dir(table, out / name)
            g = table.descriptor.geometry
            print(f"{name}: {table.descriptor.records} records, {g.num_pages} pages; serve "
                  f"{snapshot}")
    except (ExportError, OSError) as exc:
        raise UsageError(f"--state {args.state}: {exc}") from None
    except ValueError as exc:  # a record the table refuses (RecordError, TableFullError)
        raise UsageError(f"--state {args.state}: {exc}") from None
    print(f"block {header.block.number} ({header.block.hash}) of chain {header.chain_id}; "
          f"clients need the public key: {table.descriptor.public_key.hex()}")
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
    bd = acts.add_parser("build", help="a state export -> accounts, storage and code tables")
    bd.add_argument("--state", required=True, metavar="FILE", help="a state export")
    bd.add_argument("--signing-key", required=True, metavar="FILE",
                    help="the owner's Ed25519 key (morphogen records keygen)")
    bd.add_argument("--out", required=True, metavar="DIR",
                    help="where the accounts/, storage/ and code/ owner directories go")
    ch.set_defaults(func=cmd_chain)
    return [ch]
