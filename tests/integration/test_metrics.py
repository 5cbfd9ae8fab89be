"""The metrics a party emits reach the node's Prometheus endpoint, and carry no request data."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from morphogen.client import PirClient

pytestmark = [pytest.mark.ray]

EXPECTED = (
    "morphogen_queries", "morphogen_keys", "morphogen_errors", "morphogen_request_seconds",
    "morphogen_coalesced_keys", "morphogen_scan_seconds", "morphogen_scanned_bytes",
    "morphogen_epoch", "morphogen_pending_updates", "morphogen_catch_up_entries",
    "morphogen_replica_starts",
)


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_OURS = {"route", "status", "shard", "phase", "state"}
_RAYS = {"Component", "NodeAddress", "SessionName", "Version", "WorkerId", "application",
         "deployment", "replica", "le", "otel_scope_name", "otel_scope_schema_url",
         "otel_scope_version"}


def _scrape() -> str:
    import ray

    texts = []
    for node in ray.nodes():
        port = node.get("MetricsExportPort")
        if node.get("Alive") and port:
            texts.append(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
    return "\n".join(texts)


def test_party_metrics_are_exported_without_request_data(parties, pages) -> None:
    url_a, url_b = parties.app_url("a"), parties.app_url("b")
    with PirClient(url_a, url_b) as c:
        assert c.get([1, 2, 600]) == [pages[p].tobytes() for p in (1, 2, 600)]
    r = httpx.post(url_a + "/query/page/gpu", json={"keys": ["0x00"]}, timeout=30)
    assert r.status_code == 400
    deadline = time.monotonic() + 60
    while True:
        text = _scrape()
        ours = [line for line in text.splitlines()
                if line.startswith("ray_morphogen_") and 'application="a"' in line]
        missing = [m for m in EXPECTED if not any(f"ray_{m}" in line for line in ours)]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not missing, missing
    queries = [line for line in ours if line.startswith("ray_morphogen_queries")]
    assert any('route="/query/page/gpu' in line for line in queries), queries
    assert any('status="400"' in line for line in ours if "morphogen_errors" in line)
    assert any('phase="scan"' in line for line in ours if "morphogen_scan_seconds" in line)
    # our labels hold routes, statuses, shard numbers and phases: never keys or pages. Ray's own
    # labels (replica and worker ids, random) are left out: "0x" can occur in them by chance
    for line in ours:
        labels = dict(_LABEL.findall(line.split("{", 1)[1].rsplit("}", 1)[0]))
        mine = {k: v for k, v in labels.items() if k not in _RAYS}
        assert set(mine) <= _OURS, line
        assert all("0x" not in v and len(v) < 200 for v in mine.values()), line


def test_replicas_that_failed_to_start_are_counted(parties) -> None:
    from deployments import start_board

    start_board.post("b", "shard_1", "gone-replica", {"state": "failed", "reason": "x"})
    try:
        deadline = time.monotonic() + 60
        while True:
            lines = [ln for ln in _scrape().splitlines()
                     if ln.startswith("ray_morphogen_replica_starts")
                     and 'application="b"' in ln and 'state="failed"' in ln
                     and 'shard="1"' in ln]
            if any(ln.rsplit(" ", 1)[1] == "1.0" for ln in lines) or \
                    time.monotonic() > deadline:
                break
            time.sleep(1)
        assert any(ln.rsplit(" ", 1)[1] == "1.0" for ln in lines), lines
    finally:  # Serve started a replica since: the failure is history
        start_board.post("b", "shard_1", "next-replica", {"state": "ready", "seconds": 1.0})
