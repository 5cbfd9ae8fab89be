"""The two-server client's vocabulary, free of I/O: its errors, what the servers advertise and
answer (`ServerInfo`, `View`, `Answer`), and the pure coding of requests and answers.

Identities (`"0x"` + hex, a digest naming the exact data an epoch serves) are optional
everywhere: the reference server publishes none, and then epoch ids are all there is to compare.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack
import numpy as np

from morphogen.constants import (
    KEY_FORMAT_PACKED,
    KEY_FORMAT_V1,
    KEY_FORMATS,
    KEYS_PER_QUERY,
    MAX_BATCH_QUERIES,
    MAX_DOMAIN_BITS,
    PAGE_SIZE,
)
from morphogen.protocol.changes import ChangeBatch
from morphogen.protocol.codec import (
    BATCH_PATH,
    JSON_TYPE,
    MSGPACK_TYPE,
    QUERY_PATH,
    from_hex,
    is_msgpack,
    to_hex,
)
from morphogen.protocol.dpf import generate_keys
from morphogen.protocol.packed import generate_packed_keys

# What a replica's death, an overloaded party or a restart looks like from outside: retried with
# fresh keys to both parties (a read is safe to repeat). Serve answers 500 for a request whose
# replica died under it (its Python proxy maps the actor's death to 500; its HAProxy ingress
# rewrites 502/503/504 to 500), with no Retry-After, so a 500 is retried like a 502. Every
# other 4xx is the router refusing the request itself and is final.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


# --------------------------------------------------------------------------- errors


class PirError(Exception):
    """A request the servers refused (4xx/5xx) or a malformed answer."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class PirUnavailable(PirError):
    """No consistent answer after every retry (epoch mismatch, 5xx, connection errors);
    `status` is the last HTTP status met, if the last failure was one."""


class EpochMismatchError(PirUnavailable):
    """Servers A and B kept answering from different epochs: they do not hold the same data
    (one party missed an update or a rotation, or they are updated at different times)."""


class PageOutOfRange(PirError, IndexError):
    """A wanted page is not in the servers' data (at or past its end, or negative)."""

    def __init__(self, page: int, num_pages: int) -> None:
        super().__init__(
            f"page {page} is outside 0..{num_pages - 1}: the servers hold {num_pages} pages",
            code="page_out_of_range",
        )
        self.page = page
        self.num_pages = num_pages


class UnknownTable(PirError, LookupError):
    """A table the servers do not advertise (GET /epoch's `tables`); raised before any query
    is sent."""

    def __init__(self, table: str, known: Sequence[str]) -> None:
        listed = ", ".join(sorted(known)) or "none"
        super().__init__(f"the servers serve no table {table!r} (tables: {listed})",
                         code="unknown_table")
        self.table = table


class DataMoved(PirError, LookupError):
    """The servers answered from other data than the pages were planned for, and the caller
    asked not to follow it (`get_pinned`): nothing was re-sent. /epoch has been read again."""


class Transient(Exception):
    """A failure worth retrying. `delay` is the server's Retry-After hint; `kind` says which
    error to give up with."""

    def __init__(self, reason: str, delay: float | None = None, kind: str = "other",
                 status: int | None = None) -> None:
        super().__init__(reason)
        self.delay = delay
        self.kind = kind
        self.status = status


def failure_for_status(
    status: int, code: str | None, message: str, retry_after: float | None = None
) -> Exception:
    """What an HTTP error status means to the client: retry it or raise it."""
    if status in RETRY_STATUSES:
        return Transient(f"HTTP {status} {code or ''}".strip(), retry_after, status=status)
    return PirError(f"HTTP {status}: {message}", status, code)


# --------------------------------------------------------------------------- data


class View(NamedTuple):
    """The data a party serves or an answer came from; `identity` None where not published."""

    epoch_id: int
    identity: str | None

    def same(self, other: View) -> bool:
        # Identities are compared only where both sides have one: the reference server has none.
        if self.epoch_id != other.epoch_id:
            return False
        return self.identity is None or other.identity is None or self.identity == other.identity

    def __str__(self) -> str:
        return f"epoch {self.epoch_id}" + (f" ({self.identity})" if self.identity else "")


