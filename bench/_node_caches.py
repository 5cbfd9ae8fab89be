"""What each node of a multi-node run fetched into its own chunk cache, against what its
replicas needed: for every node and snapshot, the chunks in its cache and the chunks of the
page ranges of the shards whose replicas ran there (from the start board)."""

from __future__ import annotations

import json
from pathlib import Path

from deployments import start_board
from morphogen.snapshot.layout import shard_ranges


def _chunks(first: int, stop: int, chunk_pages: int) -> set[int]:
    return set(range(first // chunk_pages, -(-stop // chunk_pages)))


def node_chunks(caches: Path, apps: dict[str, int]) -> dict[str, dict[str, dict[str, list]]]:
    """{node id: {snapshot root: {"has": chunks cached, "expected": chunks of the shards
    that ran there, "fetched": chunks the replicas there fetched as they started}}};
    `apps` maps each application to its number of shards."""
    shards_on: dict[str, set[tuple[int, int]]] = {}  # node -> {(shard, num_shards)}
    fetched: dict[tuple[str, str], list[int]] = {}  # (node, root) -> chunks, each fetch
    for app, num_shards in apps.items():
        for doc in start_board.read(app):
            if doc.get("state") == "ready" and str(doc.get("deployment", "")).startswith(
                    "shard_"):
                shard = int(str(doc["deployment"]).removeprefix("shard_"))
                node = str(doc["node"])
                shards_on.setdefault(node, set()).add((shard, num_shards))
                for root, chunks in (doc.get("fetched_chunks") or {}).items():
                    fetched.setdefault((node, root), []).extend(chunks)
    out: dict[str, dict[str, dict[str, list]]] = {}
    for node_dir in sorted(p for p in caches.iterdir() if p.is_dir()):
        for root_dir in sorted(p for p in node_dir.iterdir() if p.is_dir()
                               and not p.name.startswith(".")):
            manifest_file = root_dir / "manifest.json"
            if not manifest_file.is_file():
                continue
            m = json.loads(manifest_file.read_text())
            expected: set[int] = set()
            for shard, num_shards in shards_on.get(node_dir.name, set()):
                first, stop = shard_ranges(m["num_pages"], num_shards)[shard]
                expected |= _chunks(first, stop, m["chunk_pages"])
            has = {int(p.name.removeprefix("chunk-")) for p in root_dir.glob("chunk-*")}
            out.setdefault(node_dir.name, {})[root_dir.name[-12:]] = {
                "has": sorted(has), "expected": sorted(expected),
                "fetched": sorted(fetched.get((node_dir.name, root_dir.name), []))}
    return out
