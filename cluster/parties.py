"""Both parties' admin routes over HTTP, as the data owner (`morphogen records publish`) and
the chain follower (`morphogen chain follow`) publish to them: the command line's servers and
token, and each publication sent to A then B until both have it."""

from __future__ import annotations

import argparse
import os
import time

from cluster import inputs
from cluster.errors import UsageError


class HttpParties:
    """Both parties' admin routes, each publication sent to A then B until both have it."""

    def __init__(self, clients, retry_for_s: float, max_updates: int | None) -> None:
        self.clients, self.retry_for_s, self._max = clients, retry_for_s, max_updates
        # the identities the last publication left on both parties: the next one's parents,
        # without reading the heads again (a party that moved since refuses it)
        self._heads: list[str] | None = None
        self._digest: int | None = None

    def max_updates(self) -> int:
        """The most updates both parties take in one request: a larger version goes in
        parts."""
        if self._max is None:
            self._max = min(c.max_updates() for c in self.clients)
        return self._max

    def digest_version(self) -> int:
        """The batch digest version both parties take, asked once (the choice is recorded
        with each version before it is sent); 1, every party's, while one cannot be asked."""
        if self._digest is None:
            import httpx

            from morphogen.client.admin import common_digest_version
            from morphogen.client.drivers import PirError

            try:
                self._digest = common_digest_version(self.clients)
            except (PirError, httpx.HTTPError):
                return 1
        return self._digest

    def updates(self, publication, batch):
        return self._publish(publication, lambda c, p: c.updates(
            batch, publication, p, max_per_request=self.max_updates()))

    def snapshot(self, publication, path):
        return self._publish(publication, lambda c, p: c.snapshot(path, publication, p))

    # -- one party at a time (morphogen.keyword.overlapped) --------------------------------------

    def parents(self, publication):
        """The parent each party must have for `publication`: what the last publication
        left, else both heads read now (`parents_for`)."""
        from morphogen.client.admin import read_parents

        if self._heads is not None:
            return list(self._heads)
        return read_parents(self.clients, publication, self.retry_for_s)

    def leg(self, party, form, parent):
        """`form` (a publishing.Form) to one party, re-sent as `publish_to_parties` does."""
        from morphogen.chain.follow import crash_point
        from morphogen.client.admin import _with_retries

        client = self.clients[party]

        def send() -> dict:
            if form.rotation:
                return client.snapshot(form.path, form.publication, parent)
            return client.updates(form.batch, form.publication, parent,
                                  max_per_request=self.max_updates())

        out = _with_retries(client, send, self.retry_for_s, time.sleep)
        if party == 0:
            crash_point("sent-a")  # between the parties: A has it, B not yet
        return out

    def settled(self, identities):
        self._heads = list(identities) if identities is not None else None

    def _publish(self, publication, send):
        from morphogen.chain.follow import crash_point
        from morphogen.client.admin import publish_to_parties

        def one(client, parent):
            out = send(client, parent)
            if client is self.clients[0]:
                crash_point("sent-a")  # between the parties: A has it, B not yet
            return out

        try:
            out = publish_to_parties(self.clients, one, retry_for_s=self.retry_for_s,
                                     publication=publication, parents=self._heads)
        except BaseException:
            self._heads = None
            raise
        self._heads = [r.get("identity") for r in out]
        return out


def admin_parties(servers: list[str], args: argparse.Namespace) -> HttpParties:
    """Both parties' admin routes from the command's --server/--token-file/--token-env,
    --retry-for and --max-batch-pages."""
    from morphogen.client.admin import AdminClient

    servers = [inputs.server_url("--server", u) for u in servers]
    if len(servers) != 2:
        raise UsageError("publish to both parties: --server URL_A --server URL_B")
    token = (inputs.admin_token(args.token_file, args.token_env) if args.token_file
             else os.environ.get(args.token_env, "").strip())
    if not token:
        raise UsageError(f"no admin token (--token-file, or ${args.token_env})")
    return HttpParties([AdminClient(u, token) for u in servers], args.retry_for,
                       args.max_batch_pages)


def add_publish_options(p: argparse.ArgumentParser) -> None:
    """What `admin_parties` reads besides the servers: the token, the snapshot directory
    for rotations, the batch size and how long to re-send."""
    p.add_argument("--snapshot-dir", metavar="DIR|URI", default=None,
                   help="where both parties' rotations read snapshots (under their "
                        "admin_snapshot_dir): a version whose table grew, or one that "
                        "changed more than half the table's pages, is published as a "
                        "rotation to its snapshot written there")
    p.add_argument("--max-batch-pages", type=inputs.positive_int, default=None,
                   metavar="N", help="most pages in one request; a larger version goes in "
                                     "several requests of one publication (default: what "
                                     "the parties report)")
    p.add_argument("--token-file", metavar="FILE", default=None,
                   help="file holding the parties' admin token")
    p.add_argument("--token-env", metavar="VAR", default="MORPHOGEN_ADMIN_TOKEN",
                   help="variable holding the token when no file is given")
    p.add_argument("--retry-for", type=float, default=120.0, metavar="S",
                   help="keep re-sending to an unavailable party this long (default 120)")
