"""A party's admin status (GET /admin/status): the epoch every shard serves, each replica's, and
the epoch log's head, pending proposal and recent publications, as the publisher sees them."""

from __future__ import annotations

from typing import Any

from morphogen.party import admin
from morphogen.party.publisher import Publisher
from morphogen.protocol.identity import DIGEST_VERSIONS

# What admin status shows of each replica of a shard.
_REPLICA_KEYS = ("replica", "node_id", "epoch_id", "identity", "pending_updates", "scans")


async def party_status(publisher: Publisher) -> dict[str, Any]:
    """The status document of `publisher`'s party."""
    party = publisher.party
    cfg = party.cfg
    by_shard = await publisher.replica_infos()
    infos = [replicas[0] for replicas in by_shard]
    state = admin.party_epoch([i for replicas in by_shard for i in replicas])
    keep = ("shard", "epoch_id", "identity", "first_page", "stop_page", "pending_updates",
            "folded_chunks", "segments", "rotation_in_progress", "staged_epoch_id",
            "snapshot_epoch_id", "snapshot_checksum", "engine", "scans", "folds")
    log_state = await publisher.in_log(publisher.log.state)
    head = log_state.head
    pending = log_state.pending
    recent = [e.pub for e in log_state.committed[-8:] if e.pub is not None]  # no folds
    return {
        **state.as_dict(),
        "consistent": state.consistent,
        "num_pages": state.num_pages,
        "domain_bits": state.domain_bits,
        "tables": infos[0].get("tables", {}),  # the named tables, as GET /epoch lists them
        "rotation_in_progress": state.rotation_in_progress or publisher.rotating,
        "admin_busy": pending is not None,
        "epoch_log": str(publisher.log.directory) if publisher.log.durable else None,
        "epoch_log_head": None if head is None else {
            "epoch_id": head.epoch_id, "kind": head.kind, "identity": head.identity,
            "publication": head.pub},
        "epoch_log_pending": None if pending is None else {
            "epoch_id": pending.epoch_id, "publication": pending.pub,
            "lease_left_s": round(publisher.log.lease_left_s(log_state), 3)},
        "recent_publications": recent,
        # the largest batch one publication may carry here: a bigger one goes as a rotation
        "admin_max_updates": cfg.admin_updates_cap(),
        # takes a batch as its changed bytes (msgpack `{"batch": ..}`, admin_wire), up to
        # this many pages a request
        "admin_sparse_updates": True,
        "admin_max_sparse_updates": cfg.admin_max_sparse_updates,
        "admin_max_body_bytes": cfg.admin_body_limit(),
        # the batch digests a publication may name (Morphogen-Batch-Digest)
        "admin_batch_digests": list(DIGEST_VERSIONS),
        "wanted_identity": None if party.want is None else party.want.digest,
        "shards": [
            {**{k: i.get(k) for k in keep},
             "replicas": [{k: r.get(k) for k in _REPLICA_KEYS} for r in replicas]}
            for i, replicas in zip(infos, by_shard, strict=True)
        ],
    }
