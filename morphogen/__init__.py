"""Morphogen: two-server page PIR, wire-compatible with the morphogenesis protocol.

The library, importable without Ray: a package per capability (`protocol`, `storage`,
`snapshot`, `engine`, `publication`, `party`, `client`, `keyword`) beside the protocol's
numbers (`constants`) and a party's configuration (`config`). The layers they import along
are in pyproject.toml (`lint-imports`) and the README's Architecture section. Nothing here
imports `deployments` or `cluster`.
"""
