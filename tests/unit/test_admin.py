"""Admin orchestration without Ray: two-phase publication, snapshot paths and checks, errors."""

from __future__ import annotations

import asyncio
import os

import pytest

from morphogen.party import admin
from morphogen.party.epoch import EpochError, StagingConflict
from morphogen.protocol.codec import ErrorCode, WireError
from morphogen.protocol.dpf import DomainError
from morphogen.snapshot.manifest import SnapshotError
from morphogen.snapshot.synthetic import build_synthetic


class FakeShard:
    def __init__(self, fail_prepare: Exception | None = None, fail_commits: int = 0) -> None:
        self.log: list[str] = []
        self.fail_prepare = fail_prepare
        self.fail_commits = fail_commits

    async def prepare(self) -> int:
        self.log.append("prepare")
        if self.fail_prepare is not None:
            raise self.fail_prepare
        return 1

    async def commit(self) -> None:
        self.log.append("commit")
        if self.fail_commits:
            self.fail_commits -= 1
            raise ConnectionError("lost")

    async def abort(self) -> None:
        self.log.append("abort")


def _publish(shards: list[FakeShard]) -> tuple[list, int]:
    async def run():
        results = await admin.prepare_all(7, [s.prepare for s in shards],
                                          [s.abort for s in shards], timeout_s=5)
        return results, await admin.commit_all(7, [s.commit for s in shards], timeout_s=5)

    return asyncio.run(run())


def test_publish_prepares_then_commits_everywhere() -> None:
    shards = [FakeShard(), FakeShard(), FakeShard()]
    assert _publish(shards) == ([1, 1, 1], 0)
    assert all(s.log == ["prepare", "commit"] for s in shards)


def test_a_failed_prepare_aborts_everywhere_and_commits_nothing() -> None:
    shards = [FakeShard(), FakeShard(SnapshotError("truncated")), FakeShard()]
    with pytest.raises(WireError) as exc:
        _publish(shards)
    assert (exc.value.status, exc.value.code) == (422, ErrorCode.BAD_SNAPSHOT)
    assert all(s.log == ["prepare", "abort"] for s in shards)


def test_commit_is_retried_then_the_stragglers_counted() -> None:
    """A commit is decided before it is sent: a shard that keeps failing it is counted (it
    reaches the epoch from the log), never reported as a failed publication."""
    shards = [FakeShard(fail_commits=1), FakeShard()]
    assert _publish(shards)[1] == 0
    assert shards[0].log == ["prepare", "commit", "commit"]
    shards = [FakeShard(fail_commits=5), FakeShard()]
    assert _publish(shards)[1] == 1


