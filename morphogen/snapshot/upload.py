"""Pushing a local snapshot to object storage: `push_snapshot`, what `morphogen snapshot push`
and `morphogen build --out s3://...` run.

The order makes a push safe to kill and to run again. The local snapshot is verified whole
before any byte leaves; the data object goes up next, each piece hashed again as it is read,
so that what lands is what was checked even if the file changes meanwhile; the manifest goes
last, created only where none exists. Readers find a snapshot by its manifest, so they see
either none or one whose data is complete, and a killed push leaves no manifest: running it
again uploads the data again and completes it. A prefix that already holds a manifest is never
written: the same snapshot there is success, another one is refused.

Two pushes of different snapshots to one prefix at the same moment are not arbitrated beyond
the manifest's create-only write: one manifest wins, but the loser's data may land over the
winner's. Readers would refuse those chunks (they check every chunk's hash); each snapshot
belongs under a prefix of its own (``.../epoch-N``), which keeps that from happening.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import obstore
from obstore.exceptions import AlreadyExistsError, PreconditionError

from morphogen.constants import PAGE_SIZE
from morphogen.snapshot.hashes import chunk_pages_range, new_hasher
from morphogen.snapshot.manifest import MANIFEST_FILE, Manifest, SnapshotError
from morphogen.snapshot.progress import Meter, Progress
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.remote import remote_manifest
from morphogen.storage.location import (
    REMOTE_SCHEMES,
    WRITABLE_SCHEMES,
    Location,
    StorageError,
    open_location,
)
from morphogen.storage.settings import current as current_settings
from morphogen.storage.store_errors import store_failure

# Bytes read, hashed and handed to the uploader at a time: small next to a part, so reading
# and hashing keep up with the parts in flight without holding a chunk (64 MiB) in memory.
PIECE_BYTES = 8 << 20
# S3 takes at most 10,000 parts per upload, each at least 5 MiB: parts grow with the object
# so that 64 GiB goes in 4,096 parts of 16 MiB and the largest snapshot still fits.
MIN_PART_BYTES = 16 << 20
MAX_PARTS = 9_000


@dataclass(frozen=True)
class Pushed:
    """Where a snapshot now is, and whether this push uploaded it (False: it was there)."""

    uri: str
    manifest: Manifest
    uploaded: bool


def check_push_target(uri: str) -> None:
    """Refuse a URI a snapshot cannot be pushed to, naming what can take one."""
    scheme = urlsplit(uri).scheme.lower()
    if scheme in REMOTE_SCHEMES and scheme not in WRITABLE_SCHEMES:
        raise ValueError(f"{uri}: a web server serves snapshots but cannot be written; push "
                         "to s3://BUCKET/PREFIX or gs://BUCKET/PREFIX and serve it from there")
    if scheme not in WRITABLE_SCHEMES:
        raise ValueError(f"{uri}: not an object store: push to s3://BUCKET/PREFIX or "
                         "gs://BUCKET/PREFIX (a local snapshot is the directory `morphogen "
                         "build --out DIR` writes)")
    if uri.rstrip("/").lower().endswith(".json"):
        raise ValueError(f"{uri}: name the snapshot's prefix (s3://BUCKET/snapshots/epoch-7); "
                         f"its {MANIFEST_FILE} is written under it")


def probe_target(uri: str) -> None:
    """Refuse, before a long build, a target a push could not complete: one that cannot take
    a snapshot, a missing bucket, a store that refuses reads."""
    check_push_target(uri)
    _remote_at(open_location(uri))


def part_bytes(size: int) -> int:
    """The multipart part size for an object of `size` bytes (whole MiB)."""
    per_part = -(-size // MAX_PARTS)
    return max(MIN_PART_BYTES, -(-per_part // (1 << 20)) << 20)


def _local_manifest(path: Path) -> tuple[Path, bytes, Manifest]:
    """(the manifest's path, its bytes as written, what they say) of a local snapshot."""
    if path.is_dir():
        manifest_path = path / MANIFEST_FILE
    elif path.suffix.lower() == ".json":
        manifest_path = path
    elif path.is_file():
        raise SnapshotError(f"{path}: a bare page file has no manifest to push: make it a "
                            f"snapshot first (morphogen build --raw {path} --out DIR)")
    else:
        raise SnapshotError(f"{path}: no such snapshot directory")
    try:
        raw = manifest_path.read_bytes()
    except FileNotFoundError:
        raise SnapshotError(f"{path}: no {MANIFEST_FILE} here (push the directory `morphogen "
                            "build --out DIR` wrote)") from None
    except OSError as exc:
        raise SnapshotError(f"{manifest_path}: cannot read the manifest: {exc}") from None
    try:
        # the bytes uploaded are these very bytes, so they are parsed here, not read again
        manifest = Manifest.from_dict(json.loads(raw), where=str(manifest_path))
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"{manifest_path}: manifest is not valid JSON: {exc}") from None
    if manifest.chunk_hashes is None or manifest.checksum is None:
        raise SnapshotError(f"{manifest_path}: an older manifest without chunk hashes cannot "
                            "be read remotely: rebuild the snapshot (morphogen build --raw "
                            f"{manifest_path.parent / manifest.data_file} --out NEW_DIR) and "
                            "push that")
    return manifest_path, raw, manifest


