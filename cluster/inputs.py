"""The operator's inputs, checked before anything starts: server URLs, page files, the admin
token and the updates file. Each problem is a `UsageError` naming the flag, the value and the
fix."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cluster.errors import UsageError
from morphogen.constants import PAGE_SIZE

UPDATES_FORMAT = ('{"updates": [{"page": 5, "diff": "0x<hex>"}, {"page": 7, "data": "0x<hex>"}]}'
                  ' (diff: XOR into the page; data: replace the page, zero-padded to 4096 bytes)')


def table_spec(text: str) -> dict[str, Any]:
    """argparse type: `NAME=FIRST:COUNT`, one named table of a snapshot (its name and range are
    checked against the matrix when the snapshot is written)."""
    import argparse

    name, _, span = text.partition("=")
    first, _, count = span.partition(":")
    try:
        return {"name": name, "first_page": int(first), "num_pages": int(count)}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=FIRST:COUNT (e.g. users=0:1000)") from None


def _int_at_least(text: str, low: int) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} is not >= {low}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse reports the bad value and exits 2)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


def cpu_slots(text: str) -> float:
    """argparse type: Ray CPU slots per replica, a number > 0 (fractions allowed)."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} is not > 0 (fractions like 0.25 are fine)")
    return value


def server_url(flag: str, url: str) -> str:
    from morphogen.client import check_server_url

    try:
        return check_server_url(url)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def _same_server_key(url: str) -> tuple[str, str, int | None, str]:
    import httpx

    u = httpx.URL(url)
    port = u.port or {"http": 80, "https": 443}.get(u.scheme)
    return u.scheme, u.host.lower(), port, u.path.rstrip("/")


def two_parties(url_a: str, url_b: str) -> tuple[str, str]:
    """Both parties' URLs; one server given for both would see both keys of every page and so
    learn which pages are read."""
    a, b = server_url("--server-a", url_a), server_url("--server-b", url_b)
    if _same_server_key(a) == _same_server_key(b):
        raise UsageError(
            f"--server-a and --server-b name the same server ({a}): a server that receives both "
            "keys learns which pages are read; give the two parties' URLs (e.g. "
            "http://127.0.0.1:8000/a and http://127.0.0.1:8000/b)"
        )
    return a, b


def whole_pages(what: str, path: Path, pad: bool) -> None:
    """Refuse a raw page file that ends inside a page unless `pad` (--pad-last-page) says the
    zero-padding is intended: a truncated copy looks exactly like that. `what` names the input
    as the operator gave it (`--raw pages.bin`)."""
    try:
        size = path.stat().st_size
    except OSError:
        return  # the snapshot reader names a missing or unreadable file
    ragged = size % PAGE_SIZE
    if ragged and not pad:
        raise UsageError(
            f"{what}: {size} bytes is not a whole number of {PAGE_SIZE}-byte pages "
            f"({size // PAGE_SIZE} pages and {ragged} bytes; a truncated copy?): fix the file, "
            "or pass --pad-last-page to zero-pad its last page"
        )


def raw_page_file(what: str, path: str | None, pad: bool) -> None:
    """`whole_pages` for a snapshot path that is a bare raw file (not a manifest or directory)."""
    if path is None:
        return
    p = Path(path).expanduser()
    if p.is_file() and p.suffix.lower() != ".json":
        whole_pages(what, p, pad)


def admin_token(token_file: str | None, token_env: str) -> str:
    if token_file:
        path = Path(token_file).expanduser()
        try:
            token = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            raise UsageError(f"--token-file {token_file}: no such file (the file holding the "
                             "party's admin token, its admin_token_file)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--token-file {token_file}: cannot read it ({exc})") from None
        if not token:
            raise UsageError(f"--token-file {token_file}: the file is empty")
        return token
    token = os.environ.get(token_env, "").strip()
    if not token:
        raise UsageError(f"no admin token: pass --token-file FILE or set ${token_env}")
    return token


def _update(path: str, i: int, item: Any) -> tuple[int, str, bytes]:
    from morphogen.protocol.codec import from_hex

    where = f"updates file {path}: update {i}"
    if not isinstance(item, dict):
        raise UsageError(f"{where}: expected an object like {{\"page\": 5, \"diff\": \"0x..\"}}, "
                         f"got {type(item).__name__}")
    kinds = [k for k in ("diff", "data") if k in item]
    if len(kinds) != 1:
        raise UsageError(f"{where}: needs exactly one of 'diff' or 'data'")
    page = item.get("page")
    if isinstance(page, bool) or not isinstance(page, int) or page < 0:
        raise UsageError(f"{where}: 'page' must be a page number >= 0, got {page!r}")
    try:
        raw = from_hex(item[kinds[0]])
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{where}: '{kinds[0]}' must be \"0x\" + hex: {exc}") from None
    return page, kinds[0], raw


def read_updates(path: str) -> list[tuple[int, str, bytes]]:
    """`{"updates": [{"page": n, "diff" | "data": "0x..."}]}`, the route's JSON body."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise UsageError(f"updates file {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"updates file {path}: cannot read it ({exc})") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"updates file {path}: not JSON ({exc})") from None
    items = doc.get("updates") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        if isinstance(doc, list):
            got = 'a bare list (wrap it as {"updates": [...]})'
        elif isinstance(doc, dict):
            got = 'no non-empty "updates" list'
        else:
            got = f"a JSON {type(doc).__name__}"
        raise UsageError(f"updates file {path}: expected {UPDATES_FORMAT}; got {got}")
    return [_update(path, i, item) for i, item in enumerate(items)]