class _Wrapped(Exception):
    """Like Ray's RayTaskError: the original exception in `cause`."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("wrapped")
        self.cause = cause


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (StagingConflict("busy"), 409, ErrorCode.CONFLICT),
        (EpochError("stale"), 409, ErrorCode.CONFLICT),
        (SnapshotError("bad"), 422, ErrorCode.BAD_SNAPSHOT),
        (DomainError("d"), 400, ErrorCode.BAD_DOMAIN),
        (ValueError("page 9 is outside"), 400, ErrorCode.BAD_UPDATE),
        (TimeoutError(), 503, ErrorCode.UNAVAILABLE),
        (RuntimeError("boom"), 503, ErrorCode.UNAVAILABLE),
        (WireError(418, "x", "y"), 418, "x"),
    ],
)
def test_errors_map_to_statuses(exc: Exception, status: int, code: str) -> None:
    for e in (exc, _Wrapped(exc)):
        err = admin.as_wire_error(e)
        assert (err.status, err.code) == (status, code)


def test_rotation_epoch_never_goes_back() -> None:
    assert admin.rotation_epoch(5, 0) == 6
    assert admin.rotation_epoch(5, 100) == 100
    assert admin.rotation_epoch(5, 6) == 6


def test_party_epoch() -> None:
    infos = [
        {"epoch_id": 4, "identity": "0x04", "num_pages": 10, "domain_bits": 4,
         "pending_updates": 2, "rotation_in_progress": False, "snapshot_epoch_id": 1,
         "snapshot_checksum": "c"},
        {"epoch_id": 5, "identity": "0x05", "num_pages": 10, "domain_bits": 4,
         "pending_updates": 1, "rotation_in_progress": True, "snapshot_epoch_id": 1,
         "snapshot_checksum": "c"},
    ]
    state = admin.party_epoch(infos)
    assert (state.epoch_id, state.consistent, state.pending_updates) == (5, False, 3)
    assert state.rotation_in_progress


def test_snapshot_paths_stay_inside_the_allowed_directory(tmp_path) -> None:
    allowed = tmp_path / "allowed"
    (allowed / "snap").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, allowed / "link")
    assert admin.resolve_snapshot_path("snap", str(allowed)) == (allowed / "snap").resolve()
    assert admin.resolve_snapshot_path(str(allowed / "snap"), str(allowed)).name == "snap"
    for bad in ("../outside", str(outside), "link", "snap/../../outside"):
        with pytest.raises(WireError) as exc:
            admin.resolve_snapshot_path(bad, str(allowed))
        assert (exc.value.status, exc.value.code) == (403, ErrorCode.FORBIDDEN)
    for missing in ("missing", "a" * 300):  # a name too long for the file system: no 500
        with pytest.raises(WireError) as exc:
            admin.resolve_snapshot_path(missing, str(allowed))
        assert (exc.value.status, exc.value.code) == (422, ErrorCode.BAD_SNAPSHOT)
    with pytest.raises(WireError) as exc:
        admin.resolve_snapshot_path("snap", None)
    assert exc.value.status == 403 and "disabled" in exc.value.message


def test_verify_refuses_truncated_corrupt_and_unchecksummed(tmp_path) -> None:
    good = tmp_path / "good"
    build_synthetic(good, 20, seed=1, epoch_id=3, progress=False)
    assert admin.verify_snapshot(good).epoch_id == 3

    truncated = tmp_path / "truncated"
    build_synthetic(truncated, 20, seed=1, progress=False)
    with open(truncated / "pages.bin", "r+b") as fh:
        fh.truncate(4096 * 19 + 100)
    corrupt = tmp_path / "corrupt"
    build_synthetic(corrupt, 200, seed=1, progress=False)
    with open(corrupt / "pages.bin", "r+b") as fh:
        fh.seek(4096 * 7 + 5)
        byte = fh.read(1)
        fh.seek(4096 * 7 + 5)
        fh.write(bytes([byte[0] ^ 1]))
    raw = tmp_path / "raw.bin"
    raw.write_bytes(bytes(8192))
    for path, words in ((truncated, "truncated"), (corrupt, "checksum mismatch"),
                        (raw, "manifest checksum")):
        with pytest.raises(WireError) as exc:
            admin.verify_snapshot(path)
        assert (exc.value.status, exc.value.code) == (422, ErrorCode.BAD_SNAPSHOT)
        assert words in exc.value.message


def test_a_rotation_whose_snapshot_changed_after_its_check_is_never_committed(tmp_path) -> None:
    """Without an epoch log a replica commits what it staged when told to. The router named
    the identity of the snapshot it verified; rewritten meanwhile with the same pages and
    other tables, the shard staged another identity: it is aborted, never served under the
    name the router gave (the admin's answer named one identity, the shard served another)."""
    from morphogen.party.replica import ShardReplica
    from morphogen.party.shard import ShardCore
    from morphogen.protocol.identity import EpochIdentity
    from morphogen.snapshot.reader import Snapshot

    pages = 64
    build_synthetic(tmp_path / "cur", pages, seed=0, epoch_id=1, chunk_pages=16, progress=False)
    build_synthetic(tmp_path / "new", pages, seed=5, epoch_id=2, chunk_pages=16, progress=False)
    core = ShardCore.open(Snapshot.open(tmp_path / "cur"), 0, 1, "cpu")
    replica = ShardReplica(core, None)
    checked = admin.verify_snapshot(tmp_path / "new")
    target = EpochIdentity.of_snapshot(2, checked.fingerprint).digest
    build_synthetic(tmp_path / "new", pages, seed=5, epoch_id=2, chunk_pages=16, progress=False,
                    overwrite=True, tables=[{"name": "t", "first_page": 0, "num_pages": 10}])
    before = core.identity
    replica._prepare_snapshot_now(2, str(tmp_path / "new"), checked.checksum, "op1", target)
    with pytest.raises(EpochError, match="changed since it was verified"):
        replica._commit_now(2, "op1", target)
    assert core.identity == before and core.state.staged is None
    # the snapshot as it is now, verified and named again, is taken
    again = admin.verify_snapshot(tmp_path / "new")
    target = EpochIdentity.of_snapshot(2, again.fingerprint).digest
    replica._prepare_snapshot_now(2, str(tmp_path / "new"), again.checksum, "op2", target)
    replica._commit_now(2, "op2", target)
    assert core.identity.digest == target
