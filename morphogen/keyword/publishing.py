"""Publishing the owner's versions to both parties, whatever their size.

Each unpublished version goes, in order, as ONE publication under one id
(`OwnerTable.publication_id`), in one of two forms chosen once per version:

- *updates*: its batch of re-signed pages, whatever its size: a batch larger than the
  parties take in one request (the smaller of their `admin_max_updates`) goes in several
  requests of the one publication, which the last publishes whole (docs/publication.md);
- *rotation*: the version's full snapshot, written where the parties read snapshots
  (their `admin_snapshot_dir`, a local directory or an object-store prefix), then one
  rotation to it. Only for a version whose matrix has another page count (a table grew), or
  one that changed more than `ROTATE_ABOVE` of the matrix's pages where a snapshot
  directory is given: the parties then load the version instead of holding a pending batch
  nearly the table's size. A party verifies the snapshot and switches every shard in one
  step.

So what a block costs the parties grows with what it changed, not with the table.

The form (and, for a rotation, the path) is recorded in the owner's state before anything is
sent, and a re-run sends the recorded form under the same id: a party that has the version
answers "duplicate", one that lacks it applies it. So re-running after a crash at any step
(between the snapshot and the rotation, between the two parties, before the owner noted the
version as published) applies nothing twice and skips nothing. The owner directory's lock
covers its state (read before a version is sent, written after), not the sends: the next
version can be made while one travels. Two publishers of one owner send the same versions
under the same ids in the same order, so each party applies each once; the publishers' parent
check (`morphogen.client.admin.publish_to_parties`) keeps A and B on one sequence.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from morphogen.keyword.descriptor import tables_of
from morphogen.keyword.owner import RESIZED, OwnerTable
from morphogen.protocol.changes import ChangeBatch
from morphogen.snapshot.reader import Snapshot
from morphogen.snapshot.writer import write_snapshot
from morphogen.storage.location import is_remote

ROTATE_ABOVE = 0.5  # of the matrix's pages: a version changing more may go as a rotation
# owner.json: version -> {"mode": "updates", "digest": 2} or {"mode": "rotation", "path": ..}
MODES = "modes"


class Parties(Protocol):
    """Both parties, as the owner publishes to them (`cluster.parties` sends over HTTP)."""

    def max_updates(self) -> int:
        """The largest batch both parties take in one request (a larger one goes in parts,
        `cluster.parties.HttpParties`)."""
        ...

    def digest_version(self) -> int:
        """The batch digest version both parties take (`AdminClient.batch_digests`)."""
        ...

    def updates(self, publication: str, batch: ChangeBatch) -> Sequence[dict]: ...

    def snapshot(self, publication: str, path: str) -> Sequence[dict]: ...


class PublishError(RuntimeError):
    """A version cannot be published as things are configured (the message says what to do)."""


@dataclass(frozen=True)
class Published:
    version: int
    mode: str  # "updates" or "rotation"
    pages: int  # pages the version changed
    results: Sequence[dict]


def snapshot_name(owner: OwnerTable, version: int) -> str:
    return f"kw-{owner.dataset[:16]}-v{version:06d}"


def _same_pages(path: Path, pages: np.ndarray) -> bool:
    with Snapshot.open(path, verify=True) as snap:
        return snap.num_pages == len(pages) and bool(np.array_equal(snap.read_verified(), pages))


def _write_or_reuse(path: Path, owner: OwnerTable, version: int) -> None:
    """The version's snapshot at `path`: written once, reused when a re-run finds it (a
    snapshot is written manifest last, so one with a manifest is whole)."""
    pages = owner.pages(version)
    if (path / "manifest.json").is_file():
        if not _same_pages(path, pages):
            # a party may serve it: never replaced under its name
            raise PublishError(f"{path} holds another snapshot than version {version}; move "
                               "it away, then publish again")
        return
    write_snapshot(path, pages, epoch_id=version, source="morphogen keyword table",
                   overwrite=True, tables=tables_of(pages))


def stage_snapshot(owner: OwnerTable, version: int, snapshot_dir: str) -> str:
    """Put the version's full snapshot under `snapshot_dir` (where the parties' rotations
    read from); returns the path or URI to send them."""
    name = snapshot_name(owner, version)
    if not is_remote(snapshot_dir):
        path = Path(snapshot_dir).expanduser().resolve() / name
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_or_reuse(path, owner, version)
        return str(path)
    from morphogen.snapshot.upload import push_snapshot

    # a local copy first, kept until published, so that a re-run pushes the same manifest
    # (a push never replaces another snapshot at its prefix)
    local = owner.root / "staged" / name
    local.parent.mkdir(exist_ok=True)
    _write_or_reuse(local, owner, version)
    uri = f"{snapshot_dir.rstrip('/')}/{name}"
    push_snapshot(local, uri, progress=False)
    return uri


def _choose(owner: OwnerTable, version: int, batch: ChangeBatch, parties: Parties,
            snapshot_dir: str | None) -> dict:
    modes = owner.state.setdefault(MODES, {})
    chosen = modes.get(str(version))
    if chosen is not None:
        return dict(chosen)
    resized = version in owner.state.get(RESIZED, [])
    most = len(batch) > ROTATE_ABOVE * owner.num_pages(version)
    if not resized and not (most and snapshot_dir):
        # the digest too: a re-send after a crash names the one the first send named, or a
        # party that has the version would see another request (409) under its id
        chosen = {"mode": "updates", "digest": parties.digest_version()}
    else:
        if not snapshot_dir:
            raise PublishError(
                f"version {version} has another page count than the version before (a table "
                "grew): it is published as a rotation to its full snapshot. Give "
                "--snapshot-dir (a directory or object-store prefix under both parties' "
                "admin_snapshot_dir) and publish again")
        chosen = {"mode": "rotation",
                  "path": stage_snapshot(owner, version, snapshot_dir)}
    modes[str(version)] = chosen
    owner.save()  # before the first send: every re-run sends this same form
    return chosen


def publish(owner: OwnerTable, parties: Parties, *,
            snapshot_dir: str | None = None) -> list[Published]:
    """Send every unpublished version, in order, marking each published once both parties
    have it."""
    done = []
    while True:
        # The lock covers the owner's state, read and written anew each time; not the sends,
        # so that the next version can be made while this one travels (a follower's next
        # block). Two publishers of one owner send the same versions under the same ids, in
        # order: each party applies each once, the second sender is answered "duplicate".
        form = next_form(owner, parties, snapshot_dir)
        if form is None:
            return done
        if form.rotation:
            results = parties.snapshot(form.publication, form.path)
        else:
            results = parties.updates(form.publication, form.batch)
        done.append(Published(form.version, form.mode, len(form.batch), results))
        mark_published(owner, form.version)


@dataclass(frozen=True)
class Form:
    """One version as it is sent: its publication id and its recorded form."""

    version: int
    publication: str
    batch: ChangeBatch  # read from the owner's file: it keeps the changed bytes it holds
    mode: str  # "updates" or "rotation"
    path: str = ""  # the snapshot a rotation sends

    @property
    def rotation(self) -> bool:
        return self.mode == "rotation"


def next_form(owner: OwnerTable, parties: Parties, snapshot_dir: str | None,
              after: int = 0) -> Form | None:
    """The first version not yet on both parties (and above `after`), its form chosen and
    recorded (`_choose`), a rotation's snapshot staged; None when there is none."""
    with owner.locked():
        owner.reload()
        version = max(owner.published, after) + 1
        if version > owner.current:
            return None
        pub, batch = owner.publication_id(version), owner.store.changes(version)
        chosen = _choose(owner, version, batch, parties, snapshot_dir)
        if chosen["mode"] != "rotation":
            # a form recorded before digests were chosen was sent as version 1
            return Form(version, pub, batch.with_digest(int(chosen.get("digest", 1))),
                        "updates")
        path = str(chosen["path"])
        if not is_remote(path) and not (Path(path) / "manifest.json").is_file():
            # removed after it was recorded: write it again (the same bytes)
            _write_or_reuse(Path(path), owner, version)
        return Form(version, pub, batch, "rotation", path)


def mark_published(owner: OwnerTable, version: int) -> None:
    """Both parties have `version`: noted in the owner's state."""
    with owner.locked():
        owner.reload()
        _published(owner, version)


def _published(owner: OwnerTable, version: int) -> None:
    modes = owner.state.setdefault(MODES, {})
    mine = modes.get(str(version), {})
    if mine.get("mode") == "rotation":
        # a party replays from its last committed rotation: earlier ones are no longer read
        for v in [int(k) for k, m in modes.items() if int(k) < version
                  and m.get("mode") == "rotation"]:
            _remove_local(modes[str(v)]["path"])
            modes.pop(str(v))
        staged = owner.root / "staged"
        if staged.is_dir():
            for entry in staged.iterdir():
                if entry.name != snapshot_name(owner, version):
                    shutil.rmtree(entry, ignore_errors=True)
    for k in [k for k, m in modes.items() if int(k) <= version and m.get("mode") == "updates"]:
        modes.pop(k)
    owner.state[RESIZED] = [v for v in owner.state.get(RESIZED, []) if v > version]
    owner.mark_published(version, reload=False)


def _remove_local(path: str) -> None:
    if not is_remote(path) and os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
