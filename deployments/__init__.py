"""Ray Serve deployments of one party: shards, the router, and the app builder.

Thin adapters: the logic they serve is `morphogen.party`'s. May use: `morphogen` (and Ray);
never `cluster`.
"""
