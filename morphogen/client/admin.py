"""The admin client: page updates, snapshot rotation and status of a party's router, and one
publication sent to both parties under one id until both have it."""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import msgpack

from morphogen.client.drivers import PirError, _error_from_response
from morphogen.client.wire import (
    PirUnavailable,
    Transient,
    encode_sparse_updates,
    encode_updates,
)
from morphogen.protocol.changes import ChangeBatch
from morphogen.protocol.codec import (
    ADMIN_SNAPSHOT_PATH,
    ADMIN_STATUS_PATH,
    ADMIN_UPDATES_PATH,
    BATCH_HEADER,
    DIGEST_HEADER,
    JSON_TYPE,
    MAX_ADMIN_UPDATES,
    MSGPACK_TYPE,
    PARENT_HEADER,
    PART_HEADER,
    PUBLICATION_HEADER,
)


class AdminClient:
    """The admin routes of ONE server (a party's router): page updates, snapshot rotation,
    status. Send every operation to both parties, in the same order. The token is sent as a
    bearer token and kept out of reprs and error messages."""

    def __init__(
        self,
        server: str,
        token: str,
        *,
        encoding: str = "msgpack",
        timeout_s: float = 600.0,
        transport: httpx.BaseTransport | None = None,
        sparse: bool | None = None,
    ) -> None:
        """`sparse`: send batches as their changed bytes (True), as lists of pages (False), or
        as the party's status says it takes them (None, asked once)."""
        if encoding not in ("json", "msgpack"):
            raise ValueError("encoding is 'json' or 'msgpack'")
        self.encoding = encoding
        self.url = server.rstrip("/")

        def connect() -> httpx.Client:
            return httpx.Client(
                base_url=self.url, timeout=httpx.Timeout(timeout_s, connect=10.0),
                transport=transport, headers={"Authorization": f"Bearer {token}"},
            )

        self._connect = connect
        self._http = connect()
        self._max_updates: int | None = None
        self._sparse: bool | None = sparse
        self._max_sparse = (0, 0)  # (pages, body bytes) of one body of changed bytes
        self._digests: tuple[int, ...] | None = None

    def __repr__(self) -> str:
        return f"AdminClient({str(self._http.base_url)!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, path: str, obj: Any | None = None, body: bytes | None = None,
              publication: str | None = None, parent: str | None = None,
              extra: dict[str, str] | None = None) -> dict:
        headers: dict[str, str] = dict(extra or {})
        if obj is not None or body is not None:
            if body is None:
                body = (msgpack.packb(obj, use_bin_type=True) if self.encoding == "msgpack"
                        else json.dumps(obj).encode())
            headers["Content-Type"] = MSGPACK_TYPE if self.encoding == "msgpack" else JSON_TYPE
            if publication is not None:
                headers[PUBLICATION_HEADER] = publication
            if parent is not None:
                headers[PARENT_HEADER] = parent

        def send() -> httpx.Response:
            if body is None:
                return self._http.get(path)
            return self._http.post(path, content=body, headers=headers)

        resp = send()
        if ingress_miss(resp):
            # The ingress, not the party, has no route: a kept-alive connection can outlive
            # a reload of the ingress's routes (an old HAProxy process keeps serving it with
            # the table from before the party was deployed again). The request never reached
            # the party, so it is sent once more, on a new connection.
            self._http.close()
            self._http = self._connect()
            resp = send()
        if resp.status_code != 200:
            err = _error_from_response(resp)
            if isinstance(err, Transient):
                raise PirUnavailable(f"HTTP {resp.status_code}: {_message(resp)}",
                                     resp.status_code, "unavailable")
            raise err
        return resp.json()

    def updates(self, changes: Sequence[tuple[int, str, bytes]] | ChangeBatch,
                publication: str | None = None, parent: str | None = None, *,
                max_per_request: int | None = None) -> dict:
        """Publish the next epoch with these changes; `{"epoch_id", "identity", "applied",
        "publication"}` (`"duplicate": true` when `publication` was committed before). With
        `parent`, the party applies it only on that identity (409 parent_mismatch else).
        More changes than `max_per_request` (the party's `admin_max_updates`) go as one
        publication in several requests, published whole by the last. `changes`: triples,
        or a `ChangeBatch` (packed once for every party it is sent to), whose digest version
        the party is told to take (`ChangeBatch.with_digest`; triples: 1). Send both parties
        the same version, one each lists in `batch_digests` (`common_digest_version`)."""
        named = _digest_named(changes)
        if max_per_request is None or len(changes) <= max_per_request:
            return self._send(ADMIN_UPDATES_PATH, body=self._updates_body(changes),
                              publication=publication, parent=parent, extra=named)
        whole = self._one_sparse_body(changes)
        if whole is not None:  # a block's diffs: thousands of pages in one small body
            return self._send(ADMIN_UPDATES_PATH, body=whole, publication=publication,
                              parent=parent, extra=named)
        batch = changes if isinstance(changes, ChangeBatch) else ChangeBatch.from_triples(changes)
        return self._in_parts(batch, publication or f"pub-{secrets.token_hex(12)}", parent,
                              max_per_request)

    def _in_parts(self, batch: ChangeBatch, publication: str, parent: str | None,
                  per_request: int) -> dict:
        digest = batch.digest
        changes = batch.triples()
        chunks = [changes[i:i + per_request] for i in range(0, len(changes), per_request)]

        def send(i: int) -> dict:
            return self._send(ADMIN_UPDATES_PATH, body=self._updates_body(chunks[i]),
                              publication=publication, parent=parent,
                              extra={PART_HEADER: f"{i + 1}/{len(chunks)}",
                                     BATCH_HEADER: digest, **_digest_named(batch)})

        for i in range(len(chunks) - 1):
            out = send(i)
            if out.get("duplicate"):  # committed before: nothing more to send
                return out
        try:
            return send(len(chunks) - 1)
        except PirError as exc:
            if exc.code != "missing_parts":
                raise
        # a part staged before was removed (an operator cleaning up, a store restored from
        # a backup): every part once more, then the last
        for i in range(len(chunks) - 1):
            send(i)
        return send(len(chunks) - 1)

    def _one_sparse_body(self, changes: Sequence[tuple[int, str, bytes]] | ChangeBatch
                         ) -> bytes | None:
        """All of `changes` as one body of changed bytes, where the party takes that many
        pages in one and the body fits its limit; else None (they go in parts)."""
        if self.encoding != "msgpack" or not self.sparse():
            return None
        pages, body_bytes = self._max_sparse
        if len(changes) > pages:
            return None
        body = encode_sparse_updates(changes)
        return body if len(body) <= body_bytes else None

    def _updates_body(self, changes: Sequence[tuple[int, str, bytes]] | ChangeBatch) -> bytes:
        if self.encoding == "msgpack" and self.sparse():
            return encode_sparse_updates(changes)
        return encode_updates(changes, self.encoding)

    def sparse(self) -> bool:
        """Whether this party takes a batch as its changed bytes (its status says; one of an
        earlier version does not, and is sent whole pages)."""
        if self._sparse is None:
            try:
                self._capabilities(self.status())
            except (PirError, httpx.HTTPError):
                return False  # whole pages this time; asked again with the next batch
        return bool(self._sparse)

    def snapshot(self, path: str, publication: str | None = None,
                 parent: str | None = None) -> dict:
        """Rotate to the snapshot at `path` (under the server's admin_snapshot_dir)."""
        return self._send(ADMIN_SNAPSHOT_PATH, {"path": str(path)}, publication=publication,
                          parent=parent)

    def max_updates(self) -> int:
        """The most updates this party takes in one request of whole pages (its status says; a
        party of an earlier version does not, and takes the default). A batch of changed
        bytes may carry more: `updates` sends it in one request where the party takes it."""
        if self._max_updates is None:
            self._capabilities(self.status())
        assert self._max_updates is not None
        return self._max_updates

    def batch_digests(self) -> tuple[int, ...]:
        """The batch digest versions this party takes (its status says; one of an earlier
        version says nothing, and takes 1 only)."""
        if self._digests is None:
            self._capabilities(self.status())
        assert self._digests is not None
        return self._digests

    def _capabilities(self, status: dict) -> None:
        self._max_updates = int(status.get("admin_max_updates") or MAX_ADMIN_UPDATES)
        self._digests = tuple(int(v) for v in status.get("admin_batch_digests") or (1,))
        self._max_sparse = (int(status.get("admin_max_sparse_updates") or 0),
                            int(status.get("admin_max_body_bytes") or 0))
        if self._sparse is None:
            self._sparse = bool(status.get("admin_sparse_updates"))

    def head(self) -> tuple[str | None, list[str]]:
        """The identity the party serves (its log's head) and its recent publication ids."""
        return head_of(self.status())

    def status(self) -> dict:
        return self._send(ADMIN_STATUS_PATH)


