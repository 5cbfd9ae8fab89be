"""Ethereum state as keyword records: a JSON-RPC client for a node, the record encodings of
accounts, storage and code, and the state export file a table is built from.

- `rpc`: `EthRpc`, JSON-RPC 2.0 over HTTP, every failure a one-line `ChainError`;
- `state`: the account, storage and code records (their byte layouts are documented there);
- `export`: the state export file (JSON lines), its reader and writer, and its records;
- `node_export`: an export taken from a node (geth's debug dumps or anvil's) and checked
  against the node's standard answers.

The layer above `keyword` and `client`: it turns a chain into what keyword tables hold (a
follower keeping them current and a wallet's endpoint reading them build on it). May use
`morphogen.keyword`, `morphogen.client`, `morphogen.storage` and `morphogen.constants`; never
Ray, so that a follower runs beside any node without the cluster's dependencies.
"""

from morphogen.chain.export import (
    AccountState,
    BlockRef,
    ExportError,
    ExportHeader,
    StateRecords,
    read_accounts,
    read_header,
    state_records,
    write_export,
)
from morphogen.chain.node_export import (
    ExportMismatch,
    export_from_node,
    verify_accounts,
    verify_export,
)
from morphogen.chain.rpc import (
    BadHex,
    ChainError,
    EthRpc,
    MethodMissing,
    NodeUnreachable,
    NotJsonRpc,
    RpcError,
    WrongChain,
    quantity,
    to_int,
)

__all__ = [
    "AccountState",
    "BadHex",
    "BlockRef",
    "ChainError",
    "EthRpc",
    "ExportError",
    "ExportHeader",
    "ExportMismatch",
    "MethodMissing",
    "NodeUnreachable",
    "NotJsonRpc",
    "RpcError",
    "StateRecords",
    "WrongChain",
    "export_from_node",
    "quantity",
    "read_accounts",
    "read_header",
    "state_records",
    "to_int",
    "verify_accounts",
    "verify_export",
    "write_export",
]
