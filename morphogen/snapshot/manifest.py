"""A snapshot's manifest (``manifest.json``): what it names, how it is checked and read.

The manifest names the epoch, the page count, the DPF domain, the data file next to it and a
checksum of the page data; `Manifest` refuses any combination that could not be served.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from morphogen.constants import MAX_DOMAIN_BITS, MAX_PAGES, PAGE_SIZE
from morphogen.snapshot.layout import domain_bits_for

FORMAT_VERSION = 1
DATA_FILE = "pages.bin"
MANIFEST_FILE = "manifest.json"
CHECKSUM_PREFIX = "blake2b-256:"


class SnapshotError(ValueError):
    """A snapshot (manifest or page file) is missing, malformed or does not match itself."""


def checksum_str(digest: bytes) -> str:
    """A manifest's checksum field for a ``blake2b-256`` digest of the page data."""
    return CHECKSUM_PREFIX + digest.hex()


@dataclass(frozen=True)
class Manifest:
    """What a snapshot's ``manifest.json`` says.

    ``data_bytes`` is the size of the data file; a written snapshot always holds whole pages
    (``num_pages * page_size``), a bare raw file may end inside its last page.
    ``checksum`` is ``"blake2b-256:<hex>"`` of the zero-padded page data, or None for a manifest
    derived from a bare raw file (nothing to compare against).
    """

    format: int
    epoch_id: int
    num_pages: int
    page_size: int
    domain_bits: int
    data_file: str
    data_bytes: int
    checksum: str | None
    created: str
    source: str
    # blake2b-128 of a few pages spread over the file (`sample_digest`), checked at every open:
    # catches a data file replaced under an unchanged manifest without reading the whole file.
    # None in manifests written before it existed.
    sample: str | None = None

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        if self.format != FORMAT_VERSION:
            raise SnapshotError(
                f"unknown snapshot format {self.format!r} (this version reads {FORMAT_VERSION})"
            )
        if self.page_size != PAGE_SIZE:
            raise SnapshotError(f"page_size is {self.page_size}, only {PAGE_SIZE} is supported")
        if not 0 <= self.epoch_id < 1 << 64:
            raise SnapshotError(f"epoch_id {self.epoch_id} is not a u64")
        if not 1 <= self.num_pages <= MAX_PAGES:
            raise SnapshotError(f"num_pages is {self.num_pages}, must be in 1..{MAX_PAGES}")
        needed = domain_bits_for(self.num_pages)
        if self.domain_bits < needed:
            # With 2^d < P pages the DPF aliases pages and a client gets the XOR of several.
            raise SnapshotError(
                f"domain_bits {self.domain_bits} is too small for {self.num_pages} pages "
                f"(needs >= {needed})"
            )
        if self.domain_bits > MAX_DOMAIN_BITS:
            raise SnapshotError(
                f"domain_bits {self.domain_bits} exceeds the maximum {MAX_DOMAIN_BITS}"
            )
        full = self.num_pages * self.page_size
        if not full - self.page_size < self.data_bytes <= full:
            raise SnapshotError(
                f"data_bytes {self.data_bytes} does not match {self.num_pages} pages of "
                f"{self.page_size} bytes (expected {full})"
            )
        name = self.data_file
        if not name or name in (".", "..") or "/" in name or "\\" in name:
            # The data file lives next to its manifest; a path could point anywhere.
            raise SnapshotError(f"data_file {name!r} must be a plain file name")
        if self.checksum is not None:
            hexpart = self.checksum.removeprefix(CHECKSUM_PREFIX)
            if (
                not self.checksum.startswith(CHECKSUM_PREFIX)
                or len(hexpart) != 64
                or any(c not in "0123456789abcdef" for c in hexpart)
            ):
                raise SnapshotError(
                    f"checksum {self.checksum!r} is not '{CHECKSUM_PREFIX}' + 64 lowercase hex"
                )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "manifest") -> Manifest:
        """Build a manifest from parsed JSON, refusing missing fields and wrong types."""
        if not isinstance(data, dict):
            raise SnapshotError(f"{where}: expected a JSON object, got {type(data).__name__}")
        if "format" not in data:
            raise SnapshotError(f"{where}: missing field 'format' (not a snapshot manifest?)")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                if f.name == "sample":
                    continue  # optional: older manifests
                raise SnapshotError(f"{where}: missing field {f.name!r}")
            value = data[f.name]
            if f.name in ("checksum", "sample"):
                ok = value is None or isinstance(value, str)
                want = "a string or null"
            elif f.type in ("int", int):
                # bool is an int subclass; true/false are not page counts.
                ok = isinstance(value, int) and not isinstance(value, bool)
                want = "an integer"
            else:
                ok = isinstance(value, str)
                want = "a string"
            if not ok:
                raise SnapshotError(f"{where}: field {f.name!r} must be {want}, got {value!r}")
            values[f.name] = value
        try:
            return cls(**values)
        except SnapshotError as exc:
            raise SnapshotError(f"{where}: {exc}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Manifest:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise SnapshotError(f"{path}: manifest not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SnapshotError(f"{path}: cannot read manifest: {exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SnapshotError(f"{path}: manifest is not valid JSON: {exc}") from None
        return cls.from_dict(data, where=str(path))
