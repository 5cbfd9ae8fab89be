"""Admin request bodies (PROTOCOL.md's admin extension): page updates and snapshot rotation,
decoded and checked before anything is staged. Same encodings and status codes as queries."""

from __future__ import annotations

import re

import numpy as np
from pydantic import BaseModel, ConfigDict, StrictBytes, StrictInt, StrictStr, ValidationError

from morphogen.constants import PAGE_SIZE
from morphogen.party.wire import JSON, decode_body, request_encoding, validation_message
from morphogen.protocol import sparse
from morphogen.protocol.changes import ChangeBatch
from morphogen.protocol.codec import ErrorCode, WireError, from_hex
from morphogen.protocol.identity import DIGEST_VERSIONS
from morphogen.publication.records import MAX_PARTS

# POST /admin/updates  {"updates": [{"page": 5, "diff": "0x..."}, {"page": 7, "data": "0x..."}]}
#   diff: exactly 4096 bytes XORed into the page; data: the page's new content (at most 4096
#   bytes, zero-padded). msgpack: the same with raw bytes. Applied in order, as one epoch.
# msgpack only, the same batch as its changed bytes (`morphogen.protocol.sparse`):
#   {"batch": {"pages": <n little-endian int64>, "replace": <n bytes, 1 = data>,
#              "data": <sparse form of the n * 4096 bytes>}}
# POST /admin/snapshot {"path": "relative/to/admin_snapshot_dir"}
# A publication larger than one request goes as several updates requests under one id, each
# with `Morphogen-Part: I/N` and `Morphogen-Batch: <digest of the whole batch>`.
# Both take an `Idempotency-Key` header: the publication id. The admin sends one id to both
# parties and re-sends it after any failure; a party answers a committed id with its first
# outcome and applies nothing twice (docs/publication.md).

_PUBLICATION_ID = re.compile(r"[A-Za-z0-9_.:-]{1,80}")
_PART = re.compile(r"([1-9][0-9]{0,4})/([1-9][0-9]{0,4})")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_IDENTITY = re.compile(r"0x[0-9a-f]{32}")


