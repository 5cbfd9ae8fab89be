"""Which signed version (and block) the wallet's reads are held to, and whether the parties
still serve it: `Served`, and `ServedVersions`, the part of `PrivateState` that tracks them.

Every read answers with the version it was proven against; the newest one accepted bounds the
next reads from below (`seen_version`), and is what a call starts at (`latest`). Whether a
version is still the one served (`still_served`) is both parties' GET /epoch naming the very
(epoch id, identity) the version's reads were proven under: an identity names the data (a
snapshot's root and every update batch since), so equal identities are equal data. It asks
nothing about any key. A read that names other data shows the parties have left that data for
good (epoch ids only grow): the version is then known not served (`left`), with no read, and
the first round after it reads the working set (morphogen/wallet/evm.py). A version newer than
any before, found by a read of the head, is announced to hooks (`on_new_version`): the calls'
working set is read there before the wallet asks.

Kept apart from the reads (state.py): the calls, their rounds and the endpoint's methods hold
their answers to a `Served` and ask whether it is still served, without reading state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from morphogen.keyword import KeywordIntegrityError
from morphogen.keyword.descriptor import Descriptor
from morphogen.wallet.commit import GroupCommit

VIEWS_KEPT = 8  # the (epoch id, identity) of the last versions read, for `still_served`
# /epoch reads made while calls run: a thread each waits on one shared read (GroupCommit)
_CONFIRM_POOL = ThreadPoolExecutor(32, thread_name_prefix="morphogen-confirm")
# the hooks at a new version (the working set's round), one version after another
_HOOK_POOL = ThreadPoolExecutor(1, thread_name_prefix="morphogen-new-version")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """The block a read reflects, as the owner signed it, and the owner's version."""

    chain_id: int
    number: int
    hash: str  # 0x-hex, as the node names it
    version: int
    time: int  # when the owner made the version, Unix seconds


def served_of(desc: Descriptor) -> Served:
    if desc.anchor is None:
        raise KeywordIntegrityError(
            f"keyword table {desc.name!r} names no block: it is not a chain's table "
            "(build it with morphogen chain build)")
    a = desc.anchor
    return Served(a.chain_id, a.number, a.hash, desc.version, desc.time)


