"""Server side of the HTTP contract (PROTOCOL.md section 5): request models, validation of every
key before any scan, and response encoding in JSON (hex) or msgpack (raw bytes).

Status codes follow the reference: 400 for an unparsable body, a bad key count, a malformed key,
a wrong domain or an empty/oversized batch; 415 for a wrong content type; 422 for wrong field
types or bad hex. Error messages name positions, never key bytes.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
from pydantic import BaseModel, ConfigDict, StrictBytes, StrictStr, ValidationError

from morphogen.constants import (
    KEY_FORMAT_PACKED,
    KEY_FORMAT_V1,
    KEYS_PER_QUERY,
    MAX_DOMAIN_BITS,
    MIN_DOMAIN_BITS,
    PAGE_SIZE,
    key_format_of,
    key_length,
    packed_key_length,
)
from morphogen.protocol.codec import (
    JSON_TYPE,
    MSGPACK_TYPE,
    ErrorCode,
    WireError,
    from_hex,
    is_json,
    is_msgpack,
    media_type,
)
from morphogen.protocol.dpf import KeyFormatError
from morphogen.protocol.nesting import json_nesting
from morphogen.protocol.packed import AnyBatch, batch_from_rows

JSON = "json"
MSGPACK = "msgpack"


# --------------------------------------------------------------------------- request models
# Strict: a number where a string belongs is a 422, as with the reference's serde types.
# Unknown fields are ignored, as serde does by default. `table` is this project's: it names one
# of the snapshot's tables (a page range with its own domain); absent, the query is of the whole
# matrix, as every reference body is.


class _HexQuery(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    keys: list[StrictStr]
    table: StrictStr | None = None


class _HexBatch(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    queries: list[_HexQuery]
    table: StrictStr | None = None


class _BinQuery(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    keys: list[StrictBytes]
    table: StrictStr | None = None


class _BinBatch(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    queries: list[_BinQuery]
    table: StrictStr | None = None


@dataclass(frozen=True)
class ParsedQueries:
    """The validated keys of one request, query after query (KEYS_PER_QUERY each)."""

    keys: AnyBatch  # a KeyBatch or a PackedKeyBatch: one format a request
    encoding: str  # JSON or MSGPACK: how the request came
    table: str | None = None  # the table named, None for the whole matrix

    @property
    def num_queries(self) -> int:
        return len(self.keys) // KEYS_PER_QUERY


def request_encoding(content_type: str | None) -> str:
    """JSON or MSGPACK from the Content-Type, else 415 (the reference refuses a missing one)."""
    if is_json(content_type):
        return JSON
    if is_msgpack(content_type):
        return MSGPACK
    shown = media_type(content_type) or "none"
    raise WireError(
        415,
        ErrorCode.UNSUPPORTED_MEDIA_TYPE,
        f"content type {shown!r} is not supported; send {JSON_TYPE} or {MSGPACK_TYPE}",
    )


def response_encoding(accept: str | None, request_enc: str) -> str:
    """Answer in msgpack when asked (Accept) or when the request was msgpack and Accept does
    not ask for JSON; JSON otherwise."""
    accept = (accept or "").lower()
    if any(t in accept for t in ("msgpack",)):
        return MSGPACK
    if "json" in accept:
        return JSON
    return request_enc


def validation_message(exc: ValidationError) -> str:
    # Locations and pydantic's short messages only: `input` would echo key material.
    parts = []
    for err in exc.errors(include_url=False, include_input=False)[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request body"


# No route's JSON body nests deeper than a few levels ({"queries": [{"keys": [..]}]}).
MAX_JSON_DEPTH = 16


def decode_body(body: bytes, encoding: str) -> Any:
    if encoding == JSON and json_nesting(body) > MAX_JSON_DEPTH:
        # judged before parsing: the parser recurses in C once a level, and where the
        # process's recursion limit was raised a deep body overflows the stack
        raise WireError(400, ErrorCode.BAD_REQUEST,
                        f"request body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        if encoding == JSON:
            return json.loads(body)
        return msgpack.unpackb(body, raw=False, strict_map_key=True)
    except (ValueError, UnicodeDecodeError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError, TypeError, RecursionError):
        # RecursionError: JSON nested past the parser's depth (msgpack's is StackError)
        # json.JSONDecodeError and msgpack's UnpackValueError are ValueErrors.
        what = "JSON" if encoding == JSON else "msgpack"
        raise WireError(400, ErrorCode.BAD_REQUEST, f"request body is not valid {what}") from None


_LENGTHS = {KEY_FORMAT_V1: key_length, KEY_FORMAT_PACKED: packed_key_length}


def _key_format(raw: bytes, where: str, formats: Sequence[str]) -> str:
    """The format a key's length names (docs/packed-keys.md section 4), if this server takes
    it; a length of neither format, or shorter than any packed key, is judged as v1's (the
    reference's messages)."""
    fmt = KEY_FORMAT_V1
    if len(raw) >= packed_key_length(MIN_DOMAIN_BITS):
        fmt = key_format_of(len(raw)) or KEY_FORMAT_V1
    if fmt not in formats:
        raise WireError(400, ErrorCode.BAD_KEY,
                        f"{where}: this server does not take {fmt} keys (it takes "
                        f"{', '.join(formats)}; see GET /epoch page_pir.key_formats)")
    return fmt


