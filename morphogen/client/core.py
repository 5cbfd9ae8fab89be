"""The two-server client's protocol logic, free of I/O: what to ask, what to believe, when to
retry. The drivers in `morphogen.client.drivers` only move bytes and sleep.

An operation (`ClientCore.get`, `get_with_epoch`, `read_info`) is a generator. It yields
actions (`ReadEpoch`, `Send`, `Sleep`) and is sent their results: the pair of GET /epoch
documents, the pair of decoded `Answer`s, or nothing. A failed action is thrown back in as a
`Transient` (worth retrying: a 5xx or 429, a dropped connection or a timeout) or a `PirError`
(a 4xx: the router refused the request itself).
`drive` and `adrive` run an operation against a caller's `perform` function.

What the core will vouch for: a page is returned only when A and B answered from the same epoch
and, where both name one, the same identity (a digest of the exact data), and that data is one
whose page count and key domain the client knows from GET /epoch, so that a page past the end of
a shrunken snapshot is never mistaken for a page of zeros. Data that either party advertised
when the keys were planned qualifies at once (both parties advertised the same shape). An
answer from other data makes the client re-read /epoch: it is kept when both parties now
advertise exactly that data in the planned domain and it still holds every wanted page; a
wanted page past the new end raises `PageOutOfRange`; otherwise the pages are asked again with
fresh keys. Servers without identities (the reference) are checked by epoch id alone.
A named table (GET /epoch's `tables`) is planned the same way with its own page count and key
domain: its pages are numbered from 0 within the table, and a table the servers do not advertise
raises `UnknownTable` before any query is sent.
`get_pinned` follows no move: other data in an answer, or a domain refusal after a change of
shape, raises `DataMoved` once /epoch is read again, whichever pages were wanted.

Every reason to retry (a 5xx or 429, a dropped connection, A and B on different epochs or
identities, parties mid-rotation, a domain refusal, data that moved again) spends from one
budget of `RetryPolicy.attempts` per request, so a call always ends. Each retry sends fresh keys
to both parties: a read is safe to repeat, and a replica's death (Serve answers 500 for the
requests it had in flight, or drops the connection) is only a slower answer.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from morphogen.client.wire import (
    Answer,
    DataMoved,
    EpochMismatchError,
    PirError,
    PirUnavailable,
    ServerInfo,
    Transient,
    View,
    check_pages,
    info_from_epoch,
    make_keys,
    plan_targets,
    xor_pages,
)
from morphogen.constants import KEY_FORMAT_V1, KEYS_PER_QUERY, MAX_BATCH_QUERIES

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` tries per request, sleeping `backoff_s` doubled after each failure (at most
    `max_backoff_s`, at least a server's Retry-After within that cap), jittered down to half.

    The default sleeps 10.5 to 21 s in all before it gives up: long enough to ride out what a
    replica's death does to the parties, at worst a publication whose router died on one party
    after the other had it (the parties then serve different epochs until the admin's re-send
    goes through, after the dead router's lease of `admin_lease_s`, 5 s by default, and the
    publication itself), with room for a loaded machine.

    While the parties disagree (their answers or /epoch documents name different epochs,
    identities or shapes) a backoff is spent reading both /epoch documents every
    `agreement_poll_s` instead of sleeping it whole, and ends as soon as both name the same
    data: the read resumes within a poll of the parties agreeing, not up to a backoff (2 s)
    later, when the next publication may already have parted them again; and no scan is
    asked of the servers while they cannot answer alike. 0 sleeps every backoff whole."""

    attempts: int = 14
    backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    agreement_poll_s: float = 0.25

    def delay(self, attempt: int, hint: float | None = None) -> float:
        base = min(self.max_backoff_s, self.backoff_s * (2**attempt))
        if hint is not None:
            base = min(self.max_backoff_s, max(base, hint))
        # Jitter so that many clients retrying together do not come back in lockstep.
        return base * (0.5 + secrets.randbelow(1000) / 2000)


def domain_retry(exc: PirError, used: ServerInfo, fresh: ServerInfo, refusals: int,
                 table: str | None = None) -> bool:
    """Whether a `bad_domain` refusal is worth a retry with keys for `fresh`: the servers'
    domain (of `table`) moved since the keys were made (a snapshot rotation), or it is the
    first refusal of this fetch (a router may only now have seen a rotation that /epoch
    already shows). A repeated refusal without any change is a client bug and is raised."""
    moved = fresh.shape(table) != used.shape(table)
    return exc.code == "bad_domain" and (moved or refusals == 1)