def common_digest_version(clients: Sequence[AdminClient]) -> int:
    """The newest batch digest version every party takes: what a publisher names to both
    (each party must derive the same identity from the same batch)."""
    common = set.intersection(*(set(c.batch_digests()) for c in clients)) if clients else set()
    return max(common | {1})


def _digest_named(changes: Sequence[tuple[int, str, bytes]] | ChangeBatch) -> dict[str, str]:
    """The header naming a batch's digest version, where it is not the default."""
    version = getattr(changes, "digest_version", 1)
    return {DIGEST_HEADER: str(version)} if version != 1 else {}


def changes_digest(changes: Sequence[tuple[int, str, bytes]]) -> str:
    """The digest a party computes of these changes as one batch (`ChangeBatch.digest`)."""
    return ChangeBatch.from_triples(changes).digest


def ingress_miss(resp: httpx.Response) -> bool:
    """A 404 from the HTTP ingress in front of the party (no route to it), not from the
    party's router, whose errors are JSON with an error code."""
    if resp.status_code != 404:
        return False
    try:
        return not isinstance(resp.json().get("error"), dict)
    except (ValueError, AttributeError):
        return True


def _message(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except Exception:  # noqa: BLE001
        return resp.text[:200]


log = logging.getLogger(__name__)


def content_publication_id(kind: str, content: bytes) -> str:
    """A publication id derived from what is published: re-running the same command re-sends
    the same id, so it is answered as done instead of applied twice."""
    return f"{kind[0]}-" + hashlib.blake2b(kind.encode() + b"\0" + content,
                                           digest_size=12).hexdigest()


class PartiesDiverged(PirError):
    """The parties answered one publication with different identities."""


class PartiesApart(PirError):
    """The parties serve different data before a publication, and it is not the one that
    left them so: sending it would apply it on two different heads."""


def head_of(status: dict) -> tuple[str | None, list[str]]:
    """(identity served, recent publication ids) from a party's `GET /admin/status`."""
    head = status.get("epoch_log_head") or {}
    ident = head.get("identity") or (status.get("shards") or [{}])[0].get("identity")
    return ident, [str(p) for p in status.get("recent_publications") or []]


def parents_for(clients: Sequence[AdminClient], publication: str,
                heads: Sequence[tuple[str | None, list[str]]]) -> list[str | None]:
    """The parent each party must have for `publication`: the one head both serve; or, when
    a publisher stopped between them, the heads as they are, provided the parties ahead
    already hold `publication` (re-sending it completes it: they answer it as done). Any
    other difference is refused: the parties hold different data.

    Every party may hold it, at different heads: an overlapped publisher (one party taking
    the next version while the other takes this one) stopped before it noted this one done.
    Re-sent, it is answered as done by each, and the next version brings the one behind up."""
    idents = [h[0] for h in heads]
    if len(set(idents)) <= 1:
        return idents
    ahead = [publication in recent for _, recent in heads]
    if any(ahead):
        return idents  # each party behind gets it on its own head; one that has it, nothing
    raise PartiesApart(
        "the parties serve different data before publication " + publication + ": "
        + "; ".join(f"{c.url} at {i}" for c, i in zip(clients, idents, strict=True))
        + ". Another publisher is mid-way or stopped between them: re-run the publication it "
          "left half done (a party that has it answers it as done), or rotate both to one "
          "snapshot (morphogen admin --server A --server B snapshot PATH)", 409,
        "parties_apart")


def read_parents(clients: Sequence[AdminClient], publication: str, retry_for_s: float,
                 sleep: Callable[[float], None] = time.sleep) -> list[str | None]:
    """Every party's head read (re-sent as a publication is), then `parents_for`."""
    heads = [_with_retries(c, c.head, retry_for_s, sleep) for c in clients]
    return parents_for(clients, publication, heads)


def publish_to_parties(
    clients: Sequence[AdminClient],
    send: Callable[..., dict],
    *,
    retry_for_s: float = 120.0,
    sleep: Callable[[float], None] = time.sleep,
    publication: str | None = None,
    parents: Sequence[str | None] | None = None,
) -> list[dict]:
    """`send` (one publication, one id) to every party in order, re-sending to a party that
    answers a 5xx or 429 (a 500 is what Serve answers when the router replica serving the
    request dies) or cannot be reached until `retry_for_s` is spent; a 4xx is final. Raises
    PartiesDiverged when the parties name different identities afterwards (they did not hold
    the same data before: see `compare_parties`). Safe to call again with the same id: a party
    that has it answers it as done.

    With `publication` (its id), `send(client, parent)` names the parent identity each party
    must serve (`parents_for`, read from every party before sending to any): of two
    publishers sending at once, the second is refused by party A (409 parent_mismatch) before
    it reaches B, so A and B apply one sequence, never two orders of it. `parents` gives
    them instead of reading them (a publisher that knows what its last publication left:
    a party that moved since refuses, as it should)."""
    out = []
    if publication is None:
        parents = [None] * len(clients)
    elif parents is None:
        parents = read_parents(clients, publication, retry_for_s, sleep)
    for client, parent in zip(clients, parents, strict=True):
        if publication is None:
            out.append(_with_retries(client, lambda c=client: send(c), retry_for_s, sleep,
                                     clients, out))
        else:
            out.append(_with_retries(client, lambda c=client, p=parent: send(c, p),
                                     retry_for_s, sleep, clients, out))
    identities = {r.get("identity") for r in out}
    if len(identities) > 1:
        raise PartiesDiverged(
            "the parties answered with different identities: "
            + "; ".join(f"{c.url} epoch {r.get('epoch_id')} {r.get('identity')}"
                        for c, r in zip(clients, out, strict=True))
            + ". They held different data before this publication; rotate both to one "
              "snapshot (morphogen admin --server A --server B snapshot PATH)")
    return out


def _with_retries(client: AdminClient, call: Callable[[], Any], retry_for_s: float,
                  sleep: Callable[[float], None], clients: Sequence[AdminClient] = (),
                  out: Sequence[dict] = ()) -> Any:
    """`call()`, re-sent on what a dead router replica (5xx, 429) or an unreachable party
    answers until `retry_for_s` is spent; a 4xx is final. `out`: what `clients` answered
    before, for the message."""
    deadline = time.monotonic() + retry_for_s
    delay = 0.25
    while True:
        try:
            return call()
        except (PirUnavailable, httpx.TransportError) as exc:
            if time.monotonic() + delay > deadline:
                done = ", ".join(f"{c.url} at epoch {r.get('epoch_id')}"
                                 for c, r in zip(clients, out, strict=False))
                raise PirUnavailable(
                    f"{client.url} did not take the publication ({exc}); "
                    + (f"applied on {done}; " if done else "")
                    + "re-run the same command: it is safe, a party that has it answers "
                      "it as done") from None
            log.warning("%s: %s; re-sending in %.1fs", client.url, exc, delay)
            sleep(delay)
            delay = min(delay * 2, 5.0)


def compare_parties(names: Sequence[str], statuses: Sequence[dict]) -> str | None:
    """None when every party serves one identity, else what differs and the command that
    brings them together."""
    idents = [head_of(s)[0] for s in statuses]
    if len(set(idents)) <= 1:
        return None
    lines = ["parties differ: " + "; ".join(
        f"{n} at epoch {s.get('epoch_id')} ({i})"
        for n, s, i in zip(names, statuses, idents, strict=True))]
    recent = [head_of(s)[1] for s in statuses]
    for n, mine in zip(names, recent, strict=True):
        for other in recent:
            if other is mine or (mine and mine[-1] not in other):
                continue
            missing = other[other.index(mine[-1]) + 1 :] if mine else other
            if missing:
                lines.append(f"{n} lacks publication(s) {', '.join(missing)}: re-run the "
                             "command(s) that published them with every --server (safe: a "
                             "party that has one answers it as done)")
                break
    lines.append("or bring both to one snapshot: morphogen admin " + " ".join(
        f"--server {n}" for n in names) + " snapshot PATH")
    return "\n".join(lines)
