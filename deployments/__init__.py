"""Ray Serve deployments of one party: shards, the router, and the app builder."""
