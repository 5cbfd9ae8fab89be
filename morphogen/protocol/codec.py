"""Wire vocabulary shared by the server and the client: hex bytes, media types, error codes,
body limits. Plain Python (no pydantic, no Ray) so that clients import it cheaply.

PROTOCOL.md section 5 is the contract: bytes travel as ``"0x"`` + lowercase hex (inputs accept
an optional ``0x`` and either case); a query is exactly three keys; a batch is 1..32 queries.
"""

from __future__ import annotations

import binascii
from enum import StrEnum
from typing import Any

from morphogen.constants import KEYS_PER_QUERY, MAX_BATCH_QUERIES, PAGE_SIZE, key_length

JSON_TYPE = "application/json"
MSGPACK_TYPE = "application/msgpack"
# `application/x-msgpack` is the older spelling still sent by many msgpack libraries.
MSGPACK_TYPES = frozenset({MSGPACK_TYPE, "application/x-msgpack", "application/vnd.msgpack"})

QUERY_PATH = "/query/page/gpu"
BATCH_PATH = "/query/page/gpu/batch"
HEALTH_PATH = "/health"
EPOCH_PATH = "/epoch"
# Admin routes (bearer token; see morphogen.publication.admin_auth): live page updates,
# snapshot rotation.
ADMIN_UPDATES_PATH = "/admin/updates"
ADMIN_SNAPSHOT_PATH = "/admin/snapshot"
ADMIN_STATUS_PATH = "/admin/status"
# The header naming a publication (the admin's idempotency key), sent to both parties.
PUBLICATION_HEADER = "idempotency-key"
# The identity a publication applies on (`GET /admin/status`'s head): a party whose head is
# another refuses it (409 parent_mismatch), so two publishers never interleave A and B.
PARENT_HEADER = "morphogen-parent"
MAX_ADMIN_UPDATES = 1024  # default cap of updates per admin request
# A publication larger than one request goes in parts (docs/publication.md): each request
# names its part ("2/5") and the digest of the whole batch; the last part publishes them all.
PART_HEADER = "morphogen-part"
BATCH_HEADER = "morphogen-batch"
# How the publication's batch digest is taken (`identity.DIGEST_VERSIONS`; absent: 1). The
# publisher sends the same to both parties, 2 only where both list it in their status
# (`admin_batch_digests`): a party of an earlier version would take 1 and name other
# identities.
DIGEST_HEADER = "morphogen-batch-digest"


class ErrorCode(StrEnum):
    """Machine-readable `error.code` values of the JSON error body."""

    BAD_REQUEST = "bad_request"  # unparsable body
    BAD_KEY_COUNT = "bad_key_count"  # a query without exactly three keys
    BAD_KEY = "bad_key"  # malformed key bytes
    BAD_DOMAIN = "bad_domain"  # key domain differs from the advertised one
    UNKNOWN_TABLE = "unknown_table"  # a query naming a table the snapshot does not have
    BAD_BATCH = "bad_batch"  # empty or oversized batch
    INVALID_FIELD = "invalid_field"  # wrong field types, bad hex
    PAYLOAD_TOO_LARGE = "payload_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    UNAVAILABLE = "unavailable"  # no consistent epoch, failed or missing shard
    INTERNAL = "internal"
    # admin routes
    UNAUTHORIZED = "unauthorized"  # 401: missing or wrong bearer token
    FORBIDDEN = "forbidden"  # 403: admin disabled, or a path outside the allowed directory
    BAD_UPDATE = "bad_update"  # 400: page outside the matrix, wrong diff size, bad count
    BAD_SNAPSHOT = "bad_snapshot"  # 422: missing, truncated or wrong-checksum snapshot
    CONFLICT = "conflict"  # 409: another admin operation holds the shards' staging slot
    MISSING_PARTS = "missing_parts"  # 409: the last part came before the others
    PARENT_MISMATCH = "parent_mismatch"  # 409: the party's head is not the publication's parent


class WireError(Exception):
    """An error with its HTTP status, meant to reach the caller as ``{"error": {...}}``.

    Messages never contain key or page bytes: they name positions (query 3, key 1), never
    contents. Pickles by value so that it crosses Ray handles unchanged.
    """

    def __init__(
        self, status: int, code: ErrorCode | str, message: str, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = int(status)
        self.code = str(code)
        self.message = message
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[Any, ...]:
        return (WireError, (self.status, self.code, self.message, self.retry_after))

    def __repr__(self) -> str:
        return f"WireError({self.status}, {self.code!r}, {self.message!r})"

    def to_body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}


def unavailable(message: str, retry_after: int = 1) -> WireError:
    return WireError(503, ErrorCode.UNAVAILABLE, message, retry_after=retry_after)


def to_hex(data: bytes | bytearray | memoryview) -> str:
    """``0x`` + lowercase hex, the reference's encoding of every byte string."""
    return "0x" + bytes(data).hex()


def from_hex(text: str) -> bytes:
    """Strict hex decoding: optional ``0x``/``0X``, either case, no whitespace, even length.

    Raises ValueError (without echoing the input: it may be a key).
    """
    if text[:2] in ("0x", "0X"):
        text = text[2:]
    try:
        # unhexlify, unlike bytes.fromhex, refuses embedded whitespace.
        return binascii.unhexlify(text)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise ValueError("not an even-length hex string") from None


def media_type(content_type: str | None) -> str:
    """The bare, lowercased media type of a Content-Type header value ('' when absent)."""
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


def is_msgpack(content_type: str | None) -> bool:
    return media_type(content_type) in MSGPACK_TYPES


def is_json(content_type: str | None) -> bool:
    mt = media_type(content_type)
    return mt == JSON_TYPE or (mt.startswith("application/") and mt.endswith("+json"))


def admin_body_bytes(max_updates: int = MAX_ADMIN_UPDATES) -> int:
    """Largest admin body `max_updates` page updates can need: each is a page number and 4096
    bytes as ``"0x"`` + 8192 hex characters (JSON, the larger encoding), plus room for
    whitespace and the envelope."""
    per = 2 * PAGE_SIZE + 64
    compact = max_updates * per + 64
    return compact + compact // 8 + 4096


def max_body_bytes(domain_bits: int, max_queries: int = MAX_BATCH_QUERIES) -> int:
    """Largest request body a full batch of valid keys can need, with room for whitespace.

    Sized from the JSON (hex) encoding, the larger of the two: each key is ``"0x" + 2L`` hex
    characters plus quotes and separators, each query wraps its three keys in
    ``{"keys": [...]}``. A quarter on top covers pretty-printed bodies; 4 KiB covers the
    envelope. For d=25 and 32 queries this is about 120 KB (the reference's fixed 64 KiB made
    more than 22 such queries unreachable).
    """
    per_key = 2 * key_length(domain_bits) + 8
    per_query = KEYS_PER_QUERY * per_key + 32
    compact = max_queries * per_query + 64
    return compact + compact // 4 + 4096