class TableInfo(NamedTuple):
    """One named table as GET /epoch advertises it: pages `[first_page, first_page +
    num_pages)` of the matrix, queried as pages 0..num_pages-1 with keys of `domain_bits`."""

    first_page: int
    num_pages: int
    domain_bits: int


@dataclass(frozen=True)
class ServerInfo:
    """What both servers advertise (GET /epoch) and the client plans against.

    `epoch_id` and `identity` are A's; `epoch_ids` and `identities` are (A's, B's), which differ
    for a moment while an update or a rotation reaches one party before the other. Both parties
    always agree on `num_pages`, `domain_bits` and `tables` (the client refuses them
    otherwise).
    """

    num_pages: int
    domain_bits: int
    epoch_id: int
    max_batch_queries: int = MAX_BATCH_QUERIES
    identity: str | None = None
    epoch_ids: tuple[int, ...] = ()
    identities: tuple[str | None, ...] = ()
    tables: dict[str, TableInfo] = field(default_factory=dict, hash=False)
    # the key formats both parties take (a server that names none takes v1 only)
    key_formats: tuple[str, ...] = (KEY_FORMAT_V1,)

    def key_format(self, allowed: str = "auto") -> str:
        """The format keys are made in: packed where both parties take it and `allowed` is
        "auto", v1 otherwise."""
        if allowed == "auto" and KEY_FORMAT_PACKED in self.key_formats:
            return KEY_FORMAT_PACKED
        return KEY_FORMAT_V1

    def __post_init__(self) -> None:
        if not self.epoch_ids:
            object.__setattr__(self, "epoch_ids", (self.epoch_id, self.epoch_id))
        if not self.identities:
            object.__setattr__(self, "identities", (self.identity, self.identity))

    @property
    def views(self) -> tuple[View, View]:
        return (View(self.epoch_ids[0], self.identities[0]),
                View(self.epoch_ids[1], self.identities[1]))

    def names(self, view: View) -> bool:
        """Whether either party advertised `view`: the shape of that data is then known."""
        return any(v.same(view) for v in self.views)

    def is_exactly(self, view: View) -> bool:
        """Whether both parties advertise `view` (identities compared where published)."""
        return all(v.same(view) for v in self.views)

    def shape(self, table: str | None = None) -> tuple[int, int]:
        """`(num_pages, domain_bits)` that keys of `table` (None: the whole matrix) are planned
        against; `UnknownTable` for a table not advertised."""
        if table is None:
            return self.num_pages, self.domain_bits
        t = self.tables.get(table)
        if t is None:
            raise UnknownTable(table, list(self.tables))
        return t.num_pages, t.domain_bits


class Answer(NamedTuple):
    """One party's decoded answer: accumulators in key order. After `combine`: the pages."""

    epoch_id: int
    identity: str | None
    pages: list[bytes]


# --------------------------------------------------------------------------- pure helpers


def check_pages(pages: Sequence[int], num_pages: int) -> list[int]:
    out = [int(p) for p in pages]
    for p in out:
        if not 0 <= p < num_pages:
            raise PageOutOfRange(p, num_pages)
    return out


def plan_targets(pages: Sequence[int], num_pages: int) -> list[int]:
    """The wanted pages padded with random dummies to a whole number of queries."""
    out = check_pages(pages, num_pages)
    while len(out) % KEYS_PER_QUERY:
        out.append(secrets.randbelow(num_pages))
    return out