class ServedVersions:
    """The versions accepted so far, the parties' data each was proven under, and the hooks
    told of new ones. `refresh` (the descriptors read again) is the reader's: the watcher
    calls it."""

    def __init__(self, pir: Any, *, max_age: float | None = None, min_block: int = 0,
                 chain_id: int | None = None) -> None:
        self.pir, self.max_age = pir, max_age
        if chain_id is not None and (isinstance(chain_id, bool) or not isinstance(chain_id, int)
                                     or chain_id < 1):
            raise ValueError("chain_id is a chain's id (an int, 1 or more), or None")
        # the chain the caller named, or else the first one read: a version of another chain
        # (its tables signed with the same key) is never answered for this one
        self.chain_id, self._chain_read = chain_id, chain_id is not None
        # Versions only grow; blocks may not: the owner's version after a reorg to a shorter
        # branch names a lower block, and it is the one to serve. So the clients are bound
        # below by the newest version seen and by the caller's `min_block` only, never by
        # the highest block seen (which would refuse every read after a reorg of depth 2 or
        # more until the new branch passed the old height).
        self.min_block = min_block
        self.seen_version, self.seen_block = 0, min_block
        self.latest: Served | None = None  # the newest version any read accepted
        self._lock = threading.Lock()
        # (version, block hash) -> the parties' (epoch id, identity) its reads came from
        self._views: OrderedDict[tuple[int, str], tuple[int, str | None]] = OrderedDict()
        self._left: OrderedDict[tuple[int, str | None], None] = OrderedDict()  # views left
        self._new_version: list[Callable[[Served], None]] = []
        self._announced = 0  # the newest version the hooks were told of
        # both parties' /epoch, one read for the requests that came while the last was out
        self._epochs: GroupCommit[None, Any] = GroupCommit(
            lambda items: [self.pir.info(refresh=True)] * len(items))
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None

    def refresh(self) -> None:
        """Every table's descriptor read again: the reader's (state.py), called by the
        watcher."""
        raise NotImplementedError

    def _start_watching(self, watch_s: float | None) -> None:
        if watch_s is None:
            return
        if not watch_s > 0:
            raise ValueError("watch_s is a number of seconds above 0 (or None)")
        self._watch = threading.Thread(target=self._watching, args=(watch_s,),
                                       name="morphogen-rpc-watch", daemon=True)
        self._watch.start()

    def close(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.join(timeout=30)

    def _watching(self, every_s: float) -> None:
        last = None
        while not self._stop.wait(every_s):
            try:
                info = self.pir.info(refresh=True)
                now = (info.epoch_ids, info.identities)
                if now != last:
                    self.refresh()  # a version newer than any before: the hooks are told
                    last = now
            except Exception as exc:  # the parties away: the requests will say so
                log.debug("watching the parties' version: %s", type(exc).__name__)

    def on_new_version(self, hook: Callable[[Served], None]) -> None:
        """`hook(served)`, on a thread of its own, once for each version newer than any
        before that a read of the head finds: the watcher's (`watch_s`), or a request's (a
        wallet polling `eth_blockNumber` learns of a block from such a read, and asks for
        its balances right after)."""
        self._new_version.append(hook)

    def _head_read(self, served: Served) -> Served:
        """`served` from a read of the signed head: the hooks told where it is newer than
        any version they were told of."""
        with self._lock:
            newer = served.version > self._announced
            if newer:
                self._announced = served.version
        if newer and self._new_version:
            _HOOK_POOL.submit(self._announce, served)
        return served

    def _announce(self, served: Served) -> None:
        for hook in list(self._new_version):
            try:
                hook(served)
            except Exception as exc:  # noqa: BLE001 - a request reads what it needs itself
                log.debug("at a new version: %s", type(exc).__name__)

    def still_served(self, served: Served) -> bool:
        """Whether both parties serve now exactly the data `served`'s reads (by `read_round`)
        were proven against, within the freshness bound: two GET /epoch, no lookup. False
        where that is not known (the caller then reads a round)."""
        view = self._confirmable(served)
        if view is None:
            return False
        try:
            info = self._epochs.submit(None)  # a read that began after this call came
        except Exception as exc:  # noqa: BLE001 - the round says what is wrong
            log.debug("reading the parties' epochs: %s", type(exc).__name__)
            return False
        if all(e == view[0] and i == view[1]
               for e, i in zip(info.epoch_ids, info.identities, strict=True)):
            return True
        # A party names other data: it published past this view (a party's epoch id only
        # grows, so it never serves the view again), and the other follows it.
        with self._lock:
            self._left[view] = None
            while len(self._left) > VIEWS_KEPT:
                self._left.popitem(last=False)
        return False

    def _confirmable(self, served: Served) -> tuple[int, str] | None:
        """The view `served`'s reads were proven under, where /epoch may confirm it: one with
        an identity (never epoch ids alone), not known left, within the freshness bound."""
        with self._lock:
            view = self._views.get((served.version, served.hash))
            if view is None or view[1] is None or view in self._left:
                return None
        if self.max_age is not None and time.time() - served.time > self.max_age:
            return None
        return view[0], view[1]

    def confirming(self, served: Served) -> Future[bool] | None:
        """`still_served(served)` read on another thread, for a caller that runs meanwhile;
        None where /epoch cannot confirm it (no read made)."""
        if self._confirmable(served) is None:
            return None
        return _CONFIRM_POOL.submit(self.still_served, served)

    def left(self, served: Served) -> bool:
        """Whether a read of /epoch showed the parties had left the data `served`'s reads came
        from: a round at it then lands at a newer version, whose reads start empty."""
        with self._lock:
            view = self._views.get((served.version, served.hash))
            return view is not None and view in self._left

    def _accepted(self, desc: Descriptor, view: tuple[int, str | None] | None = None
                  ) -> Served:
        """`desc`'s version accepted; `view`: the parties' data it was proven under."""
        served = served_of(desc)
        with self._lock:
            if self.chain_id is None:
                self.chain_id = served.chain_id
            elif served.chain_id != self.chain_id:
                how = "was given" if self._chain_read else "has read"
                raise KeywordIntegrityError(
                    f"the servers serve chain {served.chain_id} (keyword table {desc.name!r}, "
                    f"version {served.version}); this client {how} chain {self.chain_id}: "
                    "tables of another chain signed with the same key, refused")
            self.seen_version = max(self.seen_version, served.version)
            self.seen_block = max(self.seen_block, served.number)
            if self.latest is None or served.version >= self.latest.version:
                self.latest = served
            if view is not None:
                key = (served.version, served.hash)
                self._views[key] = view
                self._views.move_to_end(key)
                while len(self._views) > VIEWS_KEPT:
                    self._views.popitem(last=False)
        return served

