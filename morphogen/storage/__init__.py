"""Where a party's files live: local paths or object stores (S3, GCS, HTTPS), one seam for both.

- `location`: a path or URI opened as one `Location` (read, list, write, conditional create);
- `log_objects`: write-once objects in sequence, the lock of an object-store epoch log;
- `durable`: files that are there whole or not at all after a crash;
- `store_errors`: an object store's failure as one line naming the URI;
- `failures`: what kind of failure it was (missing, refused, hung, unreachable), its hint, and
  waiting out an unreachable store at start;
- `settings`: this process's timeouts, retries and concurrency for every store it opens;
- `advice`: advice to the kernel on pages of a mapped file (read them ahead, map them
  writable), a run of pages a call.

May use: `morphogen.constants`, the object-store and file-system libraries and numba; nothing else
of morphogen (snapshots, the epoch log and keyword tables are built on it).
"""

from morphogen.storage.location import (
    Location,
    StorageError,
    is_remote,
    open_location,
)

__all__ = ["Location", "StorageError", "is_remote", "open_location"]
