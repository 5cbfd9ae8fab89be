"""Private keyword lookup: records laid out as a signed cuckoo table over pages.

The servers serve the table's pages like any other snapshot; a client holding the data
owner's public key looks a key up with one query of three keys and checks every page it gets
back (docs/keyword.md).

May use: `morphogen.snapshot` (a table is written as a snapshot), `morphogen.storage` and
`morphogen.constants`. The keyword client takes any page client (`morphogen.client`'s, or a
test's) and imports none.
"""

from morphogen.keyword.build import KeywordTable, TableFullError, build_table
from morphogen.keyword.client import AsyncKeywordClient, KeywordClient
from morphogen.keyword.descriptor import Descriptor, KeywordIntegrityError, StaleTableError
from morphogen.keyword.hashing import candidates
from morphogen.keyword.layout import Geometry
from morphogen.keyword.lookup import TableChangingError, request_sizes
from morphogen.keyword.records import Record, RecordError, read_records

__all__ = [
    "AsyncKeywordClient",
    "Descriptor",
    "Geometry",
    "KeywordClient",
    "KeywordIntegrityError",
    "KeywordTable",
    "Record",
    "RecordError",
    "StaleTableError",
    "TableChangingError",
    "TableFullError",
    "build_table",
    "candidates",
    "read_records",
    "request_sizes",
]