def make_keys(
    targets: Sequence[int], domain_bits: int, key_format: str = KEY_FORMAT_V1
) -> tuple[list[list[bytes]], list[list[bytes]]]:
    """Fresh key pairs for `targets` (of `key_format`: v1 or packed), grouped as queries:
    (queries for A, queries for B)."""
    if key_format not in KEY_FORMATS:
        raise ValueError(f"key format is one of {', '.join(KEY_FORMATS)}, not {key_format!r}")
    gen = generate_packed_keys if key_format == KEY_FORMAT_PACKED else generate_keys
    qa: list[list[bytes]] = []
    qb: list[list[bytes]] = []
    for i in range(0, len(targets), KEYS_PER_QUERY):
        ka, kb = [], []
        for t in targets[i : i + KEYS_PER_QUERY]:
            k0, k1 = gen(domain_bits, t)
            ka.append(k0.to_bytes())
            kb.append(k1.to_bytes())
        qa.append(ka)
        qb.append(kb)
    return qa, qb


def encode_request(queries: list[list[bytes]], encoding: str,
                   table: str | None = None) -> tuple[str, bytes, dict[str, str]]:
    """(path, body, headers) of a single query (one) or a batch request (several); `table`
    names one of the servers' tables (absent from the body for the whole matrix, so that a
    reference server reads it)."""
    batch = len(queries) != 1
    path = BATCH_PATH if batch else QUERY_PATH
    if encoding == "msgpack":
        obj: Any = {"queries": [{"keys": q} for q in queries]} if batch else {"keys": queries[0]}
        if table is not None:
            obj["table"] = table
        body = msgpack.packb(obj, use_bin_type=True)
        mt = MSGPACK_TYPE
    else:
        if batch:
            obj = {"queries": [{"keys": [to_hex(k) for k in q]} for q in queries]}
        else:
            obj = {"keys": [to_hex(k) for k in queries[0]]}
        if table is not None:
            obj["table"] = table
        body = json.dumps(obj, separators=(",", ":")).encode()
        mt = JSON_TYPE
    return path, body, {"Content-Type": mt, "Accept": mt}


