"""Epoch identity: a name for the data an epoch's answers are computed from.

An epoch id alone is a counter: two servers (or two replicas of one shard) can hold different
pages under the same id, after a snapshot rebuilt in place or a replica that restarted from the
configured snapshot and lost the updates since. An `EpochIdentity` names the data instead:

    epoch id  +  the snapshot's root  +  a running hash of the update batches applied to it

The snapshot's root (`Snapshot.fingerprint`, the manifest's checksum) is the root of the BLAKE3
hashes of its page chunks, and a shard scans only a private copy of its range checked against
them, so the name is the bytes' own: not the manifest's word, not a sample of the file. A
snapshot that names tables (page ranges queried on their own) adds their digest to that name:
the same bytes cut into other tables answer other queries.

Equal identities mean equal matrices (up to a hash collision): every shard of a party derives
the same identity for the same epoch (each receives the whole update batch, whatever pages it
holds), and both parties do when they receive the same operations in the same order. Shard
partials carry it, the router combines only equal ones, and answers and `GET /epoch` publish
its `digest` so a client can check what it was answered from.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

# The chain of a snapshot with no update applied yet.
EMPTY_CHAIN = "00" * 32
DIGEST_BYTES = 16


def _hasher(*parts: bytes) -> hashlib.blake2b:
    """BLAKE2b-256 having absorbed each part after its length (8 bytes, little-endian)."""
    h = hashlib.blake2b(digest_size=32)
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h


def _hash(*parts: bytes) -> bytes:
    return _hasher(*parts).digest()


# How a batch's digest is taken: 1 hashes its whole pages (4 KiB each, whatever changed), 2 its
# pages' changed bytes in their canonical sparse form (`morphogen.protocol.sparse`): the same
# name for the same changes, at a cost that grows with what changed. The publisher chooses
# one for both parties (each must derive the same identity) and a party's log records it.
DIGEST_VERSIONS = (1, 2)


def batch_digest(pages: np.ndarray, replace: np.ndarray, data: bytes | memoryview) -> str:
    """Hex digest (version 1) of one update batch in transit (page numbers, replace flags,
    page bytes)."""
    data = memoryview(data).cast("B")
    return batch_digest_chunks(pages, replace, len(data), [data])


def batch_digest_chunks(pages: np.ndarray, replace: np.ndarray, size: int,
                        chunks: Iterable[bytes | memoryview]) -> str:
    """`batch_digest` of the batch whose `size` bytes of page data come as `chunks` in order
    (a batch of changed bytes hashed without unpacking it whole)."""
    h = _hasher(b"morphogen-updates-v1", np.ascontiguousarray(pages, dtype="<i8").tobytes(),
                np.ascontiguousarray(replace, dtype=np.uint8).tobytes())
    h.update(int(size).to_bytes(8, "little"))  # the data's length, as `_hasher` puts it
    seen = 0
    for c in chunks:
        h.update(c)
        seen += len(c)
    if seen != size:
        raise ValueError(f"{seen} bytes of page data, {size} named")
    return h.digest().hex()


def batch_digest_sparse(pages: np.ndarray, replace: np.ndarray, canonical: bytes) -> str:
    """Hex digest (version 2) of the batch whose page data's canonical sparse form is
    `canonical` (`sparse.canonical`; its header names the data's size)."""
    return _hash(b"morphogen-updates-v2", np.ascontiguousarray(pages, dtype="<i8").tobytes(),
                 np.ascontiguousarray(replace, dtype=np.uint8).tobytes(), canonical).hex()


@dataclass(frozen=True)
class EpochIdentity:
    """What one epoch of a party (or of one shard) serves."""

    epoch_id: int
    snapshot_checksum: str
    chain: str = EMPTY_CHAIN

    @classmethod
    def of_snapshot(cls, epoch_id: int, snapshot_checksum: str) -> EpochIdentity:
        return cls(int(epoch_id), str(snapshot_checksum), EMPTY_CHAIN)

    def after_updates(self, epoch_id: int, batch: str) -> EpochIdentity:
        """The identity of `epoch_id` = this epoch plus the update batch of digest `batch`."""
        if epoch_id <= self.epoch_id:
            raise ValueError(f"epoch {epoch_id} does not follow {self.epoch_id}")
        chain = _hash(
            b"morphogen-chain-v1",
            bytes.fromhex(self.chain),
            int(epoch_id).to_bytes(8, "little"),
            bytes.fromhex(batch),
        ).hex()
        return EpochIdentity(int(epoch_id), self.snapshot_checksum, chain)

    @property
    def digest(self) -> str:
        """`0x` + 32 hex digits: what answers, `GET /epoch` and logs carry."""
        h = hashlib.blake2b(digest_size=DIGEST_BYTES)
        h.update(b"morphogen-epoch-v1")
        h.update(int(self.epoch_id).to_bytes(8, "little"))
        h.update(self.snapshot_checksum.encode())
        h.update(bytes.fromhex(self.chain))
        return "0x" + h.hexdigest()

    def __str__(self) -> str:
        return f"epoch {self.epoch_id} ({self.digest[:14]})"
