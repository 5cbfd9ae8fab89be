"""Operating morphogen: configuration, snapshots, the local cluster and the command line."""