def give_up(attempts: int, last: Transient | None) -> PirUnavailable:
    if last is not None and last.kind == "epoch":
        return EpochMismatchError(
            f"servers A and B answered from different epochs ({last}) and still did after "
            f"{attempts} attempts: they do not serve the same data; both parties must receive "
            "the same updates and rotations in the same order"
        )
    if last is not None and last.kind == "identity":
        return PirUnavailable(
            f"{last}, still after {attempts} attempts: one party missed or reordered an update, "
            "or a snapshot was rebuilt under the same epoch id"
        )
    return PirUnavailable(f"gave up after {attempts} attempts: {last or 'no attempt'}",
                          last.status if last is not None else None)


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class ReadEpoch:
    """Wanted: both parties' GET /epoch documents, as (A's, B's)."""


@dataclass(frozen=True)
class Send:
    """Wanted: `queries_a` sent to A and `queries_b` to B, concurrently; the reply is
    (A's `Answer`, B's `Answer`)."""

    queries_a: list[list[bytes]]
    queries_b: list[list[bytes]]
    table: str | None = None  # the table both are of (None: the whole matrix)


@dataclass(frozen=True)
class Sleep:
    seconds: float


Action = ReadEpoch | Send | Sleep
Machine = Generator[Action, Any, T]


def drive(machine: Machine[T], perform: Callable[[Action], Any]) -> T:
    """Run an operation to its end, `perform` doing each action (blocking)."""
    reply: Any = None
    failure: Exception | None = None
    try:
        while True:
            try:
                action = machine.send(reply) if failure is None else machine.throw(failure)
            except StopIteration as done:
                return done.value
            reply, failure = None, None
            try:
                reply = perform(action)
            except (Transient, PirError) as exc:
                failure = exc
    finally:
        machine.close()


async def adrive(machine: Machine[T], perform: Callable[[Action], Awaitable[Any]]) -> T:
    """`drive` for asyncio: `perform` is a coroutine function."""
    reply: Any = None
    failure: Exception | None = None
    try:
        while True:
            try:
                action = machine.send(reply) if failure is None else machine.throw(failure)
            except StopIteration as done:
                return done.value
            reply, failure = None, None
            try:
                reply = await perform(action)
            except (Transient, PirError) as exc:
                failure = exc
    finally:
        machine.close()


# --------------------------------------------------------------------------- the core


class _Budget:
    """The tries of one operation, shared by every reason to retry it."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.failures = 0

    def spend(self, reason: Transient, floor: int = 0) -> Machine[ServerInfo | None]:
        """One try spent and its backoff waited; while the parties disagree, the wait ends
        early once both /epoch documents name the same data, of an epoch no older than
        `floor` (the newer of two epochs the answers named: a replica still on the older one
        would only part them again), and that data's `ServerInfo` is returned."""
        self.failures += 1
        if self.failures >= self.policy.attempts:
            raise give_up(self.policy.attempts, reason)
        delay = self.policy.delay(self.failures - 1, reason.delay)
        poll = self.policy.agreement_poll_s
        if reason.kind in DISAGREEMENT and poll > 0:
            return (yield from _until_agreed(delay, poll, floor, reason.kind == "matrix"))
        yield Sleep(delay)
        return None


# The reasons to retry that are the parties disagreeing (both answered): they end when both
# have the same data, which their /epoch documents show
DISAGREEMENT = frozenset({"epoch", "identity", "matrix", "moved"})


def _until_agreed(delay: float, poll: float, floor: int,
                  shape_only: bool = False) -> Machine[ServerInfo | None]:
    """Wait up to `delay` (plus the reads' own time), reading both /epoch documents every
    `poll`: the parties' common view once they agree (`shape_only`: once they serve the same
    shape, all a refresh waits for), None when the wait ran out (or a read failed: the rest is
    slept whole, as a plain backoff)."""
    left = delay
    while left > poll:
        yield Sleep(poll)
        left -= poll
        try:
            docs = yield ReadEpoch()
            info = info_from_epoch(*docs)
        except Transient as reason:
            if reason.kind in DISAGREEMENT:
                continue
            break
        except PirError:
            break
        if shape_only or (info.views[0].same(info.views[1]) and info.epoch_id >= floor):
            return info
    yield Sleep(left)
    return None