def _check_key_size(raw: bytes, domain_bits: int, where: str, table: str | None,
                    fmt: str = KEY_FORMAT_V1) -> None:
    """Length and domain byte of one key (PROTOCOL.md section 4, `d == advertised domain`);
    the flag bytes are checked for the whole request at once (`KeyBatch.from_rows`)."""
    if len(raw) < 19:
        raise WireError(400, ErrorCode.BAD_KEY, f"{where}: key is {len(raw)} bytes, too short")
    d = raw[18]
    if not MIN_DOMAIN_BITS <= d <= MAX_DOMAIN_BITS:
        raise WireError(400, ErrorCode.BAD_KEY, f"{where}: key domain bits {d} not in 1..32")
    if d != domain_bits:
        raise WireError(
            400,
            ErrorCode.BAD_DOMAIN,
            f"{where}: key domain bits {d}, "
            + (f"table {table!r} has" if table is not None else "this server's domain is")
            + f" {domain_bits} (see GET /epoch)",
        )
    want = _LENGTHS[fmt](d)
    if len(raw) != want:
        raise WireError(
            400,
            ErrorCode.BAD_KEY,
            f"{where}: key is {len(raw)} bytes, a {fmt} key of domain {d} is {want}",
        )


def _key_bytes(item: str | bytes, encoding: str, where: str) -> bytes:
    if encoding == MSGPACK:
        assert isinstance(item, bytes)
        return item
    assert isinstance(item, str)
    try:
        return from_hex(item)
    except ValueError:
        raise WireError(422, ErrorCode.INVALID_FIELD, f"{where}: key is not valid hex") from None


def parse_queries(
    body: bytes,
    content_type: str | None,
    *,
    batch: bool,
    domain_bits: int,
    max_queries: int,
    tables: Mapping[str, int] | None = None,
    key_formats: Sequence[str] = (KEY_FORMAT_V1,),
) -> ParsedQueries:
    """Decode, type-check and validate a query or batch body; raises WireError. `tables`
    maps each table's name to its domain: a body naming a table is checked against that,
    and one naming no table against `domain_bits`, the whole matrix's."""
    encoding = request_encoding(content_type)
    data = decode_body(body, encoding)
    model: type[BaseModel]
    if batch:
        model = _HexBatch if encoding == JSON else _BinBatch
    else:
        model = _HexQuery if encoding == JSON else _BinQuery
    try:
        parsed = model.model_validate(data)
    except ValidationError as exc:
        raise WireError(422, ErrorCode.INVALID_FIELD, validation_message(exc)) from None
    raw_queries = [q.keys for q in parsed.queries] if batch else [parsed.keys]  # type: ignore[attr-defined]
    table: str | None = parsed.table  # type: ignore[attr-defined]
    domain = table_domain(table, domain_bits, tables or {})
    return ParsedQueries(
        validate_queries(raw_queries, encoding, domain_bits=domain,
                         max_queries=max_queries, batch=batch, table=table,
                         key_formats=key_formats),
        encoding,
        table,
    )


def table_domain(table: str | None, domain_bits: int, tables: Mapping[str, int]) -> int:
    """The domain keys of `table` must have (the whole matrix's for None); 400 naming an
    unknown table."""
    if table is None:
        return domain_bits
    if table not in tables:
        listed = ", ".join(sorted(tables)) or "none"
        raise WireError(400, ErrorCode.UNKNOWN_TABLE,
                        f"unknown table {table!r} (tables served: {listed}; see GET /epoch)")
    return tables[table]


def validate_queries(
    raw_queries: Sequence[Sequence[str | bytes]],
    encoding: str,
    *,
    domain_bits: int,
    max_queries: int,
    batch: bool = True,
    table: str | None = None,
    key_formats: Sequence[str] = (KEY_FORMAT_V1,),
) -> AnyBatch:
    """Counts first (cheap), then every key, into one buffer that becomes the request's
    `KeyBatch` (`PackedKeyBatch` for packed keys, which `key_formats` must allow); nothing
    is scanned unless all of them pass, and a request never mixes formats."""
    n = len(raw_queries)
    if batch and not 1 <= n <= max_queries:
        raise WireError(
            400, ErrorCode.BAD_BATCH, f"a batch holds 1..{max_queries} queries, got {n}"
        )
    for qi, keys in enumerate(raw_queries):
        if len(keys) != KEYS_PER_QUERY:
            raise WireError(
                400,
                ErrorCode.BAD_KEY_COUNT,
                f"{_where(qi, None, batch)}: a query holds exactly {KEYS_PER_QUERY} keys, "
                f"got {len(keys)}",
            )
    raws = []
    first: str | None = None
    for qi, keys in enumerate(raw_queries):
        for ki, item in enumerate(keys):
            where = _where(qi, ki, batch)
            raw = _key_bytes(item, encoding, where)
            fmt = _key_format(raw, where, key_formats)
            if first is None:
                first = fmt
            elif fmt != first:
                raise WireError(400, ErrorCode.BAD_KEY,
                                f"{where}: a {fmt} key in a request of {first} keys "
                                "(a request never mixes key formats)")
            _check_key_size(raw, domain_bits, where, table, fmt)
            raws.append(raw)
    rows = np.frombuffer(b"".join(raws), np.uint8).reshape(len(raws), -1)
    try:
        return batch_from_rows(rows)  # the batch's arrays are its own copies
    except KeyFormatError as exc:
        # the parser's reasons name fields and small flag values, never seeds
        qi, ki = divmod(exc.index, KEYS_PER_QUERY)
        raise WireError(400, ErrorCode.BAD_KEY, f"{_where(qi, ki, batch)}: {exc.reason}") from None


