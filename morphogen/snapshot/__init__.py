"""The page matrix's snapshot files.

A snapshot is one epoch of the matrix on disk: a raw page file (``pages.bin``, the reference's
format: the pages back to back, 4096 bytes each, nothing else) and a JSON manifest
(``manifest.json``) naming the epoch, the page count, the DPF domain and a checksum of the data.
Shards open it memory-mapped and read only their own page range, so the matrix never travels
through a constructor or an object store, and a shard of a 64 GiB matrix touches only its slice.

A bare raw page file is accepted too (epoch 0, manifest derived from its size). Its last page
may be ragged; it is zero-padded virtually: the mapping covers the whole pages and only the tail
page is read into a padded copy, so opening never copies the file.

The checksum (``blake2b-256``) covers the page data as served, i.e. zero-padded to
``num_pages * page_size`` bytes; it is computed while writing and checked only on request
(``verify=True``), since reading a multi-GiB file at every shard start would defeat the mapping.

The modules, each imported directly (this package re-exports nothing):

- `layout`: the DPF domain a page count needs, and its split into shard ranges;
- `manifest`: what ``manifest.json`` holds (`Manifest`) and `SnapshotError`;
- `reader`: an opened snapshot (`Snapshot`), memory-mapped;
- `writer`: `write_snapshot` (any page source) and `import_raw` (a raw page file);
- `synthetic`: deterministic pseudo-random pages and snapshots of them;
- `sample`: the sampled-page digest checked at every open;
- `chunks`: the chunk size that writes and checksums stream in;
- `progress`: the bytes-done meter of long writes and checks.
"""
