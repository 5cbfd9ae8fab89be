"""What `morphogen admin` prints for each server: a readable summary and, for `status`, one
table row per shard; `--json` prints the server's answer as one JSON line instead. Fields a
server does not send are shown as `-` (servers of other versions send other fields)."""

from __future__ import annotations

import json
from typing import Any

from cluster.report import print_table


def _short(identity: Any) -> str:
    text = str(identity) if identity is not None else "-"
    return text if len(text) <= 14 else text[:12] + ".."


def _val(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _identity(doc: dict[str, Any]) -> Any:
    """The party's identity: its own field, else the one all its shards report."""
    if doc.get("identity") is not None:
        return doc["identity"]
    found = {s.get("identity") for s in doc.get("shards") or []}
    return found.pop() if len(found) == 1 else None


def status_lines(url: str, doc: dict[str, Any]) -> list[str]:
    """The party summary line and log line of one `/admin/status` answer."""
    state = "consistent" if doc.get("consistent", True) else "NOT CONSISTENT"
    lines = [
        f"{url}: epoch {_val(doc, 'epoch_id')} ({_short(_identity(doc))}), "
        f"{_val(doc, 'num_pages')} pages, domain {_val(doc, 'domain_bits')} bits, {state}, "
        f"{_val(doc, 'pending_updates')} pending update(s), rotation "
        f"{_val(doc, 'rotation_in_progress')}, admin busy {_val(doc, 'admin_busy')}"
    ]
    if doc.get("epoch_log"):
        head = doc.get("epoch_log_head") or {}
        lines.append(f"  epoch log {doc['epoch_log']}: head epoch {_val(head, 'epoch_id')} "
                     f"({_val(head, 'kind')})")
    for start in doc.get("replica_starts") or []:
        lines.append(f"  replica {start.get('line', '-')}")
    return lines


def shard_rows(doc: dict[str, Any]) -> list[list[str]]:
    rows = []
    for shard in doc.get("shards") or []:
        first, stop = shard.get("first_page"), shard.get("stop_page")
        pages = f"{first}-{stop - 1}" if isinstance(first, int) and isinstance(stop, int) else "-"
        replicas = shard.get("replicas") or []
        rows.append([_val(shard, "shard"), pages, _val(shard, "epoch_id"),
                     _short(shard.get("identity")), _val(shard, "pending_updates"),
                     str(len(replicas)) if replicas else "-", _val(shard, "engine"),
                     _val(shard, "scans")])
    return rows


def print_status(url: str, doc: dict[str, Any]) -> None:
    for line in status_lines(url, doc):
        print(line)
    rows = shard_rows(doc)
    if rows:
        print_table(["shard", "pages", "epoch", "identity", "pending", "replicas", "engine",
                     "scans"], rows)
    print(flush=True)


def show(action: str, url: str, result: dict[str, Any], as_json: bool) -> None:
    """Print one server's answer to `action`."""
    if as_json:
        print(json.dumps({"server": url, **result}), flush=True)
    elif action == "status":
        print_status(url, result)
    else:
        fields = ", ".join(f"{k} {_short(v) if k == 'identity' else v}"
                           for k, v in result.items() if not isinstance(v, dict | list))
        print(f"{url}: {action} done: {fields}", flush=True)
