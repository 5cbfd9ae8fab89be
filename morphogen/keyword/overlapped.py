"""Publishing one version to party B while the next goes to party A.

`publish` sends each version to A, then to B, then the next version: a version's time is the
sum of both parties' times. A follower making a version a block needs better: here party B
takes version v in a lane of its own while party A takes v + 1. What keeps A and B on one
sequence is unchanged:

- every version reaches A before B (a second publisher refused by A never reaches B);
- each party takes the versions in order, each naming its parent (the identity the party's
  previous leg left), so a party that moved meanwhile refuses;
- a version is marked published only once B has it, in order, so a crash at any point leaves
  A at most two versions ahead of the owner's mark; the next start re-sends from the mark,
  and a party that holds a version answers it as done (`publish`'s re-run rule).

At most one B leg travels at once and A waits for it before queueing the next, so A is never
more than one version ahead of B.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from morphogen.keyword.owner import OwnerTable
from morphogen.keyword.publishing import (
    Form,
    Parties,
    Published,
    PublishError,
    mark_published,
    next_form,
)


class Legs(Parties, Protocol):
    """Parties that take a publication one party at a time (`cluster.parties.HttpParties`)."""

    def parents(self, publication: str) -> list[str | None]:
        """The parent each party must have for `publication` (read when not known)."""
        ...

    def leg(self, party: int, form: Form, parent: str | None) -> dict:
        """Send `form` to party `party` (0 is A) naming `parent`; its answer."""
        ...

    def settled(self, identities: Sequence[str | None] | None) -> None:
        """The identities both parties are on now (None: not known, read them next time)."""
        ...


class OverlappedPublisher:
    """Publishes `owner`'s versions to `parties`, B's leg of one overlapping A's of the next.
    `done(published)` is called from B's lane as each version reaches both, in order."""

    def __init__(self, owner: OwnerTable, parties: Legs, *, snapshot_dir: str | None = None,
                 done: Callable[[Published], None] = lambda p: None) -> None:
        self.owner, self.parties, self.snapshot_dir, self.done = owner, parties, snapshot_dir, done
        self._lane = ThreadPoolExecutor(1, thread_name_prefix="publish-b")
        self._b: Future[None] | None = None
        self._sent = 0  # the last version party A took from this publisher
        self._heads: list[str | None] | None = None  # what each party's last leg left

    def push(self) -> None:
        """Send A every version it has not taken yet, each one's B leg queued behind the one
        before. Raises what a leg raised (then everything not on both is sent again)."""
        try:
            while True:
                form = next_form(self.owner, self.parties, self.snapshot_dir, self._sent)
                if form is None:
                    return
                if self._heads is None:
                    self.wait()  # no B leg in flight: both heads can be read as they are
                    self._heads = list(self.parties.parents(form.publication))
                a = self.parties.leg(0, form, self._heads[0])
                self._heads[0] = a.get("identity")
                self._sent = form.version
                self.wait()  # the B leg before this one: B takes versions in order
                self._b = self._lane.submit(self._leg_b, form, a, self._heads[1])
        except BaseException:
            try:
                self.wait()  # a B leg in flight ends first: its outcome is marked or re-sent
            except BaseException:  # noqa: BLE001 - the first failure is the one raised
                pass
            self._reset()
            raise

    def _leg_b(self, form: Form, a: dict, parent: str | None) -> None:
        b = self.parties.leg(1, form, parent)
        if a.get("identity") != b.get("identity"):
            raise PublishError(
                f"the parties answered publication {form.publication} with different "
                f"identities: A {a.get('identity')}, B {b.get('identity')}. They held "
                "different data before it; rotate both to one snapshot (morphogen admin "
                "--server A --server B snapshot PATH)")
        heads = self._heads
        if heads is not None:
            heads[1] = b.get("identity")
        mark_published(self.owner, form.version)
        self.parties.settled([a.get("identity"), b.get("identity")])
        self.done(Published(form.version, form.mode, len(form.batch), [a, b]))

    def wait(self) -> None:
        """Wait for the B leg in flight; raises what it raised."""
        inflight, self._b = self._b, None
        if inflight is None:
            return
        try:
            inflight.result()
        except BaseException:
            self._reset()
            raise

    def forget(self) -> None:
        """The parties were published to another way (`publishing.publish`): what the last
        legs left is no longer their heads, so the next push reads them again."""
        self.wait()
        self._reset()

    def _reset(self) -> None:
        # after a failure nothing is assumed: the next push reads both heads and starts from
        # what the owner marked published (a party that has a version answers it as done)
        self._sent = 0
        self._heads = None
        self.parties.settled(None)

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._lane.shutdown(wait=True)
