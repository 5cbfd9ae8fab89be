"""Operating morphogen: configuration, snapshots, the local cluster and the command line.

May use: `deployments` and `morphogen`; nothing imports this package but the `morphogen`
console script, the benchmarks and the tests.
"""
