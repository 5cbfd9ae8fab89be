"""anvil's state dump, read as a stream and rewritten as the JSON lines geth writes.

anvil's ``--dump-state`` file (plain or gzip'd) and `anvil_dumpState`'s answer (saved as it
came: a JSON string of the gzip'd dump in hex) are one JSON object: ``"accounts"`` maps each
address to its nonce, balance, code and storage, ``"best_block_number"`` names the block, and
other members (the blocks, their transactions) come before or after. Read whole, a dump holds
its largest account and every member at once; here the bytes are decompressed a chunk at a
time and the accounts taken one by one, so what is held is one account (or one other member,
skipped) and a chunk. The accounts go to the output as they come, the block's line first.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import shutil
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from morphogen.chain.dumps import DumpError, DumpInfo, LineError, _quantity, info, parse_account

CHUNK = 1 << 20
_DECODER = json.JSONDecoder()
_SPACE = " \t\r\n"


def _raw_chunks(path: Path, chunk: int) -> Iterator[bytes]:
    """The dump's JSON bytes, decompressed as they are read."""
    with path.open("rb") as f:
        head = f.read(3)
        f.seek(0)
        if head[:2] == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=f) as z:
                while block := z.read(chunk):
                    yield block
        elif head == b'"0x':  # gzip'd, in hex, in a JSON string
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            f.read(3)
            carry = b""
            while block := f.read(chunk):
                text = carry + block.strip(b'"\r\n ')
                even = len(text) - len(text) % 2
                try:
                    data = bytes.fromhex(text[:even].decode("ascii"))
                except ValueError:
                    raise DumpError(f"{path.name}: not hex inside its JSON string") from None
                carry = text[even:]
                yield inflate.decompress(data)
            yield inflate.flush()
        else:
            while block := f.read(chunk):
                yield block


class _Stream:
    """A JSON text read through a window: values taken one at a time at the window's start."""

    def __init__(self, chunks: Iterator[bytes], name: str) -> None:
        self._chunks = chunks
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self.buf, self.pos, self.done, self.name = "", 0, False, name

    def _more(self) -> bool:
        if self.done:
            return False
        try:
            data = next(self._chunks)
        except StopIteration:
            self.done = True
            self.buf = self.buf[self.pos:] + self._utf8.decode(b"", final=True)
            self.pos = 0
            return False
        except (OSError, EOFError, zlib.error) as exc:
            raise DumpError(f"{self.name}: cannot be read ({exc})") from None
        self.buf = self.buf[self.pos:] + self._utf8.decode(data)
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next character past white space ("" at the end)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _SPACE:
                self.pos += 1
            if self.pos < len(self.buf) or not self._more():
                return self.buf[self.pos:self.pos + 1]

    def expect(self, char: str) -> None:
        if self.peek() != char:
            got = self.peek() or "the end"
            raise DumpError(f"{self.name}: not JSON: {char!r} expected, {got!r} found")
        self.pos += 1

    def value(self) -> Any:
        """The next JSON value, read once the window holds all of it."""
        self.peek()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self._more():
                    continue
                raise DumpError(f"{self.name}: not JSON ({exc.msg})") from None
            # a number may go on in the next chunk: only a value ended inside the window is
            # known to be whole
            if end == len(self.buf) and self._more():
                continue
            self.pos = end
            return obj

    def members(self) -> Iterator[str]:
        """The names of an object's members, each with the stream at its value."""
        self.expect("{")
        if self.peek() == "}":
            self.pos += 1
            return
        while True:
            name = self.value()
            if not isinstance(name, str):
                raise DumpError(f"{self.name}: not JSON: a member name is a string")
            self.expect(":")
            yield name
            if self.peek() == ",":
                self.pos += 1
                continue
            self.expect("}")
            return


def anvil_lines(path: str | os.PathLike[str], out: str | os.PathLike[str], *,
                chunk: int = CHUNK) -> DumpInfo:
    """Rewrite anvil's state dump as a dump of JSON lines at `out` (its first line names the
    block), each account checked on the way (`DumpError` names it); nothing is left at `out`
    when it fails."""
    path, out = Path(path), Path(out)
    stream = _Stream(_raw_chunks(path, chunk), path.name)
    body = out.with_name(out.name + ".body")
    tmp = out.with_name(out.name + ".tmp")
    number: int | None = None
    accounts = False
    try:
        with body.open("w") as f:
            if stream.peek() != "{":
                raise DumpError(f'{path.name}: not an anvil state dump (no "accounts" object)')
            for name in stream.members():
                if name == "accounts" and stream.peek() == "{":
                    accounts = True
                    for address in stream.members():
                        f.write(_account_line(path.name, address, stream.value()))
                elif name == "best_block_number":
                    try:
                        number = _quantity(stream.value(), "best_block_number", 64)
                    except LineError as exc:
                        raise DumpError(f"{path.name}: {exc}") from None
                else:
                    stream.value()  # the blocks and the rest: read one at a time, dropped
            if stream.peek():
                raise DumpError(f"{path.name}: not JSON: more after the dump's object")
        if not accounts:
            raise DumpError(f'{path.name}: not an anvil state dump (no "accounts" object)')
        with tmp.open("w") as f:
            f.write(json.dumps({"root": None, "number": number or 0}) + "\n")
            with body.open() as src:
                shutil.copyfileobj(src, f)
        os.replace(tmp, out)
    finally:
        body.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return info(out)


def _account_line(name: str, address: str, account: Any) -> str:
    if not isinstance(account, dict):
        raise DumpError(f"{name}: account {str(address)[:44]} is not an object")
    line = {**account, "address": address}
    try:
        parse_account(line)
    except LineError as exc:
        raise DumpError(f"{name}: account {str(address)[:44]}: {exc}") from None
    return json.dumps(line, separators=(",", ":")) + "\n"