def _identity(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value[:2] not in ("0x", "0X") or len(value) < 3:
        raise ValueError("identity is not 0x + hex digits")
    int(value[2:], 16)
    return value.lower()


def answer_from_obj(obj: Any, num_queries: int) -> Answer:
    """An `Answer` from a decoded single or batch response (HTTP body or handle dict)."""
    try:
        epoch = obj["epoch_id"]
        identity = _identity(obj.get("identity"))
        if num_queries == 1 and "pages" in obj:
            groups = [obj["pages"]]
        else:
            groups = [r["pages"] for r in obj["results"]]
        if len(groups) != num_queries or any(len(g) != KEYS_PER_QUERY for g in groups):
            raise ValueError("wrong number of answers")
        pages = [bytes(p) if isinstance(p, bytes | bytearray | memoryview) else from_hex(p)
                 for g in groups for p in g]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PirError(f"malformed answer: {exc}") from None
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        raise PirError("malformed answer: bad epoch id")
    if any(len(p) != PAGE_SIZE for p in pages):
        raise PirError("malformed answer: bad page size")
    return Answer(epoch, identity, pages)


def decode_answer(body: bytes, content_type: str | None, num_queries: int) -> Answer:
    """The `Answer` in a single or batch response body."""
    try:
        obj = msgpack.unpackb(body, raw=False) if is_msgpack(content_type) else json.loads(body)
    except ValueError as exc:
        raise PirError(f"malformed answer: {exc}") from None
    return answer_from_obj(obj, num_queries)


def xor_pages(a: Sequence[bytes], b: Sequence[bytes]) -> list[bytes]:
    return [
        np.bitwise_xor(np.frombuffer(x, np.uint8), np.frombuffer(y, np.uint8)).tobytes()
        for x, y in zip(a, b, strict=True)
    ]


def info_from_epoch(doc_a: Any, doc_b: Any) -> ServerInfo:
    """Both parties' GET /epoch documents as one `ServerInfo`; `Transient` while they disagree
    on the matrix's shape (one party may finish a snapshot rotation before the other)."""
    try:
        pa, pb = doc_a["page_pir"], doc_b["page_pir"]
        shape_a = (int(pa["num_pages"]), int(pa["domain_bits"]))
        shape_b = (int(pb["num_pages"]), int(pb["domain_bits"]))
        max_batch = min(int(pa.get("max_batch_queries", MAX_BATCH_QUERIES)),
                        int(pb.get("max_batch_queries", MAX_BATCH_QUERIES)))
        epochs = (int(doc_a["epoch_id"]), int(doc_b["epoch_id"]))
        idents = (_identity(doc_a.get("identity")), _identity(doc_b.get("identity")))
        tables_a, tables_b = _tables(doc_a), _tables(doc_b)
        formats = [set(p.get("key_formats") or (KEY_FORMAT_V1,)) for p in (pa, pb)]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PirError(f"malformed /epoch document: {exc}") from None
    if shape_a != shape_b:
        raise Transient(
            "the two servers serve different matrices (A: {} pages, domain {}; B: {} pages, "
            "domain {})".format(*shape_a, *shape_b),
            kind="matrix",
        )
    if tables_a != tables_b:
        raise Transient(f"the two servers serve different tables (A: {sorted(tables_a)}; "
                        f"B: {sorted(tables_b)})", kind="matrix")
    num_pages, domain_bits = shape_a
    if not (1 <= domain_bits <= MAX_DOMAIN_BITS and 1 <= num_pages <= 1 << domain_bits
            and max_batch >= 1):
        raise PirError(f"malformed /epoch document: {num_pages} pages in domain {domain_bits}")
    for name, t in tables_a.items():
        # keys in a smaller domain would alias the table's pages (PROTOCOL.md's rule)
        if not (1 <= t.num_pages <= 1 << t.domain_bits and t.domain_bits <= MAX_DOMAIN_BITS
                and 0 <= t.first_page and t.first_page + t.num_pages <= num_pages):
            raise PirError(f"malformed /epoch document: table {name!r} is {t}")
    both = tuple(f for f in KEY_FORMATS if f in formats[0] and f in formats[1])
    return ServerInfo(num_pages, domain_bits, epochs[0], max_batch, idents[0], epochs, idents,
                      tables_a, both or (KEY_FORMAT_V1,))


def _tables(doc: Any) -> dict[str, TableInfo]:
    """A /epoch document's named tables (none from a server without them)."""
    return {str(name): TableInfo(int(t["first_page"]), int(t["num_pages"]),
                                 int(t["domain_bits"]))
            for name, t in (doc.get("tables") or {}).items()}


def encode_sparse_updates(changes: Sequence[tuple[int, str, bytes]] | ChangeBatch) -> bytes:
    """The msgpack body of `POST /admin/updates` holding the same changes as their changed
    bytes (`morphogen.protocol.sparse`): a batch of XOR diffs costs what it changed, not 4 KiB
    a page. Parties that say `admin_sparse_updates` in their status take it. A `ChangeBatch`
    is packed once, whatever the number of parties it is sent to."""
    batch = changes if isinstance(changes, ChangeBatch) else ChangeBatch.from_triples(changes)
    return msgpack.packb({"batch": {"pages": batch.pages.astype("<i8").tobytes(),
                                    "replace": batch.replace.astype(np.uint8).tobytes(),
                                    "data": batch.packed}}, use_bin_type=True)


def encode_updates(changes: Sequence[tuple[int, str, bytes]] | ChangeBatch,
                   encoding: str = "msgpack") -> bytes:
    """The body of `POST /admin/updates` for `(page, "diff" | "data", bytes)` triples."""
    if isinstance(changes, ChangeBatch):
        changes = changes.triples()
    items: list[dict[str, Any]] = []
    for page, kind, raw in changes:
        if kind not in ("diff", "data"):
            raise ValueError("an update is a 'diff' (XOR) or a 'data' (replacement)")
        items.append({"page": int(page), kind: bytes(raw) if encoding == "msgpack"
                      else to_hex(raw)})
    if encoding == "msgpack":
        return msgpack.packb({"updates": items}, use_bin_type=True)
    return json.dumps({"updates": items}, separators=(",", ":")).encode()
