"""The two-server client (PROTOCOL.md): private page retrieval, and the admin client.

- `core`: the protocol logic, free of I/O: what to ask, what to believe, when to retry;
- `wire`: the client's vocabulary, free of I/O: errors, server answers, request encoding;
- `drivers`: the core driven over HTTP (sync and async) and over Serve handles;
- `admin`: page updates, snapshot rotation and status, one publication sent to both parties.

May use: `morphogen.protocol` and `morphogen.constants`; never the servers' code
(`morphogen.party`, `morphogen.publication`), which the import contract in pyproject.toml
keeps out. The names below are the client's public face: `from morphogen.client import
PirClient`.
"""

from morphogen.client.core import RetryPolicy
from morphogen.client.drivers import AsyncPirClient, HandlePirClient, PirClient, check_server_url
from morphogen.client.wire import (
    RETRY_STATUSES,
    Answer,
    DataMoved,
    EpochMismatchError,
    PageOutOfRange,
    PirError,
    PirUnavailable,
    ServerInfo,
    TableInfo,
    UnknownTable,
    decode_answer,
    encode_request,
    encode_updates,
    make_keys,
    plan_targets,
    xor_pages,
)

__all__ = [
    "RETRY_STATUSES", "Answer", "AsyncPirClient", "DataMoved", "EpochMismatchError",
    "HandlePirClient", "PageOutOfRange", "PirClient", "PirError", "PirUnavailable",
    "RetryPolicy", "ServerInfo", "TableInfo", "UnknownTable",
    "check_server_url", "decode_answer", "encode_request", "encode_updates", "make_keys",
    "plan_targets", "xor_pages",
]
