"""The snapshot commands: `build --raw|--synthetic` (into a directory, or into object storage
through a temporary one) and `snapshot push`.

Thin over `morphogen.snapshot` (`writer`, `synthetic`, `upload`): parse, call, print one line;
errors name the input and the fix. A refusal exits 2, a store that fails exits 1."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

from cluster import inputs
from cluster.errors import CommandFailed, UsageError
from cluster.report import eprint

PUSH_EXAMPLES = """\
examples:
  morphogen snapshot push /data/snap s3://bucket/snapshots/epoch-7
  morphogen snapshot push /data/snap gs://bucket/snapshots/epoch-7

The data object goes first, the manifest last: a push that stops midway leaves no manifest,
and running it again completes it. A prefix holding the same snapshot is left as it is (exit
0); one holding another snapshot is refused."""


def _describe(where: str, m: Any) -> str:
    return (f"snapshot {where}: {m.num_pages} pages, domain {m.domain_bits} bits, "
            f"epoch {m.epoch_id}, {m.checksum}")


def _write_local(args: argparse.Namespace, out: str, label: str) -> Any:
    """Build the --raw or --synthetic snapshot into the directory `out`; its manifest.
    `label` names that directory as the operator chose it (`--out DIR`, `--work-dir DIR`)."""
    from morphogen.snapshot.manifest import SnapshotError
    from morphogen.snapshot.synthetic import build_synthetic
    from morphogen.snapshot.writer import import_raw

    if args.raw:
        inputs.whole_pages(f"--raw {args.raw}", Path(args.raw), args.pad_last_page)
    try:
        tables = getattr(args, "table", None)
        if args.raw:
            return import_raw(args.raw, out, epoch_id=args.epoch, progress=True,
                              overwrite=args.force, tables=tables)
        return build_synthetic(out, args.synthetic, seed=args.seed, epoch_id=args.epoch,
                               progress=True, overwrite=args.force, tables=tables)
    except SnapshotError as exc:
        if "already holds a snapshot" in str(exc):
            raise UsageError(f"--out {exc} (--force overwrites)") from None
        raise UsageError(f"--raw {exc}" if args.raw else str(exc)) from None
    except OSError as exc:
        raise UsageError(f"{label}: cannot write the snapshot ({exc})") from None


def push(local: str | Path, target: str) -> Any:
    """`morphogen.snapshot.upload.push_snapshot`, its failures as the command line's (each
    message names the snapshot or the URI already)."""
    from morphogen.snapshot.upload import push_snapshot
    from morphogen.storage import StorageError

    try:
        pushed = push_snapshot(local, target, progress=True)
    except StorageError as exc:
        raise CommandFailed(str(exc)) from None
    except ValueError as exc:  # SnapshotError included: a refusal, the same on every run
        raise UsageError(str(exc)) from None
    if not pushed.uploaded:
        eprint(f"{pushed.uri} already holds this snapshot ({pushed.manifest.root}): nothing "
               "uploaded")
    return pushed


def _work_dir(args: argparse.Namespace) -> Path:
    from morphogen.snapshot.open import default_cache_dir

    # beside the chunk cache, not in it: the cache evicts whatever no process holds
    work = Path(args.work_dir) if args.work_dir else default_cache_dir().parent / "builds"
    try:
        work.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="build-", dir=work))
    except OSError as exc:
        raise UsageError(f"--work-dir {work}: cannot build there ({exc})") from None


def _build_to_store(args: argparse.Namespace) -> int:
    from morphogen.snapshot.upload import probe_target
    from morphogen.storage import StorageError

    target = args.out
    try:  # before the build, which may take long: a target that cannot take it fails now
        probe_target(target)
    except ValueError as exc:
        raise UsageError(f"--out {exc}") from None
    except StorageError as exc:
        raise CommandFailed(str(exc)) from None
    if args.force:
        raise UsageError(f"--out {target}: a snapshot in object storage is never overwritten "
                         "(--force is for directories); build into a new prefix")
    tmp = _work_dir(args)
    local = tmp / "snapshot"
    try:
        _write_local(args, str(local), f"--work-dir {tmp.parent}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # from here on a failed push keeps the build: it took as long as the data is large
    kept = f"the built snapshot is kept in {local} for `morphogen snapshot push`"
    try:
        pushed = push(local, target)
    except (UsageError, CommandFailed) as exc:
        raise type(exc)(f"{exc} ({kept})") from None
    except BaseException:
        eprint(kept)
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    print(_describe(pushed.uri, pushed.manifest))
    return 0


def build(args: argparse.Namespace) -> int:
    """`morphogen build --raw|--synthetic`: a snapshot directory, or an object-store prefix."""
    from morphogen.storage.location import is_remote

    if is_remote(args.out):
        return _build_to_store(args)
    m = _write_local(args, args.out, f"--out {args.out}")
    print(_describe(args.out, m))
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    pushed = push(args.local, args.target)
    print(_describe(pushed.uri, pushed.manifest))
    return 0


def add_build_options(bld: argparse.ArgumentParser) -> None:
    bld.add_argument("--work-dir", metavar="DIR",
                     help="with an s3:// or gs:// --out, build here before the upload, removed "
                          "after (default: builds/ in the cache directory, $MORPHOGEN_CACHE_DIR "
                          "or ~/.cache/morphogen)")


def add_parsers(sub: argparse._SubParsersAction) -> list[argparse.ArgumentParser]:
    snap = sub.add_parser("snapshot", help="copy a snapshot to object storage",
                          description="Snapshots in object storage (S3, GCS).")
    acts = snap.add_subparsers(dest="snapshot_action", required=True, metavar="ACTION")
    ps = acts.add_parser("push", help="upload a local snapshot, verified, manifest last",
                         description="Verify a local snapshot (every chunk against its "
                                     "manifest), then upload its data and, last, its manifest.",
                         epilog=PUSH_EXAMPLES,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    ps.add_argument("local", metavar="LOCAL_SNAPSHOT_DIR",
                    help="the snapshot directory `morphogen build` wrote (or its manifest)")
    ps.add_argument("target", metavar="URI",
                    help="the prefix to hold it: s3://BUCKET/PREFIX or gs://BUCKET/PREFIX, one "
                         "per snapshot (e.g. .../epoch-7)")
    ps.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                    help="show the traceback of an unexpected error")
    snap.set_defaults(func=cmd_snapshot)
    return [snap]
