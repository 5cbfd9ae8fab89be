"""What a party has published: its epoch log, the one decided history of its publications
(docs/publication.md), and the bearer token that guards the admin routes that write it.

- `log`: `EpochLog`, the reads and the writes (propose, renew, decide) every backend shares;
- `records`: the records, their framing and checks, and the update batch files;
- `directory`, `objects`, `memory`: where the records live (a shared directory, write-once
  objects in a store, the process);
- `compaction`: what a compacted log keeps;
- `lease`: how long an undecided proposal's lease has left, timed on the reader's own clock;
- `admin_auth`: the admin routes' bearer token.

May use: `morphogen.protocol`, `morphogen.storage` and `morphogen.constants`. The party's
servers build on this package (replicas replay the log, the publisher writes it); it never
imports them.
"""