def _remote_at(loc: Location) -> Manifest | None:
    """The manifest under `loc`, None where there is none."""
    where = f"{loc.uri}/{MANIFEST_FILE}"
    try:
        raw = bytes(obstore.get(loc.store, loc.key(MANIFEST_FILE)).bytes())
    except FileNotFoundError as exc:
        # S3 answers a missing bucket as a missing key: said now, not after the verification
        if "NoSuchBucket" in str(exc):
            raise store_failure(loc.uri, "cannot push there", exc) from None
        return None
    except Exception as exc:  # noqa: BLE001 - a store failure is one line naming the URI
        raise store_failure(where, "cannot read", exc) from None
    try:
        return remote_manifest(raw, where)
    except ValueError as exc:
        raise SnapshotError(f"{loc.uri} already holds a {MANIFEST_FILE} that is not a "
                            f"snapshot's ({exc}); push to a new prefix") from None


def _same_or_refuse(loc: Location, there: Manifest, ours: Manifest, *,
                    uploaded: bool = False) -> None:
    """Return where the manifest under `loc` names the same snapshot as ours, else refuse.
    The root names the bytes; the epoch and the domain are what a party serves them as."""
    same = (there.root, there.epoch_id, there.domain_bits, there.data_file) == (
        ours.root, ours.epoch_id, ours.domain_bits, ours.data_file)
    if not same:
        what = ("another push wrote its manifest meanwhile, and this one's data may have "
                "landed over its data" if uploaded else "nothing was uploaded")
        raise SnapshotError(f"{loc.uri} already holds another snapshot (epoch "
                            f"{there.epoch_id}, {there.root}), not this one (epoch "
                            f"{ours.epoch_id}, {ours.root}): push each snapshot to a new "
                            f"prefix; {what}")


def _check_data(loc: Location, manifest: Manifest) -> None:
    """The data object the manifest names is there, as long as it says."""
    where = f"{loc.uri}/{manifest.data_file}"
    try:
        size = obstore.head(loc.store, loc.key(manifest.data_file))["size"]
    except FileNotFoundError:
        raise SnapshotError(f"{loc.uri} holds this snapshot's manifest but no "
                            f"{manifest.data_file}: its data was removed") from None
    except Exception as exc:  # noqa: BLE001 - a store failure is one line naming the URI
        raise store_failure(where, "cannot check the data object", exc) from None
    if size != manifest.data_bytes:
        raise SnapshotError(f"{where} has {size} bytes, its manifest says "
                            f"{manifest.data_bytes}: the object was replaced")


def _pread(fd: int, size: int, offset: int, where: Path) -> bytes:
    out = bytearray()
    while len(out) < size:
        try:
            got = os.pread(fd, size - len(out), offset + len(out))
        except OSError as exc:
            raise SnapshotError(f"{where}: cannot read: {exc}") from None
        if not got:
            raise SnapshotError(f"{where}: shorter than its manifest says (truncated since it "
                                "was verified?): nothing was published")
        out += got
    return bytes(out)


