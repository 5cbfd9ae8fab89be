"""The keyword commands: `build --records`, `lookup`, and `records keygen|apply|publish`.

Thin over `morphogen.keyword`: parse, call, print one line per result; errors name the input.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

from cluster import inputs
from cluster.errors import CommandFailed, UsageError
from cluster.parties import add_publish_options, admin_parties
from cluster.report import eprint

RECORDS_FORMAT = ('JSON lines {"key": K, "value": V} or CSV rows K,V; a key or value is '
                  '0x-prefixed hex or text')
CHANGES_FORMAT = ('JSON lines {"op": "put", "key": K, "value": V} (insert or change) or '
                  '{"op": "delete", "key": K}')


def _key_arg(text: str) -> bytes:
    from morphogen.keyword.records import RecordError, decode_field

    try:
        return decode_field(text, "KEY", "key")
    except RecordError as exc:
        raise UsageError(str(exc)) from None


def build_records(args: argparse.Namespace) -> int:
    from morphogen.keyword import RecordError, TableFullError, build_table, read_records
    from morphogen.keyword.owner import create_owner_dir
    from morphogen.keyword.signing import load_signing_key
    from morphogen.storage.location import is_remote

    if is_remote(args.out):  # the owner's versions and keys are its local state
        raise UsageError(f"--out {args.out}: a keyword table is built into a local owner "
                         "directory; push its snapshot after (morphogen snapshot push "
                         "DIR/v000001/snapshot URI)")
    if not args.signing_key:
        raise UsageError("--records needs --signing-key (make one: morphogen records keygen "
                         "--out owner.key)")
    if not args.value_size:
        raise UsageError("--records needs --value-size (bytes of every value)")
    try:
        key = load_signing_key(args.signing_key)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--signing-key {exc}") from None
    if (Path(args.out) / "owner.json").exists():
        raise UsageError(f"--out {args.out} already holds a keyword table; build into a new "
                         "directory")
    version = 1
    if args.after:
        from morphogen.keyword.owner import OwnerTable

        try:  # a rebuild goes on numbering: clients that read the old table accept the new
            version = OwnerTable(args.after).current + 1
        except (OSError, ValueError) as exc:
            raise UsageError(f"--after {exc}") from None
    try:
        table = build_table(read_records(args.records, args.format), value_size=args.value_size,
                            signing_key=key, layout=args.layout, row_size=args.row_size,
                            num_buckets=args.buckets, version=version,
                            anchor=_anchor(args.anchor))
        snapshot = create_owner_dir(table, args.out, full_every=args.full_every,
                                    keep=args.keep)
    except (RecordError, TableFullError) as exc:
        raise UsageError(f"--records {exc}") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    d, s = table.descriptor, table.stats
    print(f"table {args.out} version {d.version}: {d.records} records in "
          f"{d.geometry.num_buckets} {d.geometry.layout} buckets ({s.load:.1%} of "
          f"{s.capacity} slots), {d.geometry.num_pages} pages, {s.seconds:.1f} s")
    print(f"serve this snapshot on both parties: {snapshot}")
    print(f"clients need the public key: {d.public_key.hex()}")
    return 0


def cmd_lookup(args: argparse.Namespace) -> int:
    from morphogen.client import PirClient, PirError, PirUnavailable
    from morphogen.keyword import (
        KeywordClient,
        KeywordIntegrityError,
        StaleTableError,
        TableChangingError,
    )
    from morphogen.keyword.lookup import dataset_id

    url_a, url_b = inputs.two_parties(args.server_a, args.server_b)
    keys = [_key_arg(k) for k in args.keys]
    try:
        dataset_id(args.dataset)  # the client's own parse, refused here as a usage error
    except ValueError as exc:
        raise UsageError(f"--dataset: {exc}") from None
    try:
        with PirClient(url_a, url_b, encoding=args.encoding, timeout_s=args.timeout) as pir:
            values = KeywordClient(pir, args.public_key, min_version=args.min_version,
                                   min_block=args.min_block, max_age=args.max_age,
                                   table=args.table, dataset=args.dataset).get_many(keys)
    except StaleTableError as exc:
        raise CommandFailed(f"stale table: {exc}") from None
    except TableChangingError as exc:
        raise CommandFailed(f"{exc} (the table changed at every try: run it again)") from None
    except KeywordIntegrityError as exc:
        raise CommandFailed(f"integrity: {exc}") from None
    except PirUnavailable as exc:
        raise CommandFailed(f"{exc} (check that both parties are serving)") from None
    except (PirError, ValueError, OSError) as exc:
        raise CommandFailed(str(exc)) from None
    missing = 0
    for text, value in zip(args.keys, values, strict=True):
        if value is None:
            missing += 1
            print(f"{text}\tabsent")
        else:
            print(f"{text}\t0x{value.hex()}")
    return 1 if missing and args.fail_absent else 0


def _sample(args: argparse.Namespace) -> int:
    import json

    from morphogen.keyword.accounts import ACCOUNT_VALUE_SIZE, synthetic_accounts
    from morphogen.storage.durable import write_atomic

    out = Path(args.out)
    if out.exists() and not args.force:
        raise UsageError(f"--out {out} exists (--force replaces it)")
    pairs = synthetic_accounts(args.accounts, seed=args.seed)
    csv = out.suffix.lower() == ".csv"
    lines = (f"0x{k.hex()},0x{v.hex()}\n" if csv else
             json.dumps({"key": f"0x{k.hex()}", "value": f"0x{v.hex()}"}) + "\n"
             for k, v in pairs)
    write_atomic(out, (line.encode() for line in lines))
    print(f"{len(pairs)} synthetic accounts in {out} (20-byte addresses; {ACCOUNT_VALUE_SIZE}-byte "
          f"values: balance u128, nonce u64, code id u64, little-endian); "
          f"e.g. 0x{pairs[0][0].hex()}")
    return 0


def cmd_records(args: argparse.Namespace) -> int:
    if args.records_action == "sample":
        return _sample(args)
    if args.records_action == "keygen":
        from morphogen.keyword.signing import generate_key_files

        try:
            private, public = generate_key_files(args.out)
        except FileExistsError:
            raise UsageError(f"--out {args.out} exists: a signing key is never overwritten "
                             "(every table signed with it would be orphaned)") from None
        print(f"signing key {private} (keep it private), public key {public}: "
              f"{public.read_text().strip()}")
        return 0
    from morphogen.keyword.owner import OwnerTable

    try:
        owner = OwnerTable(args.owner)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--owner {exc}") from None
    if args.records_action == "export":
        _export(owner, args)
        return 0
    from morphogen.keyword.owner import WriterBusy, writer_lock

    try:
        lock = writer_lock(owner.root)
    except WriterBusy as exc:
        raise CommandFailed(str(exc)) from None
    with lock:
        if args.records_action == "apply":
            _apply(owner, args)
        if args.records_action == "publish" or args.server:
            _publish(owner, args)
    return 0


def _apply(owner, args: argparse.Namespace) -> None:
    from morphogen.keyword import RecordError, TableFullError
    from morphogen.keyword.editor import read_changes
    from morphogen.keyword.signing import load_signing_key

    try:
        key = load_signing_key(args.signing_key)
        changes = read_changes(args.changes)
        digest = hashlib.blake2b(Path(args.changes).read_bytes(), digest_size=16).hexdigest()
        # under the writer lock: the current pages and keys mapped from working/ (kept for the
        # next apply), not read into memory, as a follower holds them
        owner.map_working_pages()
        version, batch = owner.apply(changes, key, changes_id=digest,
                                     anchor=_anchor(args.anchor))
    except (RecordError, TableFullError) as exc:
        raise UsageError(f"{args.changes}: {exc}") from None
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if changes and not batch:
        print(f"version {version} already holds {args.changes} (the last changes applied): "
              "nothing applied again")
        return
    print(f"version {version}: {len(changes)} change(s), {len(batch)} page(s) changed "
          "(records, tree paths and the signed descriptor)")


def _anchor(text: str | None):
    """CHAIN_ID:NUMBER:0xHASH -> the chain block a version reflects."""
    if not text:
        return None
    from morphogen.keyword.descriptor import Anchor

    try:
        chain, number, digest = text.split(":")
        return Anchor(int(chain), int(number), digest.lower())
    except ValueError as exc:
        raise UsageError(f"--anchor {text}: expected CHAIN_ID:NUMBER:0xHASH ({exc})") from None


def _publish(owner, args: argparse.Namespace) -> None:
    import httpx

    from morphogen.client import PirError
    from morphogen.keyword.publishing import PublishError, publish
    from morphogen.snapshot.manifest import SnapshotError
    from morphogen.storage import StorageError

    parties = admin_parties(args.server or [], args)
    clients, servers = parties.clients, [c.url for c in parties.clients]
    try:
        done = publish(owner, parties, snapshot_dir=args.snapshot_dir)
    except PublishError as exc:
        raise UsageError(str(exc)) from None
    except (PirError, OSError, httpx.HTTPError, SnapshotError, StorageError) as exc:
        raise CommandFailed(f"{type(exc).__name__}: {exc} (re-run `morphogen records publish`:"
                            " a party that has a version answers it as done)") from None
    finally:
        for c in clients:
            c.close()
    if not done:
        eprint("nothing to publish: both parties were sent every version")
    for p in done:
        epochs = ", ".join(f"{u} epoch {r.get('epoch_id')}" for u, r in
                           zip(servers, p.results, strict=True))
        how = "as a rotation to its snapshot" if p.mode == "rotation" else "as one batch"
        print(f"version {p.version} published ({p.pages} pages, {how}): {epochs}")


def _export(owner, args: argparse.Namespace) -> None:
    import json

    from morphogen.storage.durable import write_atomic

    pairs = owner.records()
    lines = (json.dumps({"key": f"0x{k.hex()}", "value": f"0x{v.hex()}"}) + "\n"
             for k, v in pairs)
    write_atomic(args.out, (line.encode() for line in lines))
    print(f"{len(pairs)} records of version {owner.current} in {args.out} (rebuild: morphogen "
          f"build --records {args.out} --value-size {len(pairs[0][1]) if pairs else 'N'} ...)")


def add_build_options(bld: argparse.ArgumentParser, src: argparse._MutuallyExclusiveGroup
                      ) -> None:
    src.add_argument("--records", metavar="FILE",
                     help=f"records -> a signed keyword table ({RECORDS_FORMAT}); --out is then "
                          "the owner directory")
    bld.add_argument("--format", choices=["jsonl", "csv"], default=None,
                     help="records file format (default: from its suffix)")
    bld.add_argument("--value-size", type=inputs.positive_int, metavar="BYTES",
                     help="bytes of every value (records)")
    bld.add_argument("--signing-key", metavar="FILE", help="the owner's Ed25519 key (records)")
    bld.add_argument("--layout", choices=["page", "row"], default="page",
                     help="page: a bucket is a page (fills best); row: the reference's "
                          "one-row buckets (records)")
    bld.add_argument("--row-size", type=inputs.positive_int, default=0, metavar="BYTES",
                     help="row bytes of the row layout, a divisor of 4096")
    bld.add_argument("--full-every", type=inputs.non_negative_int, default=0, metavar="N",
                     help="the owner also keeps a full copy every N versions (records; "
                          "default 0: only once the versions since the last full copy "
                          "changed as many pages as the table holds)")
    bld.add_argument("--keep", type=inputs.positive_int, default=4, metavar="K",
                     help="published versions the owner keeps readable besides the "
                          "unpublished ones (records; default 4)")
    bld.add_argument("--after", metavar="DIR", default=None,
                     help="a rebuild: number the table's first version after the current "
                          "version of this owner directory, so clients that read the old "
                          "table accept the new (records)")
    bld.add_argument("--anchor", metavar="CHAIN:NUMBER:HASH", default=None,
                     help="the chain block the table reflects, signed into its descriptor "
                          "(records)")
    bld.add_argument("--buckets", type=inputs.positive_int, default=None, metavar="N",
                     help="fixed bucket count (refused when the records do not fit; default: "
                          "sized for the records)")


def add_parsers(sub: argparse._SubParsersAction) -> list[argparse.ArgumentParser]:
    lk = sub.add_parser("lookup", help="look keys up privately in a keyword table, verified",
                        description="Each key is one query of three keys to both parties; "
                                    "every page of the answer is checked against the owner's "
                                    "signature. Prints KEY<TAB>0xVALUE or KEY<TAB>absent.")
    lk.add_argument("--server-a", required=True, metavar="URL", help="party A's URL")
    lk.add_argument("--server-b", required=True, metavar="URL", help="party B's URL")
    lk.add_argument("--public-key", required=True, metavar="HEX|FILE",
                    help="the data owner's public key (64 hex digits, or the .pub file)")
    lk.add_argument("--encoding", default="msgpack", choices=["json", "msgpack"],
                    help="request and answer body encoding (default msgpack)")
    lk.add_argument("--timeout", type=float, default=30.0, metavar="S",
                    help="seconds per request (default 30)")
    lk.add_argument("--fail-absent", action="store_true", help="exit 1 when a key is absent")
    lk.add_argument("--min-version", type=int, default=0, metavar="V",
                    help="refuse a table older than version V (a version seen elsewhere)")
    lk.add_argument("--min-block", type=int, default=0, metavar="N",
                    help="refuse a table that reflects a block before N")
    lk.add_argument("--max-age", type=float, default=None, metavar="S",
                    help="refuse a version the owner made more than S seconds ago")
    lk.add_argument("--table", default="", metavar="NAME",
                    help="the keyword table to read where the parties serve several (a "
                         "chain's accounts, storage, code)")
    lk.add_argument("--dataset", default=None, metavar="HEX",
                    help="the table's dataset id (owner.json's \"dataset\"): refuse a table "
                         "built apart and signed with the same key")
    lk.add_argument("keys", nargs="+", metavar="KEY", help="0x-hex or text")
    lk.set_defaults(func=cmd_lookup)

    rec = sub.add_parser("records", help="the data owner's keyword table: keys, changes, "
                                         "publication",
                         description=f"Changes file: {CHANGES_FORMAT}.")
    acts = rec.add_subparsers(dest="records_action", required=True, metavar="ACTION")
    sm = acts.add_parser("sample", help="a records file of synthetic Ethereum-like accounts, to "
                                        "try `build --records` with")
    sm.add_argument("--accounts", type=inputs.positive_int, default=10_000, metavar="N",
                    help="how many (default 10000)")
    sm.add_argument("--out", required=True, metavar="FILE",
                    help="records file to write: JSON lines, or CSV when it ends in .csv")
    sm.add_argument("--seed", type=int, default=0, help="the same seed, the same accounts")
    sm.add_argument("--force", action="store_true", help="replace --out if it exists")
    kg = acts.add_parser("keygen", help="a new Ed25519 signing key (+ .pub beside it)")
    kg.add_argument("--out", required=True, metavar="FILE",
                    help="the private key file to create (never overwritten); FILE.pub beside")
    ap = acts.add_parser("apply", help="apply a changes file as the next version (and publish "
                                       "it with --server twice)")
    ap.add_argument("--owner", required=True, metavar="DIR",
                    help="the owner directory `build --records` made")
    ap.add_argument("--signing-key", required=True, metavar="FILE",
                    help="the owner's Ed25519 key the table was built with")
    ap.add_argument("changes", metavar="CHANGES", help="changes file (JSON lines, see above)")
    ap.add_argument("--anchor", metavar="CHAIN:NUMBER:HASH", default=None,
                    help="the chain block the new version reflects, signed into its descriptor")
    pb = acts.add_parser("publish", help="send every unpublished version to both parties")
    pb.add_argument("--owner", required=True, metavar="DIR",
                    help="the owner directory `build --records` made")
    ex = acts.add_parser("export", help="write the current records as a records file "
                                        "(JSON lines) that `build --records` reads")
    ex.add_argument("--owner", required=True, metavar="DIR",
                    help="the owner directory `build --records` made")
    ex.add_argument("--out", required=True, metavar="FILE", help="records file to write")
    for p in (ap, pb):
        p.add_argument("--server", action="append", metavar="URL",
                       help="a party's URL; twice (A, then B)")
        add_publish_options(p)
    for p in (kg, sm, ex):
        p.set_defaults(server=None)
    rec.set_defaults(func=cmd_records)
    return [lk, rec]
