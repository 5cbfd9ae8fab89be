"""A snapshot's manifest (``manifest.json``): what it names, how it is checked and read.

The manifest names the epoch, the page count, the DPF domain, the data file next to it, a hash
of every chunk of the page data and their root (the checksum); `Manifest` refuses any
combination that could not be served.

Format 1 manifests (before chunk hashes) are still read: they come out as a derived manifest
(no checksum, no chunk hashes), which the reader completes by hashing every byte at open, as for
a bare raw file. Their whole-file blake2b checksum is dropped rather than checked: it named the
file when the manifest was written, not the bytes a shard maps later, and the hashes computed at
open name those. Refusing them would strand every snapshot (and synthetic cache) built before;
rebuilding one (`morphogen build --raw DIR/pages.bin`) makes its opens cheap again and lets an
admin rotation take it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from morphogen.constants import MAX_DOMAIN_BITS, MAX_PAGES, PAGE_SIZE
from morphogen.snapshot.hashes import (
    CHECKSUM_PREFIX,
    DEFAULT_CHUNK_PAGES,
    checksum_str,
    chunk_count,
    is_digest_hex,
    root_hex,
)
from morphogen.snapshot.layout import domain_bits_for
from morphogen.snapshot.tables import Table, TableError, parse_tables, tables_digest

FORMAT_VERSION = 2
LEGACY_FORMAT = 1  # no chunk hashes: read as a derived manifest (module docstring)
DATA_FILE = "pages.bin"
MANIFEST_FILE = "manifest.json"


class SnapshotError(ValueError):
    """A snapshot (manifest or page file) is missing, malformed or does not match itself."""


@dataclass(frozen=True)
class Manifest:
    """What a snapshot's ``manifest.json`` says.

    ``data_bytes`` is the size of the data file; a written snapshot always holds whole pages
    (``num_pages * page_size``), a bare raw file may end inside its last page.
    ``chunk_hashes`` are the BLAKE3 digests (hex) of the zero-padded page data cut into chunks
    of ``chunk_pages`` pages (morphogen.snapshot.hashes), and ``checksum`` is
    ``"blake3-chunks:<root>"``, their root. A derived manifest (bare raw file, format 1) has no
    checksum, and no chunk hashes until the reader computes them from the bytes at open.
    ``tables``: the named tables (morphogen.snapshot.tables), page ranges of this matrix;
    None (the field absent from the file) when the snapshot names none.
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
    chunk_pages: int = DEFAULT_CHUNK_PAGES
    chunk_hashes: tuple[str, ...] | None = None
    tables: tuple[Table, ...] | None = None

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
        if not 1 <= self.chunk_pages <= MAX_PAGES:
            raise SnapshotError(f"chunk_pages is {self.chunk_pages}, must be in 1..{MAX_PAGES}")
        if self.chunk_hashes is not None:
            want = chunk_count(self.num_pages, self.chunk_pages)
            if len(self.chunk_hashes) != want:
                raise SnapshotError(
                    f"chunk_hashes has {len(self.chunk_hashes)} entries, {self.num_pages} pages "
                    f"in chunks of {self.chunk_pages} need {want}"
                )
            bad = next((h for h in self.chunk_hashes if not is_digest_hex(h)), None)
            if bad is not None:
                raise SnapshotError(f"chunk hash {bad!r} is not 64 lowercase hex")
        if self.tables is not None:
            try:
                # normalised here, so that a list of dicts is as good as a tuple of Tables
                object.__setattr__(self, "tables", parse_tables(self.tables, self.num_pages))
            except TableError as exc:
                raise SnapshotError(str(exc)) from None
        if self.checksum is not None:
            if not (
                self.checksum.startswith(CHECKSUM_PREFIX)
                and is_digest_hex(self.checksum.removeprefix(CHECKSUM_PREFIX))
            ):
                raise SnapshotError(
                    f"checksum {self.checksum!r} is not '{CHECKSUM_PREFIX}' + 64 lowercase hex"
                )
            if self.chunk_hashes is None:
                raise SnapshotError("a manifest with a checksum needs its chunk_hashes")
            if self.checksum != self.root:
                # an edited chunk hash (or root) would otherwise let the two disagree
                raise SnapshotError(
                    f"checksum {self.checksum} is not the root of chunk_hashes ({self.root})"
                )

    @cached_property
    def root(self) -> str:
        """``"blake3-chunks:<root>"`` of the chunk hashes: what names these bytes."""
        if self.chunk_hashes is None:
            raise SnapshotError("no chunk hashes yet: the snapshot was not opened")
        return checksum_str(root_hex(self.num_pages, self.chunk_pages, self.chunk_hashes))

    @cached_property
    def fingerprint(self) -> str:
        """What names this snapshot in an epoch identity: the root, plus a digest of the
        tables when there are any. Tables decide which pages a query of each scans, so two
        snapshots of the same bytes but other tables are other data to a client; without
        tables the name is the root alone, as it always was."""
        if not self.tables:
            return self.root
        return f"{self.root}+tables:{tables_digest(self.tables)}"

    def table(self, name: str) -> Table | None:
        return next((t for t in self.tables or () if t.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.tables is None:
            del out["tables"]  # a manifest without tables reads exactly as before them
        else:
            out["tables"] = [asdict(t) for t in self.tables]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "manifest") -> Manifest:
        """Build a manifest from parsed JSON, refusing missing fields and wrong types."""
        if not isinstance(data, dict):
            raise SnapshotError(f"{where}: expected a JSON object, got {type(data).__name__}")
        if "format" not in data:
            raise SnapshotError(f"{where}: missing field 'format' (not a snapshot manifest?)")
        legacy = data["format"] == LEGACY_FORMAT
        if legacy:
            data = {k: v for k, v in data.items() if k != "sample"}
            data.update(format=FORMAT_VERSION, checksum=None, chunk_pages=DEFAULT_CHUNK_PAGES,
                        chunk_hashes=None)
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "tables":
                value = data.get("tables")
                if value is not None and not isinstance(value, list):
                    raise SnapshotError(f"{where}: field 'tables' must be a list, got {value!r}")
                values["tables"] = value
                continue
            if f.name not in data:
                raise SnapshotError(f"{where}: missing field {f.name!r}")
            value = data[f.name]
            if f.name == "checksum":
                ok = value is None or isinstance(value, str)
                want = "a string or null"
            elif f.name == "chunk_hashes":
                if isinstance(value, list):
                    value = tuple(value)
                # a written manifest always lists them; only a legacy one is completed at open
                ok = isinstance(value, tuple) or (legacy and value is None)
                want = "a list of hex digests"
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
