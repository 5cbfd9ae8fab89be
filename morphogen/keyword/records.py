"""Records in: JSON lines, CSV, or any Python iterable of (key, value) pairs.

In files, a key or value is text: ``0x`` followed by hex digits is those bytes, anything else
is its UTF-8 encoding. A JSON line is ``{"key": ..., "value": ...}``; a CSV row is
``key,value`` (a first row ``key,value`` is a header). Every error names the file and line.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple


class RecordError(ValueError):
    """A record that cannot go into a table; the message names it."""


class Record(NamedTuple):
    key: bytes
    value: bytes
    where: str  # "records.jsonl:12", or "record 12" for an iterable


def decode_field(text: object, where: str, name: str) -> bytes:
    if isinstance(text, bytes):
        return text
    if not isinstance(text, str):
        raise RecordError(f"{where}: {name} must be a string (0x-hex or text), got "
                          f"{type(text).__name__}")
    if text[:2] in ("0x", "0X"):
        try:
            return bytes.fromhex(text[2:])
        except ValueError:
            raise RecordError(f"{where}: {name} {text[:40]!r} is not valid hex") from None
    return text.encode()


def from_pairs(pairs: Iterable[tuple[bytes | str, bytes | str]]) -> Iterator[Record]:
    for i, pair in enumerate(pairs):
        where = f"record {i}"
        try:
            key, value = pair
        except (TypeError, ValueError):
            raise RecordError(f"{where}: not a (key, value) pair") from None
        yield Record(decode_field(key, where, "key"), decode_field(value, where, "value"), where)


def json_lines(path: Path) -> Iterator[tuple[str, object]]:
    """(where, object) of each non-blank line of a JSON-lines file; `where` is `name:line`,
    and a line that is not JSON is a RecordError naming it."""
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path.name}:{n}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                raise RecordError(f"{where}: not JSON ({exc.msg})") from None


def _jsonl(path: Path) -> Iterator[Record]:
    for where, obj in json_lines(path):
        if not isinstance(obj, dict) or "key" not in obj or "value" not in obj:
            raise RecordError(f'{where}: expected {{"key": ..., "value": ...}}')
        yield Record(decode_field(obj["key"], where, "key"),
                     decode_field(obj["value"], where, "value"), where)


def _csv(path: Path) -> Iterator[Record]:
    with path.open(newline="", encoding="utf-8") as f:
        for n, row in enumerate(csv.reader(f), 1):
            if not row:
                continue
            where = f"{path.name}:{n}"
            if n == 1 and [c.strip().lower() for c in row] == ["key", "value"]:
                continue
            if len(row) != 2:
                raise RecordError(f"{where}: expected two columns key,value, got {len(row)}")
            yield Record(decode_field(row[0], where, "key"),
                         decode_field(row[1], where, "value"), where)


def read_records(path: str | os.PathLike[str], fmt: str | None = None) -> Iterator[Record]:
    """The records of a JSON-lines (``.jsonl``, ``.ndjson``) or CSV (``.csv``) file."""
    path = Path(path)
    if fmt is None:
        suffix = path.suffix.lower()
        fmt = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv"}.get(suffix)
        if fmt is None:
            raise RecordError(f"{path}: cannot tell the format from {suffix!r}; say "
                              "--format jsonl or csv")
    if not path.is_file():
        raise RecordError(f"{path}: no such file")
    if fmt == "jsonl":
        return _jsonl(path)
    if fmt == "csv":
        return _csv(path)
    raise RecordError(f"unknown records format {fmt!r} (jsonl or csv)")
