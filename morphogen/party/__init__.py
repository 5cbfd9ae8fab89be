"""One party's server (A or B) without Ray: what `deployments/` serves, each piece unit tested
with in-process shards.

The router's side:
- `router`: the `Party`: layout, validation of every key, coalesced fan-out, `/epoch`;
- `shards`: the party's shards as it calls them (`ShardLink`) and the layout they tile;
- `wire` and `admin_wire`: the server side of the HTTP contract and of the admin routes;
- `coalesce` and `combine`: concurrent requests merged into one scan, partials XORed under
  one epoch identity;
- `tables`: queries of a named table (a page range of the matrix): the shards they reach,
  what each scans of it, the scanners of a segment's part of it;
- `publisher` and `admin`: a publication decided in the epoch log, then prepared and
  committed on every replica of every shard;
- `autoscaling` and `observe`: the router's Serve autoscaling policy, what is reported to
  metrics; `redact`: error reports that never carry request data.

The shard's side:
- `shard` and `replica`: one shard's scanning state, one replica of it following the log;
- `epoch`, `version`, `pending`, `leases`: epochs, the data of one epoch, its pending updates
  (two arrays), the scans holding it.

May use: `morphogen.publication`, `morphogen.engine`, `morphogen.snapshot`,
`morphogen.protocol`, `morphogen.storage`, `morphogen.config` and `morphogen.constants`;
never the client, `deployments` or `cluster`. This package re-exports nothing.
"""
