"""What every opened snapshot offers, wherever its bytes live (a local file, object storage):
geometry and identity from its manifest, and a lifetime."""

from __future__ import annotations

from typing import Any, Self

from morphogen.snapshot.manifest import Manifest, SnapshotError


class OpenedSnapshot:
    """Base of `Snapshot` (a local page file) and `RemoteSnapshot` (object storage): shards,
    routers and admin rely on these members only, plus `pages`, `read_verified` and `verify`."""

    manifest: Manifest
    path: Any
    _closed: bool

    @property
    def num_pages(self) -> int:
        return self.manifest.num_pages

    @property
    def domain_bits(self) -> int:
        return self.manifest.domain_bits

    @property
    def epoch_id(self) -> int:
        return self.manifest.epoch_id

    def __len__(self) -> int:
        return self.manifest.num_pages

    def fingerprint(self) -> str:
        """What names this snapshot's data in an epoch identity: the root of its chunk hashes
        (``blake3-chunks:<hex>``), which is the manifest's checksum when it has one, plus its
        tables' digest when it names tables (`Manifest.fingerprint`). A shard serves only
        bytes checked against these hashes (`read_verified`), so the name is the bytes',
        whatever happens to the file or the object afterwards."""
        return self.manifest.fingerprint

    def _check_open(self) -> None:
        if self._closed:
            raise SnapshotError(f"{self.path}: snapshot is closed")

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
