"""The page matrix's snapshot files.

A snapshot is one epoch of the matrix on disk: a raw page file (``pages.bin``, the reference's
format: the pages back to back, 4096 bytes each, nothing else) and a JSON manifest
(``manifest.json``) naming the epoch, the page count, the DPF domain, a BLAKE3 hash of every
chunk of the data (64 MiB of pages by default) and their root, the checksum. Each shard reads
only its own page range, into private memory, checking the chunks that overlap it as they
arrive, so the matrix never travels through a constructor or an object store, a shard of a
64 GiB matrix touches only its slice, and what it scans is what its identity names.

The hashes cover the page data as served, i.e. zero-padded to ``num_pages * page_size`` bytes;
they are computed while writing. The root, not the manifest as a file, is the snapshot's name
in an epoch identity: two files that differ in any byte are two names.

A bare raw page file is accepted too (epoch 0, manifest derived from its size, chunk hashes
computed from every byte at open), and so is a format 1 manifest (no chunk hashes: the same).
A raw file's last page may be ragged; it is zero-padded virtually.

The modules, each imported directly (this package re-exports nothing):

- `layout`: the DPF domain a page count needs, and its split into shard ranges;
- `manifest`: what ``manifest.json`` holds (`Manifest`) and `SnapshotError`;
- `tables`: named tables, page ranges of the matrix queried on their own (`Table`);
- `hashes`: chunk hashes and their root (BLAKE3);
- `verified`: page ranges read into private memory, checked chunk by chunk;
- `opened`: what every opened snapshot offers, local or remote (`OpenedSnapshot`);
- `reader`: an opened snapshot file (`Snapshot`);
- `writer`: `write_snapshot` (any page source) and `import_raw` (a raw page file);
- `synthetic`: deterministic pseudo-random pages and snapshots of them;
- `chunks`: the piece size that writes stream in (not the hashed chunk);
- `progress`: the bytes-done meter of long writes and checks;
- `remote`: a snapshot in an object store, read chunk by chunk (`RemoteSnapshot`);
- `chunk_cache`: the node-local cache of remote chunks, one download per node;
- `open`: one way to open a snapshot, local path or object-store URI (`open_any`);
- `upload`: a local snapshot pushed to object storage, verified, manifest last
  (`push_snapshot`);
- `source`: where a party's snapshot comes from: a configured path, or a synthetic one built
  once.

May use: `morphogen.constants`, `morphogen.storage` (locations, durable writes) and
`morphogen.config` (`source` reads a party's configuration); never the engines, the servers
or the client.
"""