class _HexChange(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    page: StrictInt
    diff: StrictStr | None = None
    data: StrictStr | None = None


class _HexUpdates(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    updates: list[_HexChange]


class _BinChange(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    page: StrictInt
    diff: StrictBytes | None = None
    data: StrictBytes | None = None


class _BinUpdates(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    updates: list[_BinChange]


class _SparseBatch(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    pages: StrictBytes
    replace: StrictBytes
    data: StrictBytes


class _SparseUpdates(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    batch: _SparseBatch


class _SnapshotRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    path: StrictStr


def _bad_update(message: str) -> WireError:
    return WireError(400, ErrorCode.BAD_UPDATE, message)


def parse_updates(
    body: bytes, content_type: str | None, *, num_pages: int, max_updates: int,
    max_sparse: int | None = None,
) -> ChangeBatch:
    """Decode and check an updates body; raises WireError (messages name positions and page
    numbers, never page contents). `max_sparse`: the cap of a body of changed bytes
    (default `max_updates`), whose size does not grow 4 KiB a page."""
    encoding = request_encoding(content_type)
    data = decode_body(body, encoding)
    if encoding != JSON and isinstance(data, dict) and "batch" in data:
        return _sparse_updates(data, num_pages=num_pages,
                               max_updates=max_updates if max_sparse is None else max_sparse)
    model: type[BaseModel] = _HexUpdates if encoding == JSON else _BinUpdates
    try:
        parsed = model.model_validate(data)
    except ValidationError as exc:
        raise WireError(422, ErrorCode.INVALID_FIELD, validation_message(exc)) from None
    items = parsed.updates  # type: ignore[attr-defined]
    n = len(items)
    if not 1 <= n <= max_updates:
        raise _bad_update(f"a request holds 1..{max_updates} updates, got {n}")
    pages = np.empty(n, np.int64)
    replace = np.zeros(n, bool)
    blob = bytearray(n * PAGE_SIZE)
    for i, item in enumerate(items):
        if not 0 <= item.page < num_pages:
            raise _bad_update(
                f"update {i}: page {item.page} is outside the matrix of {num_pages} pages"
            )
        if (item.diff is None) == (item.data is None):
            raise _bad_update(f"update {i}: give exactly one of 'diff' and 'data'")
        raw: str | bytes = item.diff if item.diff is not None else item.data
        if isinstance(raw, str):
            try:
                raw = from_hex(raw)
            except ValueError:
                raise WireError(
                    422, ErrorCode.INVALID_FIELD, f"update {i}: not valid hex"
                ) from None
        if item.diff is not None and len(raw) != PAGE_SIZE:
            raise _bad_update(f"update {i}: a diff is {PAGE_SIZE} bytes, got {len(raw)}")
        if item.data is not None and len(raw) > PAGE_SIZE:
            raise _bad_update(f"update {i}: a page is at most {PAGE_SIZE} bytes, got {len(raw)}")
        pages[i] = item.page
        replace[i] = item.data is not None
        blob[i * PAGE_SIZE : i * PAGE_SIZE + len(raw)] = raw
    return ChangeBatch(pages, replace, bytes(blob))


def _sparse_updates(data: dict, *, num_pages: int, max_updates: int) -> ChangeBatch:
    try:
        batch = _SparseUpdates.model_validate(data).batch
    except ValidationError as exc:
        raise WireError(422, ErrorCode.INVALID_FIELD, validation_message(exc)) from None
    n = len(batch.pages) // 8
    if len(batch.pages) % 8 or len(batch.replace) != n:
        raise _bad_update("batch.pages is 8 bytes a change and batch.replace 1 byte a change")
    if not 1 <= n <= max_updates:
        raise _bad_update(f"a request holds 1..{max_updates} updates, got {n}")
    pages = np.frombuffer(batch.pages, "<i8").astype(np.int64)
    flags = np.frombuffer(batch.replace, np.uint8)
    outside = np.flatnonzero((pages < 0) | (pages >= num_pages))
    if len(outside):
        i = int(outside[0])
        raise _bad_update(
            f"update {i}: page {int(pages[i])} is outside the matrix of {num_pages} pages")
    if int(flags.max()) > 1:
        raise _bad_update("batch.replace holds 0 (diff) or 1 (data) a change")
    try:
        return ChangeBatch.from_packed(pages, flags.astype(bool), batch.data)
    except sparse.SparseError as exc:
        raise _bad_update(f"batch.data: {exc}") from None


def publication_id(header: str | None) -> str | None:
    """The publication id of an admin request (None: the router picks one)."""
    if header is None:
        return None
    if not _PUBLICATION_ID.fullmatch(header):
        raise WireError(400, ErrorCode.BAD_REQUEST,
                        "Idempotency-Key is 1..80 characters of A-Z a-z 0-9 _ . : -")
    return header


def parent_identity(header: str | None) -> str | None:
    """The identity a publication names as its parent (None: it names none)."""
    if header is None:
        return None
    if not _IDENTITY.fullmatch(header):
        raise WireError(400, ErrorCode.BAD_REQUEST,
                        "Morphogen-Parent is an epoch identity: 0x and 32 lower-case hex digits")
    return header


def digest_version(header: str | None) -> int:
    """The batch digest version a publication names (1 where it names none)."""
    if header is None:
        return 1
    if header.strip() not in {str(v) for v in DIGEST_VERSIONS}:
        raise WireError(400, ErrorCode.BAD_REQUEST,
                        "Morphogen-Batch-Digest is the batch digest's version: "
                        + " or ".join(map(str, DIGEST_VERSIONS)))
    return int(header.strip())


def part_of(part: str | None, digest: str | None) -> tuple[int, int, str] | None:
    """(part, parts, digest of the whole batch) of an updates request sent in parts; None
    for a publication in one request."""
    if part is None and digest is None:
        return None
    m = _PART.fullmatch(part or "")
    if m is None or not 1 <= int(m[1]) <= int(m[2]) <= MAX_PARTS:
        raise WireError(400, ErrorCode.BAD_REQUEST,
                        f"Morphogen-Part is PART/PARTS, 1 <= PART <= PARTS <= {MAX_PARTS}")
    if digest is None or not _DIGEST.fullmatch(digest):
        raise WireError(400, ErrorCode.BAD_REQUEST,
                        "Morphogen-Batch is the whole batch's digest: 64 lower-case hex digits")
    return int(m[1]), int(m[2]), digest


def parse_snapshot_request(body: bytes, content_type: str | None) -> str:
    """The requested snapshot path of a `POST /admin/snapshot` body."""
    encoding = request_encoding(content_type)
    data = decode_body(body, encoding)
    try:
        parsed = _SnapshotRequest.model_validate(data)
    except ValidationError as exc:
        raise WireError(422, ErrorCode.INVALID_FIELD, validation_message(exc)) from None
    if not parsed.path or "\x00" in parsed.path:
        raise WireError(400, ErrorCode.BAD_REQUEST, "path must be a non-empty string")
    return parsed.path
