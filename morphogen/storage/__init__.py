"""Where a party's files live: local paths or object stores (S3, GCS, HTTPS), one seam for both."""

from morphogen.storage.location import (
    Location,
    StorageError,
    is_remote,
    open_location,
)

__all__ = ["Location", "StorageError", "is_remote", "open_location"]
