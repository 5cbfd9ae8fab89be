"""Node state dumps as clients write them, read a range of lines at a time.

geth's `geth dump --iterative` and `geth snapshot dump` write JSON lines (go-ethereum's
`core/state/dump.go`): first ``{"root": "0x<state root>"}``, then one account a line::

    {"balance": "<decimal>", "nonce": 3, "root": "0x..", "codeHash": "0x..", "code": "0x..",
     "storage": {"0x<64 hex slot>": "<bare hex word, leading zeros trimmed>"},
     "address": "0x<checksummed>"}

in the order of the hashed addresses. An account whose address preimage the node lacks
carries only its hashed ``"key"``: it cannot be keyed by address, so it is refused (run geth
with ``--cache.preimages``). anvil's state dump is one JSON object; `anvil_dump.anvil_lines`
rewrites it as lines of the geth shape, so that one reader serves both.

`line_ranges` cuts a dump into byte ranges that start at line starts, which builders read
independently (`morphogen.chain.bulk`); a line that is not an account is refused with its line
number (`DumpError`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from morphogen.chain.export import ExportError

_HEX = frozenset("0123456789abcdefABCDEF")
_LOWER_HEX = re.compile("[0-9a-f]*")
_ANY_HEX = re.compile("[0-9a-fA-F]*")
_PREFIXED = re.compile("(?:0x[0-9a-f]{64})*")
_ZERO = "0" * 64


class DumpError(ExportError):
    """A dump that cannot be read; the message names the file and, where one is at fault, the
    line."""


class LineError(ValueError):
    """What is wrong with one line (its reader adds where the line is)."""


@dataclass(frozen=True)
class DumpInfo:
    root: str | None  # the state root the dump's first line states (0x + 64 hex), if any
    number: int | None  # the block anvil's dump is at; geth's dumps do not say
    body: int  # byte offset of the first account line
    size: int  # bytes in the file


def info(path: str | os.PathLike[str]) -> DumpInfo:
    """What a dump of JSON lines says about itself: its first line, if it is geth's root
    line (or the line `anvil_lines` writes)."""
    path = Path(path)
    if not path.is_file():
        raise DumpError(f"{path}: no such file")
    with path.open("rb") as f:
        first = f.readline()
    size = path.stat().st_size
    try:
        obj = json.loads(first) if first.strip() else None
    except ValueError:
        raise DumpError(f"{path.name}:1: not JSON; a dump is geth's JSON lines (or anvil's "
                        "JSON, which `anvil_lines` rewrites)") from None
    if isinstance(obj, dict) and "root" in obj and "balance" not in obj:
        root = obj.get("root")
        if root is not None:
            text = root[2:] if isinstance(root, str) and root[:2] in ("0x", "0X") else root
            if not (isinstance(text, str) and len(text) == 64 and set(text) <= _HEX):
                raise DumpError(f"{path.name}:1: root {str(root)[:72]!r} is not 32 bytes of hex")
            root = "0x" + text.lower()
        number = obj.get("number")
        if number is not None and not (isinstance(number, int) and number >= 0):
            raise DumpError(f"{path.name}:1: number {str(number)[:40]!r} is not a block number")
        return DumpInfo(root, number, len(first), size)
    return DumpInfo(None, None, 0, size)


def line_ranges(path: str | os.PathLike[str], start: int, target: int) -> list[tuple[int, int]]:
    """Byte ranges [a, b) covering the file from `start`, each about `target` bytes and
    beginning at a line start (a line belongs to the range its first byte is in)."""
    size = Path(path).stat().st_size
    out = []
    with open(path, "rb") as f:
        a = start
        while a < size:
            b = min(a + max(target, 1), size)
            if b < size:
                f.seek(b - 1)
                f.readline()  # to the end of the line holding byte b - 1
                b = f.tell()
            out.append((a, b))
            a = b
    return out


def line_number(path: str | os.PathLike[str], offset: int) -> int:
    """The 1-based number of the line starting at byte `offset`."""
    n, left = 1, offset
    with open(path, "rb") as f:
        while left > 0:
            chunk = f.read(min(left, 1 << 24))
            if not chunk:
                break
            n += chunk.count(b"\n")
            left -= len(chunk)
    return n


def read_range(path: str | os.PathLike[str], start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(index within the range, line) of each non-empty line in [start, end)."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    for i, line in enumerate(data.split(b"\n")):
        if line.strip():
            yield i, line


# -- one account -------------------------------------------------------------------------------

def _hex_of(value: Any, what: str, limit: int) -> str:
    # 0x-hex or bare hex (geth writes storage words bare) -> lower-case, left-padded to `limit`
    if not isinstance(value, str):
        raise LineError(f"{what} {str(value)[:48]!r} is not a hex string")
    text = value[2:] if value[:2] in ("0x", "0X") else value
    if len(text) > limit or not set(text) <= _HEX:
        raise LineError(f"{what} {value[:72]!r} is not hex of at most {limit // 2} bytes")
    return text.lower().zfill(limit)


def _quantity(value: Any, what: str, bits: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value[:2] in ("0x", "0X") and 2 < len(value) <= 2 + bits // 4 \
            and set(value[2:]) <= _HEX:
        number = int(value, 16)
    elif isinstance(value, str) and value.isdigit() and value.isascii() and len(value) <= 80:
        number = int(value)  # geth writes balances in decimal
    else:
        raise LineError(f"{what} {str(value)[:48]!r} is not a number")
    if not 0 <= number < 1 << bits:
        raise LineError(f"{what} {str(value)[:48]!r} is not in [0, 2**{bits})")
    return number


class Account(NamedTuple):
    """One account of a dump: hex without 0x, lower-case; `slots` and `words` are the
    account's storage, 64 hex digits a slot (and its word), in slot order, zero words left
    out."""

    address: str
    nonce: int
    balance: int
    code: str
    slots: str
    words: str

    @property
    def storage(self) -> list[tuple[str, str]]:
        return [(self.slots[i:i + 64], self.words[i:i + 64])
                for i in range(0, len(self.slots), 64)]


def parse_account(line: bytes | str | dict) -> Account:
    """One account line of a dump. LineError says what is wrong with it."""
    if isinstance(line, dict):
        obj = line
    else:
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise LineError(f"not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise LineError("an account line is a JSON object")
    address = obj.get("address")
    if address is None:
        key = obj.get("key")
        raise LineError("an account without its address" + (
            f" (only its hashed key {str(key)[:20]}..: the node lacks the preimage; dump "
            "from geth run with --cache.preimages)" if key else ""))
    if not (isinstance(address, str) and len(address) == 42):
        raise LineError(f"address {str(address)[:48]!r} is not 0x and 40 hex digits")
    address = _hex_of(address, "address", 40)
    nonce = _quantity(obj.get("nonce", 0), "nonce", 64)
    balance = _quantity(obj.get("balance", 0), "balance", 256)
    code = obj.get("code") or ""
    if not isinstance(code, str):
        raise LineError(f"code {str(code)[:48]!r} is not hex")
    code = code[2:] if code[:2] in ("0x", "0X") else code
    if len(code) % 2 or not _ANY_HEX.fullmatch(code):
        raise LineError(f"code {code[:48]!r}.. is not hex bytes")
    storage = obj.get("storage") or {}
    if not isinstance(storage, dict):
        raise LineError('"storage" is not an object')
    slots, words = _storage(storage) if storage else ("", "")
    return Account(address, nonce, balance, code.lower(), slots, words)


def _storage(storage: dict) -> tuple[str, str]:
    # what geth and anvil write (slots "0x" + 64 lower-case hex; words bare and trimmed, or
    # "0x" + 64) is checked a line at a time, in C; anything else a field at a time
    n = len(storage)
    keys = "".join(storage)
    slots = words = None
    if len(keys) == 66 * n and _PREFIXED.fullmatch(keys):
        slots = keys.split("0x")[1:]
        try:
            values = "".join(storage.values())
        except TypeError:
            values = None
        if values is None:
            pass
        elif len(values) == 66 * n and _PREFIXED.fullmatch(values):
            words = values.split("0x")[1:]
        elif "x" not in values and _LOWER_HEX.fullmatch(values):
            words = list(storage.values())
            if max(map(len, words)) > 64:
                words = None
            else:
                words = [w.zfill(64) for w in words]
    if slots is None or words is None:
        pairs = [(_hex_of(s, "storage slot", 64), _hex_of(w, "storage word", 64))
                 for s, w in storage.items()]
        slots, words = [p[0] for p in pairs], [p[1] for p in pairs]
    if _ZERO in words:
        kept = [i for i, w in enumerate(words) if w != _ZERO]
        slots, words = [slots[i] for i in kept], [words[i] for i in kept]
    order = sorted(range(len(slots)), key=slots.__getitem__)
    slots, words = [slots[i] for i in order], [words[i] for i in order]
    for i in range(1, len(slots)):
        if slots[i] == slots[i - 1]:
            raise LineError(f"storage slot 0x{slots[i]} twice")
    return "".join(slots), "".join(words)