def _where(query: int, key: int | None, batch: bool) -> str:
    q = f"query {query}" if batch else "query"
    if key is None:
        return q
    return f"query {query} key {key}" if batch else f"key {key}"


def handle_queries(
    queries: Sequence[Sequence[bytes]], *, domain_bits: int, max_queries: int, batch: bool,
    table: str | None = None, key_formats: Sequence[str] = (KEY_FORMAT_V1,),
) -> AnyBatch:
    """Validation for the handle API (raw key bytes from Python drivers); `domain_bits` is
    the domain of `table` (resolved by the caller) or of the whole matrix."""
    if not isinstance(queries, Sequence) or isinstance(queries, bytes | str):
        raise WireError(422, ErrorCode.INVALID_FIELD, "queries must be a list of key lists")
    for qi, keys in enumerate(queries):
        if not isinstance(keys, Sequence) or isinstance(keys, bytes | str):
            raise WireError(422, ErrorCode.INVALID_FIELD, f"query {qi}: keys must be a list")
        for ki, k in enumerate(keys):
            if not isinstance(k, bytes | bytearray | memoryview):
                raise WireError(
                    422, ErrorCode.INVALID_FIELD, f"query {qi} key {ki}: key must be bytes"
                )
    raw = [[bytes(k) for k in keys] for keys in queries]
    if table is not None and not isinstance(table, str):
        raise WireError(422, ErrorCode.INVALID_FIELD, "table must be a string")
    return validate_queries(raw, MSGPACK, domain_bits=domain_bits, max_queries=max_queries,
                            batch=batch, table=table, key_formats=key_formats)


# --------------------------------------------------------------------------- responses


def _hex_rows(acc: np.ndarray) -> list[bytes]:
    return [b'"0x' + binascii.hexlify(row) + b'"' for row in acc]


def encode_answer(
    epoch_id: int, acc: np.ndarray, *, batch: bool, encoding: str, identity: str | None = None
) -> bytes:
    """Encode accumulators (n_queries * 3, 4096) as the single or batch response body.

    `identity` (EpochIdentity.digest: "0x" + 32 hex digits) names the data the answer was
    computed from, beside the reference's `epoch_id`; clients of the reference ignore it.
    JSON is assembled by hand: hex strings need no escaping and this avoids building then
    re-scanning megabytes of Python strings.
    """
    if acc.ndim != 2 or acc.shape[1] != PAGE_SIZE or acc.shape[0] % KEYS_PER_QUERY:
        raise ValueError(f"unexpected accumulator shape {acc.shape}")
    epoch = int(epoch_id)
    if encoding == MSGPACK:
        return msgpack.packb(answer_dict(epoch, acc, batch=batch, identity=identity),
                             use_bin_type=True)
    rows = _hex_rows(acc)
    head = b'{"epoch_id":%d,' % epoch
    if identity is not None:
        head += b'"identity":' + encode_json(_checked_identity(identity)) + b","
    if not batch:
        return head + b'"pages":[' + b",".join(rows) + b"]}"
    groups = [
        b'{"pages":[' + b",".join(rows[i : i + KEYS_PER_QUERY]) + b"]}"
        for i in range(0, len(rows), KEYS_PER_QUERY)
    ]
    return head + b'"results":[' + b",".join(groups) + b"]}"


def _checked_identity(identity: str) -> str:
    if not (identity.startswith("0x") and len(identity) == 34):
        raise ValueError("an identity is 0x + 32 hex digits")
    int(identity, 16)
    return identity


def answer_dict(
    epoch_id: int, acc: np.ndarray, *, batch: bool, identity: str | None = None
) -> dict[str, Any]:
    """The same answer as Python objects with raw bytes (msgpack body and handle API)."""
    pages = [row.tobytes() for row in acc]
    out: dict[str, Any] = {"epoch_id": int(epoch_id)}
    if identity is not None:
        out["identity"] = _checked_identity(identity)
    if not batch:
        out["pages"] = pages
        return out
    out["results"] = [
        {"pages": pages[i : i + KEYS_PER_QUERY]} for i in range(0, len(pages), KEYS_PER_QUERY)
    ]
    return out


def encode_json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def error_body(err: WireError) -> bytes:
    return encode_json(err.to_body())