def _verified_pieces(data_path: Path, manifest: Manifest, meter: Meter) -> Iterator[bytes]:
    """The data file in pieces, each chunk's hash checked before the next piece (and before
    the end: the upload completes only once this is exhausted)."""
    m = manifest
    assert m.chunk_hashes is not None
    fd = os.open(data_path, os.O_RDONLY)
    try:
        for c, want in enumerate(m.chunk_hashes):
            a, b = chunk_pages_range(c, m.num_pages, m.chunk_pages)
            lo, hi = a * PAGE_SIZE, min(b * PAGE_SIZE, m.data_bytes)
            hasher = new_hasher()
            for off in range(lo, hi, PIECE_BYTES):
                piece = _pread(fd, min(PIECE_BYTES, hi - off), off, data_path)
                hasher.update(piece)
                yield piece
                meter.advance(len(piece))
            if b * PAGE_SIZE > hi:  # a ragged last page is hashed zero-padded, stored as is
                hasher.update(bytes(b * PAGE_SIZE - hi))
            if hasher.hexdigest() != want:
                raise SnapshotError(f"{data_path}: chunk {c} (pages {a}..{b - 1}) changed "
                                    "since it was verified: nothing was published")
    finally:
        os.close(fd)
    meter.finish()


def _upload_data(loc: Location, data_path: Path, manifest: Manifest,
                 progress: Progress) -> None:
    where = f"{loc.uri}/{manifest.data_file}"
    meter = Meter(progress, manifest.data_bytes, f"uploading {where}")
    try:
        obstore.put(loc.store, loc.key(manifest.data_file),
                    _verified_pieces(data_path, manifest, meter),
                    chunk_size=part_bytes(manifest.data_bytes),
                    # parts in flight (memory: this many parts): the store concurrency setting
                    max_concurrency=current_settings().concurrency)
    except SnapshotError:
        raise
    except Exception as exc:  # noqa: BLE001 - a store failure is one line naming the URI
        raise store_failure(where, "upload failed (no manifest was written: push again)",
                            exc) from None


def _create_manifest(loc: Location, raw: bytes) -> None:
    """Create the manifest where none exists; one created meanwhile is left as it is."""
    try:
        obstore.put(loc.store, loc.key(MANIFEST_FILE), raw, mode="create")
    except (AlreadyExistsError, PreconditionError):
        pass  # another push got there first: the check after this says whose it is
    except Exception as exc:  # noqa: BLE001 - a store failure is one line naming the URI
        raise store_failure(f"{loc.uri}/{MANIFEST_FILE}", "cannot write the manifest", exc
                            ) from None


def push_snapshot(local: str | os.PathLike[str], target: str, *,
                  progress: Progress = True) -> Pushed:
    """Push the snapshot in directory `local` (or named by its manifest) to the object-store
    prefix `target`: verified, data first, manifest last (see the module docstring).

    Refusals (a target that cannot take it, a snapshot that does not verify, another snapshot
    at the target) are SnapshotError or ValueError; store failures are StorageError, each one
    line naming the URI.
    """
    check_push_target(target)
    loc = open_location(target)
    manifest_path, raw, manifest = _local_manifest(Path(local).expanduser())
    there = _remote_at(loc)
    if there is not None:
        # a re-run after a complete push, or another snapshot: verifying the local copy again
        # would decide nothing, the target's manifest does
        _same_or_refuse(loc, there, manifest)
        _check_data(loc, manifest)
        return Pushed(loc.uri, manifest, uploaded=False)
    with Snapshot.open(manifest_path, verify=True, progress=progress) as snap:
        if snap.manifest != manifest:
            raise SnapshotError(f"{manifest_path} changed while it was read: push again")
        _upload_data(loc, snap.data_path, manifest, progress)
    _create_manifest(loc, raw)
    there = _remote_at(loc)
    if there is None:
        raise StorageError(f"{loc.uri}/{MANIFEST_FILE}: written, but not there when read "
                           "back")
    _same_or_refuse(loc, there, manifest, uploaded=True)
    _check_data(loc, manifest)
    return Pushed(loc.uri, manifest, uploaded=True)
