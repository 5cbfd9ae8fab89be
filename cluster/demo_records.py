"""The keyword part of `morphogen demo`: synthetic accounts in, verified accounts out.

The owner builds a signed table of accounts, both parties serve it (one shard each here),
a client looks addresses up privately (present and absent) and checks every value; then the
owner inserts, changes and deletes accounts, publishes the changed pages to both parties as
one batch each, and the client reads the new values back.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

from cluster.report import eprint


def run_records_demo(args: Any, cluster: Any, workdir: str) -> bool:
    from ray import serve

    from cluster import local
    from cluster.parties import HttpParties
    from deployments.app import build_app
    from morphogen.client import PirClient
    from morphogen.client.admin import AdminClient
    from morphogen.config import PartyConfig
    from morphogen.keyword import KeywordClient, build_table
    from morphogen.keyword.accounts import ACCOUNT_VALUE_SIZE, Account, synthetic_accounts
    from morphogen.keyword.owner import Change, OwnerTable, create_owner_dir
    from morphogen.keyword.publishing import publish
    from morphogen.keyword.signing import generate_key_files, load_signing_key

    root = Path(workdir) / "records"
    root.mkdir()
    key_path, pub_path = generate_key_files(root / "owner.key")
    signing_key = load_signing_key(key_path)
    accounts = dict(synthetic_accounts(args.records, seed=args.seed))
    t = time.monotonic()
    table = build_table(accounts.items(), value_size=ACCOUNT_VALUE_SIZE, signing_key=signing_key)
    snapshot = create_owner_dir(table, root / "owner")
    pages = table.descriptor.geometry.num_pages
    eprint(f"[demo] keyword table: {len(accounts)} accounts in {pages} pages "
           f"({table.stats.load:.0%} full), built in {time.monotonic() - t:.1f}s")
    token = os.urandom(16).hex()
    (root / "token").write_text(token)
    parties = {}
    for name in ("ka", "kb"):
        cfg = PartyConfig(snapshot=str(snapshot), cache_dir=workdir, num_shards=1,
                          engine=args.engine, shard_num_cpus=0.25, router_num_cpus=0.1,
                          graceful_shutdown_timeout_s=1.0, admin_token_file=str(root / "token"),
                          epoch_log_dir=str(root / f"log-{name}"))
        serve.run(build_app(cfg), name=name, route_prefix=f"/{name}", blocking=False)
        parties[name] = cluster.app_url(f"/{name}")
    local.wait_routed(list(parties.values()))
    eprint(f"[demo] keyword parties at {parties['ka']} and {parties['kb']}")

    rng = random.Random(args.seed + 2)
    wrong = checked = 0
    with PirClient(parties["ka"], parties["kb"], encoding="msgpack") as pir:
        kc = KeywordClient(pir, pub_path)

        def check(expected: dict[bytes, bytes | None]) -> float:
            nonlocal wrong, checked
            keys = list(expected)
            t0 = time.monotonic()
            got = kc.get_many(keys)
            dt = time.monotonic() - t0
            for k, v in zip(keys, got, strict=True):
                checked += 1
                wrong += v != expected[k]
            return dt

        present = rng.sample(sorted(accounts), 8)
        absent = [rng.randbytes(20) for _ in range(4)]
        dt = check({**{k: accounts[k] for k in present}, **dict.fromkeys(absent)})
        sample = Account.decode(kc.get(present[0]))
        eprint(f"[demo] 12 lookups (8 present, 4 absent) in one batch: {dt * 1000:.0f} ms; "
               f"0x{present[0].hex()[:12]}..: balance {sample.balance}, nonce {sample.nonce}")

        new = {rng.randbytes(20): Account(10**18, 0, 0).encode() for _ in range(20)}
        changed = {k: Account(1, 1, 0).encode() for k in present[:3]}
        deleted = present[3:5]
        owner = OwnerTable(root / "owner")
        version, batch = owner.apply(
            [Change("put", k, v) for k, v in {**new, **changed}.items()]
            + [Change("delete", k) for k in deleted], signing_key)
        admins = [AdminClient(u, token) for u in parties.values()]
        try:
            publish(owner, HttpParties(admins, retry_for_s=120.0, max_updates=None))
        finally:
            for a in admins:
                a.close()
        eprint(f"[demo] owner: 20 inserts, 3 changes, 2 deletes -> version {version}, "
               f"{len(batch)} pages (records, tree paths, signed descriptor) published to both "
               "parties")
        accounts.update(new)
        accounts.update(changed)
        for k in deleted:
            accounts.pop(k)
        check({**{k: accounts.get(k) for k in [*new, *changed, *deleted, *present[5:]]},
               **dict.fromkeys(absent)})
    for name in parties:
        serve.delete(name)
    print(f"{checked} keyword lookups proven against the owner's signed root, "
          f"{checked - wrong} right, {wrong} wrong")
    return wrong == 0 and checked > 0