class ClientCore:
    """The state one client shares between its calls (the cached `ServerInfo`) and the
    operations that run on it. Safe to use from several threads: the only shared state is
    `info`, replaced whole."""

    def __init__(
        self, retry: RetryPolicy | None = None, max_batch_queries: int | None = None,
        key_format: str = "auto",
    ) -> None:
        if key_format not in ("auto", KEY_FORMAT_V1):
            raise ValueError(f"key_format is 'auto' or 'v1', not {key_format!r}")
        self.retry = retry or RetryPolicy()
        self.max_batch_queries = max_batch_queries
        self.key_format = key_format  # "auto": packed keys where both parties take them
        self.info: ServerInfo | None = None

    def pages_per_request(self, info: ServerInfo) -> int:
        per = min(self.max_batch_queries or MAX_BATCH_QUERIES, info.max_batch_queries)
        return per * KEYS_PER_QUERY

    # ---------------------------------------------------------------- operations

    def read_info(self, refresh: bool = False) -> Machine[ServerInfo]:
        """The cached `ServerInfo`, read from both parties first when absent or `refresh`."""
        if self.info is not None and not refresh:
            return self.info
        return (yield from self._refresh(_Budget(self.retry)))

    def read_table(self, table: str | None) -> Machine[ServerInfo]:
        """`read_info`, making sure it advertises `table`: a table the cached info lacks is
        looked for once more in a fresh /epoch (a rotation may have added it), then refused
        with `UnknownTable`."""
        info = yield from self.read_info()
        if table is not None and table not in info.tables:
            info = yield from self.read_info(refresh=True)
            info.shape(table)
        return info

    def get(self, pages: Sequence[int], table: str | None = None) -> Machine[list[bytes]]:
        """The wanted pages (of `table`, numbered within it) in order; several requests when
        they do not fit in one."""
        if len(pages) == 0:
            return []
        info = yield from self.read_table(table)
        # Checked against the cached info, before anything is sent. Refreshing first would tell
        # the servers that the client wants a page past the end it knew; growth is seen at the
        # next answer from newer data, or with info(refresh=True).
        wanted = check_pages(pages, info.shape(table)[0])
        out: list[bytes] = []
        while len(out) < len(wanted):
            assert self.info is not None
            step = self.pages_per_request(self.info)
            got = yield from self._fetch(wanted[len(out) : len(out) + step], table=table)
            out.extend(got.pages)
        return out

    def get_with_epoch(self, pages: Sequence[int],
                       table: str | None = None) -> Machine[tuple[int, list[bytes]]]:
        """`(epoch_id, pages)` of one request: every page from the same data."""
        if len(pages) == 0:
            raise ValueError("no pages asked")
        info = yield from self.read_table(table)
        wanted = check_pages(pages, info.shape(table)[0])
        cap = self.pages_per_request(info)
        if len(wanted) > cap:
            raise ValueError(f"get_with_epoch takes at most {cap} pages (one request)")
        got = yield from self._fetch(wanted, table=table)
        return got.epoch_id, got.pages

    def get_pinned(self, pages: Sequence[int], num_pages: int | None = None,
                   table: str | None = None) -> Machine[Answer]:
        """One request's pages with the epoch and identity they are from, only from data that
        /epoch named when the keys were planned: when the servers moved to other data, /epoch
        is read again and `DataMoved` raised, nothing re-sent. For callers whose page numbers
        mean something only in one table (a keyword table's candidates): re-sending them to
        other data would succeed or fail depending on which pages they are. `num_pages`, the
        size the caller planned for, raises `DataMoved` before anything is sent when the
        cached /epoch names another (refused pages would depend on the pages); with `table`,
        pages and `num_pages` are the table's."""
        if len(pages) == 0:
            raise ValueError("no pages asked")
        info = yield from self.read_table(table)
        size = info.shape(table)[0]
        if num_pages is not None and size != num_pages:
            what = "pages" if table is None else f"pages in table {table!r}"
            raise DataMoved(f"the servers serve {size} {what}, not {num_pages}")
        wanted = check_pages(pages, size)
        cap = self.pages_per_request(info)
        if len(wanted) > cap:
            raise ValueError(f"get_pinned takes at most {cap} pages (one request)")
        return (yield from self._fetch(wanted, pinned=True, table=table))

    # ---------------------------------------------------------------- steps

    def _agreed(self, info: ServerInfo | None, pinned: bool = False) -> ServerInfo:
        """The info to plan the next try with: what both parties were just seen to agree
        on (kept as the client's), else the cached one. A pinned read keeps planning with the
        cached one: data it was not planned for must end it in `DataMoved`, not answer it."""
        if info is not None and not pinned:
            self.info = info
        assert self.info is not None
        return self.info

    def _refresh(self, budget: _Budget) -> Machine[ServerInfo]:
        while True:
            try:
                docs = yield ReadEpoch()
                info = info_from_epoch(*docs)
            except Transient as reason:
                agreed = yield from budget.spend(reason)
                if agreed is None:
                    continue
                info = agreed
            self.info = info
            return info

    def _fetch(self, wanted: list[int], pinned: bool = False,
               table: str | None = None) -> Machine[Answer]:
        """One request's worth of pages (of `table`), verified; re-planned across rotations
        unless `pinned`."""
        budget = _Budget(self.retry)
        refusals = 0
        info = self.info
        assert info is not None
        while True:
            size, domain = info.shape(table)
            targets = plan_targets(wanted, size)
            fmt = info.key_format(self.key_format)
            qa, qb = make_keys(targets, domain, fmt)
            try:
                a, b = yield Send(qa, qb, table)
            except Transient as reason:
                yield from budget.spend(reason)
                info = self.info
                continue
            except PirError as exc:
                if exc.code == "bad_key" and fmt != KEY_FORMAT_V1:
                    # a party that stopped taking packed keys (redeployed on shards without
                    # them): re-read /epoch once; refused again under the same formats, raise
                    refusals += 1
                    fresh = yield from self._refresh(budget)
                    if fresh.key_format(self.key_format) == fmt or refusals > 1:
                        raise exc from None
                    info = fresh
                    continue
                if exc.code != "bad_domain":
                    raise
                refusals += 1
                fresh = yield from self._refresh(budget)
                if pinned and _shape_or_none(fresh, table) != (size, domain):
                    raise DataMoved(f"the servers now serve {_shape_or_none(fresh, table)} "
                                    "(pages, domain)") from None
                if not domain_retry(exc, info, fresh, refusals, table):
                    raise exc from None
                yield from budget.spend(Transient("the servers' key domain changed (rotation)"))
                info = self.info
                continue
            if a.epoch_id != b.epoch_id:
                info = self._agreed((yield from budget.spend(
                    Transient(f"epochs differ (A {a.epoch_id}, B {b.epoch_id})", kind="epoch"),
                    floor=max(a.epoch_id, b.epoch_id))), pinned)
                continue
            if a.identity is not None and b.identity is not None and a.identity != b.identity:
                info = self._agreed((yield from budget.spend(Transient(
                    f"the parties serve different data under epoch {a.epoch_id} "
                    f"(A {a.identity}, B {b.identity})", kind="identity"), floor=a.epoch_id)),
                    pinned)
                continue
            view = View(a.epoch_id, a.identity if b.identity is not None else None)
            if not info.names(view):
                # Computed on data the keys were not planned for: its page count is unknown
                # until /epoch names it (a page past the end of a smaller snapshot XORs to zeros).
                fresh = yield from self._refresh(budget)
                if pinned:
                    raise DataMoved(f"answered from {view}, not from data planned for")
                fresh_size, fresh_domain = fresh.shape(table)
                check_pages(wanted, fresh_size)
                if not (fresh.is_exactly(view) and fresh_domain == domain
                        and (table is None or fresh.tables[table] == info.tables[table])):
                    agreed = yield from budget.spend(Transient(
                        f"answered from {view}, now /epoch names A {fresh.views[0]}, "
                        f"B {fresh.views[1]}", kind="moved"), floor=view.epoch_id)
                    info = fresh if agreed is None else self._agreed(agreed)
                    continue
            pages = xor_pages(a.pages, b.pages)[: len(wanted)]
            return Answer(view.epoch_id, view.identity, pages)


def _shape_or_none(info: ServerInfo, table: str | None) -> tuple[int, int] | None:
    return info.shape(table) if table is None or table in info.tables else None
