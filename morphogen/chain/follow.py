"""Following a chain: every block's state into the owner's tables and both parties, in order.

The owner directory (`morphogen chain build`) holds the accounts, storage and code tables of
one chain in one matrix; each version reflects one block and every table names it (chain id,
number, hash). For each new block the follower

1. reads the block's header and checks that its parent is the last block applied (else: a
   reorg, below);
2. collects what the block changed (`morphogen.chain.traces.Tracer`: the cheapest source of
   traces the node answers) and reads those values at the block from the node, checked
   against the block's trace;
3. applies them as ONE owner version (`OwnerTable.apply`, named by the block's hash so that a
   re-run never applies a block twice), with the record of the last K blocks in the same
   atomic write;
4. publishes every unpublished version to both parties in order, each as one publication
   that names its parent identity, so the parties apply one sequence. Party B takes block N
   while party A takes block N + 1, which the follower applied meanwhile
   (`morphogen.keyword.overlapped`).

A crash at any point leaves the owner at the block before or the block after, and the next
start first publishes what the parties lack, then goes on from the block after the owner's.

**Reorgs.** The follower keeps the keys the last K blocks changed. A block whose parent is not
the last applied block, or a node whose chain no longer holds the last applied block at its
height (or does not reach that height: a shorter, heavier branch; a dev node's `evm_revert`),
means the chain moved to another branch: the follower finds the newest kept block still on the
node's chain (the common ancestor) and publishes one version reflecting the new branch's first
block, or the ancestor itself where the branch stops there, with every key the orphaned blocks
changed read again at that block. Either is found at the next step, whatever the new branch's
length. From then on no answer reflects an orphaned block. A branch that forks
below the kept blocks is an error: the tables cannot be reverted without knowing what
changed, so the follower stops and says how to rebuild.

One follower per owner directory: it holds the directory's writer lock for as long as it runs,
and `morphogen records apply/publish` take the same lock.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from morphogen.chain.blocks import ChainMoved, Header, State, Touched, read_state
from morphogen.chain.progress import BlockPhases, Progress
from morphogen.chain.rpc import ChainError, EthRpc
from morphogen.chain.state import code_records, encode_account
from morphogen.chain.tables import TABLES
from morphogen.chain.traces import Tracer
from morphogen.keyword import hashing, prefetch
from morphogen.keyword.descriptor import Anchor
from morphogen.keyword.overlapped import Legs, OverlappedPublisher
from morphogen.keyword.owner import Change, OwnerTable
from morphogen.keyword.pages import tag_of
from morphogen.keyword.publishing import Published, publish
from morphogen.protocol import sparse
from morphogen.storage.durable import write_atomic

log = logging.getLogger(__name__)

KEEP_BLOCKS = 64
KEYS_DIR = "chain-keys"  # the keys each kept block changed, a file a block
GROW_AT = 0.8  # a table is grown before a block would fill it past this


class FollowError(ChainError):
    """The follower cannot go on (the message says why and what to do)."""


CRASH_ENV = "MORPHOGEN_FOLLOW_CRASH"
_reached: dict[str, int] = {}


def crash_point(step: str) -> None:
    """The crash tests' failpoint: with MORPHOGEN_FOLLOW_CRASH=STEP[:N] the process kills
    itself (SIGKILL: no cleanup, no flush) the N-th time (default 1st) it reaches STEP."""
    wanted = os.environ.get(CRASH_ENV)
    if not wanted:
        return
    name, _, nth = wanted.partition(":")
    if name != step:
        return
    _reached[step] = _reached.get(step, 0) + 1
    if _reached[step] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def _keys_file(number: int, digest: str) -> str:
    return f"{number:012d}-{digest[2:18]}.json"


class Follower:
    """Follows `rpc`'s chain into the owner directory `owner` and publishes to `parties`."""

    def __init__(self, rpc: EthRpc, owner: OwnerTable, parties: Legs, signing_key: Any, *,
                 confirmations: int = 0, keep: int = KEEP_BLOCKS,
                 snapshot_dir: str | None = None,
                 report: Callable[[str], None] | None = None) -> None:
        if confirmations < 0 or keep < 1:
            raise ValueError("confirmations is 0 or more, keep 1 or more")
        self.rpc, self.owner, self.parties = rpc, owner, parties
        owner.checkpoints_in_background()  # a full copy never holds up a block
        # the process holds the pages and keys a block touches, not the table's
        owner.map_working_pages()
        sparse.warm()  # a block's batch is stored and sent as its changed bytes
        hashing.warm()  # and its keys' buckets found in one call
        prefetch.warm()  # and the pages it will write, while the node reads its values
        self.tracer = Tracer(rpc)  # the node's cheapest source, probed at the first block
        self.key = signing_key
        self.confirmations, self.keep = confirmations, keep
        self.snapshot_dir = snapshot_dir
        self.report = report or (lambda line: None)
        self.progress = Progress()
        # Block N goes to party A from a thread of its own while block N + 1 is read and
        # applied, then to party B from B's lane while A takes block N + 1 (versions reach
        # each party in order, A first). The publishing threads read the owner through an
        # instance of their own: its own state and lock handle.
        self._publishing = OwnerTable(owner.root)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="chain-publish")
        self._inflight: Future[None] | None = None  # the A legs of the last block applied
        self._overlap = OverlappedPublisher(self._publishing, parties,
                                            snapshot_dir=snapshot_dir, done=self._published)
        # version -> what its line reports once both parties have it
        self._blocks: dict[int, tuple[Header, int, int, BlockPhases, float]] = {}
        anchor = owner.descriptor(TABLES[0]).anchor
        if anchor is None:
            raise FollowError(f"{owner.root} names no chain block: build it with `morphogen "
                              "chain build` from a state export")
        self.chain_id = anchor.chain_id
        got = rpc.chain_id()
        if got != self.chain_id:
            raise FollowError(f"the node at {rpc.shown} is on chain {got}; {owner.root} holds "
                              f"chain {self.chain_id}")

    # -- the record of applied blocks -----------------------------------------------------------

    def _journal(self) -> list[dict]:
        """The last applied blocks, oldest first: number, hash, touched keys."""
        self.owner.reload()
        kept = list((self.owner.state.get("chain") or {}).get("blocks") or [])
        anchor = self.owner.descriptor(TABLES[0]).anchor
        assert anchor is not None
        if not kept or kept[-1]["hash"] != anchor.hash:
            # the starting block (or a rebuild): nothing known of what it changed
            kept = [{"number": anchor.number, "hash": anchor.hash, "touched": None}]
        return kept

    def tip(self) -> tuple[int, str]:
        last = self._journal()[-1]
        return int(last["number"]), str(last["hash"])

    # -- one step -------------------------------------------------------------------------------

    def publish_pending(self) -> int:
        """Wait for the publication in flight, then publish what the parties still lack."""
        self.wait_published()
        try:
            done = publish(self._publishing, self.parties, snapshot_dir=self.snapshot_dir)
        finally:
            # the heads the overlapped legs left are stale now: the next block's leg to A
            # named a parent A no longer serves (409), and the follower stopped
            self._overlap.forget()
        self._blocks.clear()  # what a failure left is on both now, without its line
        self.progress.served = self.tip()[0]
        return len(done)

    def wait_published(self) -> None:
        """Wait for the publications in flight (both parties); raises what they raised."""
        self._wait_pushed()
        self._overlap.wait()

    def _wait_pushed(self) -> None:
        """Wait for party A's legs in flight (B's lane goes on)."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.result()

    def _drain(self) -> None:
        """Let the publication in flight end, whatever its outcome (the next step re-sends
        what it did not: a party that has a version answers it as done)."""
        try:
            self.wait_published()
        except Exception:  # noqa: BLE001 - reported by the step that failed, or re-sent
            pass

    def close(self) -> None:
        self._drain()
        self._pool.shutdown(wait=True)
        self._overlap.close()

    def step(self, last: int | None = None) -> bool:
        """Publish what the parties lack, then apply the next block when there is one (up to
        block `last`), its publication started; True when a block was applied. A step with
        no block to apply returns once everything applied is on both parties."""
        if self._inflight is None:
            self.publish_pending()  # a start, or the step after a failed publication
        number, digest = self.tip()
        self.progress.head = self.rpc.block_number()
        target = self.progress.head - self.confirmations
        if last is not None:
            target = min(target, last)
        started = time.monotonic()
        if target <= number:
            # Nothing to apply: the last applied block must still be the node's. A branch
            # no longer than ours (a shorter, heavier one; a dev node's evm_revert) shows
            # only here: it is followed now, not once it has grown past our height.
            if self._hash_at(number) != digest:
                self._reorg(started, target)
                return True
            self.wait_published()
            return False
        nxt = self._header(number + 1)
        if nxt.parent_hash != digest:
            self._reorg(started, target)
        else:
            self._apply(nxt, self.tracer.touched(nxt), [], started)
        return True

    def _header(self, number: int) -> Header:
        """The node's block `number`, which its head reached a moment ago. Where the node no
        longer has it and its head is now below it, the chain moved meanwhile (`anvil_reorg`
        drops the blocks it replaces before it mines the new ones): the step is tried again
        (ChainMoved). Where its head still passes it, the block is asked once more (the new
        one may have come meanwhile; the caller checks how it links): a node that still
        lacks it is broken, an error that stops the follower."""
        for _ in range(2):
            found = self.rpc.call("eth_getBlockByNumber", hex(number), False)
            if isinstance(found, dict):
                return Header.of(found)
            if self.rpc.block_number() < number:
                raise ChainMoved(f"the node's chain no longer reaches block {number}: it "
                                 "moved while this step read it")
        raise ChainError(f"{self.rpc.shown} has no block {number} (yet)")

    def _hash_at(self, number: int) -> str | None:
        """The hash of the node's block `number`, None where its chain does not reach it (a
        node that cannot be reached raises: that is no reorg)."""
        found = self.rpc.call("eth_getBlockByNumber", hex(number), False)
        return str(found["hash"]).lower() if isinstance(found, dict) else None

    def run(self, *, until: Callable[[], bool] = lambda: False, last: int | None = None,
            poll_s: float = 0.5, retry_s: float = 2.0) -> None:
        """Follow until `until()` is true or block `last` is on both parties (each checked
        after a step, so what a crash left unpublished is published first). A node or a
        party that cannot be reached is waited for; what waiting cannot mend (a
        disagreement with the trace, a reorg too deep, a full table, another publisher on
        the parties) stops it."""
        while True:
            try:
                moved = self.step(last)
            except Exception as exc:
                self._drain()  # never two publications at once
                if not _passing(exc):
                    raise
                log.warning("following paused: %s; retrying in %.1f s", exc, retry_s)
                self.report(f"waiting: {exc}")
                time.sleep(retry_s)
                continue
            if until() or (last is not None and self.progress.served >= last):
                self.wait_published()
                return
            if not moved:
                time.sleep(poll_s)

    # -- applying -------------------------------------------------------------------------------

    def _apply(self, head: Header, touched: Touched, dropped: list[dict],
               started: float, *, revert: bool = False) -> None:
        """`head`'s state as the next version. `revert`: `head` is the newest kept block
        (the common ancestor of a reorg to a branch no longer than it), already in the
        record: the version reflects it again, `touched` (the orphaned blocks' keys) read
        at it."""
        clock = BlockPhases(started)
        crash_point("traced")
        # the pages the block will write, faulted in while the node reads its values
        self.owner.prefetch({"accounts": touched.accounts,
                             "storage": [address + slot for address, slot in touched.slots]})
        state = read_state(self.rpc, head, touched)
        changes, inserts = self._changes(state)
        clock.lap("read")
        crash_point("read")
        self._make_room(inserts)
        # the keys go to a file of their own first (a crash before the pointer moves leaves
        # a file nothing names); the owner's state names the kept blocks only
        name = _keys_file(head.number, head.hash)
        if not revert:
            write_atomic(self._keys_dir() / name, json.dumps(touched.to_json()).encode())
        kept = [b for b in self._journal() if b not in dropped]
        if revert:
            # the ancestor keeps its own keys; the orphaned blocks' go with their files.
            # Named by the orphaned tip too: the ancestor's own id was used when it was
            # applied, and the version must not be skipped as a re-run of that.
            assert kept and kept[-1]["hash"] == head.hash
            changes_id = f"revert:{head.number}:{head.hash}:{dropped[-1]['hash']}"
        else:
            kept.append({"number": head.number, "hash": head.hash, "touched": name})
            changes_id = f"block:{head.number}:{head.hash}"
        kept = kept[-self.keep:]
        version, batch = self.owner.apply(
            changes, self.key, changes_id=changes_id,
            anchor=Anchor(self.chain_id, head.number, head.hash),
            note={"chain": {"chain_id": self.chain_id, "blocks": kept}})
        clock.lap("apply")
        self._prune_keys(kept)
        crash_point("applied")
        self._wait_pushed()  # party A's leg of the block before: one in flight at most
        self._blocks[version] = (head, len(changes), len(batch), clock, started)
        self._inflight = self._pool.submit(self._push, clock)

    def _push(self, clock: BlockPhases) -> None:
        """The publishing thread: every version party A lacks, each then queued for B."""
        clock.lap("wait")  # behind party A's leg of the block before
        self._overlap.push()

    def _published(self, published: Published) -> None:
        """From B's lane, as each version reaches both parties: the block's line and
        figures (a version that is no block's, a grown table's, has none)."""
        entry = self._blocks.pop(published.version, None)
        if entry is None:
            return
        head, records, pages, clock, started = entry
        version = published.version
        clock.lap("publish")  # both parties, B's lane included
        crash_point("published")
        p = self.progress
        p.blocks += 1
        p.records += records
        p.served = head.number
        p.last_seconds = time.monotonic() - started
        p.phases = clock.laps
        self.report(f"block {head.number} ({head.hash[:12]}..): {records} records, "
                    f"{pages} pages, version {version} on both parties in "
                    f"{p.last_seconds:.2f} s ({clock}); head {p.head}, lag {p.lag}, "
                    f"{p.rate():.2f} blocks/s")

    def _keys_dir(self) -> Path:
        path = self.owner.root / KEYS_DIR
        path.mkdir(exist_ok=True)
        return path

    def _touched_of(self, entry: dict) -> Touched | None:
        """The keys a kept block changed (None for the starting block: not known)."""
        name = entry.get("touched")
        if name is None:
            return None
        try:
            return Touched.from_json(json.loads((self._keys_dir() / name).read_text()))
        except FileNotFoundError:
            return None

    def _prune_keys(self, kept: list[dict]) -> None:
        names = {b.get("touched") for b in kept}
        for path in self._keys_dir().iterdir():
            if path.name not in names:
                path.unlink(missing_ok=True)

    def _make_room(self, inserts: dict[str, int]) -> None:
        """Grow each table the block's new records would fill past `GROW_AT`, to twice what
        it then holds, as a version of its own before the block's (a rotation: the matrix
        changes size)."""
        descriptors = {p.name: p.descriptor for p in self.owner.parts()}
        for name, new in inserts.items():
            d = descriptors[name]
            need = d.records + new
            if need > GROW_AT * d.geometry.capacity:
                version = self.owner.grow(name, self.key, records=2 * need)
                grown = self.owner.descriptor(name).geometry
                self.report(f"table {name} grown to {grown.capacity} slots ({need} records "
                            f"after this block) as version {version}")

    def _changes(self, state: State) -> tuple[list[Change], dict[str, int]]:
        """The block's changes to the tables, and how many records each inserts."""
        held = self.owner.holds()
        added: set[bytes] = set()
        datasets = {p.name: p.descriptor.dataset for p in self.owner.parts()}
        inserts = dict.fromkeys(TABLES, 0)

        def put(table: str, key: bytes, value: bytes) -> None:
            tag = tag_of(datasets[table], key)
            if tag not in held and tag not in added:
                inserts[table] += 1
                added.add(tag)
            out.append(Change("put", key, value, table=table))

        out: list[Change] = []
        for address in sorted(state.accounts):
            account, code = state.accounts[address]
            if state.exists(address):
                put("accounts", address, encode_account(account))
            else:
                out.append(Change("delete_absent", address, table="accounts"))
            if code:
                records = code_records(code)
                # code is keyed by its hash: code the table holds is never written again
                first = tag_of(datasets["code"], records[0][0])
                if first not in held and first not in added:
                    for k, v in records:
                        put("code", k, v)
        for (address, slot), word in sorted(state.slots.items()):
            if word:
                put("storage", address + slot, word.to_bytes(32, "big"))
            else:
                out.append(Change("delete_absent", address + slot, table="storage"))
        return out, inserts

    # -- reorgs ---------------------------------------------------------------------------------

    def _reorg(self, started: float, target: int) -> None:
        """The node's chain no longer holds the last applied block: revert to the newest kept
        block it still holds (the common ancestor), as part of one version. That version
        reflects the new branch's next block where the branch reaches it (up to `target`,
        the confirmed height), else the ancestor itself: a branch no longer than the
        ancestor (a reorg to a shorter chain, an `evm_revert`) is served at once, not when
        it has grown past the orphaned blocks."""
        journal = self._journal()
        ancestor = None
        for i in range(len(journal) - 1, -1, -1):
            entry = journal[i]
            if self._hash_at(int(entry["number"])) == entry["hash"]:
                ancestor = i
                break
        orphaned = journal[ancestor + 1:] if ancestor is not None else journal
        if ancestor is not None and not orphaned:
            # the node holds the last applied block again (a backend behind a balancer, a
            # height that dipped): no reorg, the next step reads on
            raise ChainMoved("the node's chain holds the last applied block again")
        kept_keys = [self._touched_of(b) for b in orphaned]
        if ancestor is None or any(keys is None for keys in kept_keys):
            deepest = int(journal[0]["number"])
            raise FollowError(
                f"the chain reorganised below block {deepest}, the oldest of the {self.keep} "
                "blocks kept: the tables cannot be reverted that far. Export the state again, "
                "build it into a new owner directory (morphogen chain export, then chain build "
                "or chain import) and rotate both parties to it; a new build starts again at "
                "version 1 with new dataset ids, so clients that read the old tables must be "
                "restarted. Or keep more blocks (--keep)")
        base = journal[ancestor]
        number = int(base["number"])
        if number + 1 <= target:
            first = self._header(number + 1)
            if first.parent_hash != base["hash"]:
                raise ChainMoved(f"block {first.number}'s parent is not block {number} "
                                 "on the node: the chain moved again mid-reorg")
            touched, revert = self.tracer.touched(first), False
        else:
            first = self._header(number)
            if first.hash != base["hash"]:
                raise ChainMoved(f"block {number} changed on the node mid-reorg")
            touched, revert = Touched(), True
        for keys in kept_keys:
            assert keys is not None  # checked above
            touched.merge(keys)
        self.progress.reorgs += 1
        log.warning("reorg: blocks %s orphaned; block %d is the common ancestor",
                    ", ".join(str(b["number"]) for b in orphaned), number)
        self.report(f"reorg: {len(orphaned)} block(s) after {number} orphaned; reverting "
                    f"{'to' if revert else 'with'} block {first.number} "
                    f"({first.hash[:12]}..)")
        self._apply(first, touched, orphaned, started, revert=revert)


def _passing(exc: BaseException) -> bool:
    """Whether `exc` is an outage worth waiting out: a node or party down or restarting."""
    import httpx

    from morphogen.chain.rpc import NodeUnreachable
    from morphogen.client.wire import PirUnavailable

    return isinstance(exc, (NodeUnreachable, ChainMoved, PirUnavailable, httpx.TransportError,
                            OSError))
