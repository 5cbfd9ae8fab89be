"""A freshly built table's tag -> key pairs as two arrays, not a dict of bytes.

A build holds every record's tag and key already as arrays (it hashed them there). A dict of
bytes objects built from them cost the chain import's one-process step more than placing the
records did: the objects were made, joined across tables, then taken apart again into the
index's files (`morphogen.keyword.key_index`). The arrays go to the index as they are.

It reads as a mapping (tests and small tools look keys up); the first lookup builds a dict
once, which the build's own path never does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from morphogen.keyword.layout import TAG_SIZE


class KeyColumns(Mapping[bytes, bytes]):
    """Record i has tag `tags[i]` (16 bytes) and key `flat[offsets[i]:offsets[i + 1]]`, the
    keys' bytes being `flats` back to back (tables joined keep theirs apart: they are only
    ever written out in order)."""

    def __init__(self, tags: np.ndarray, flat: np.ndarray | Sequence[np.ndarray],
                 offsets: np.ndarray, *, file: str | os.PathLike[str] | None = None) -> None:
        tags = np.ascontiguousarray(tags, np.uint8).reshape(-1, TAG_SIZE)
        offsets = np.asarray(offsets, np.int64)
        flats = [flat] if isinstance(flat, np.ndarray) else list(flat)
        self.flats = [np.ascontiguousarray(f, np.uint8).reshape(-1) for f in flats]
        if len(offsets) != len(tags) + 1 or int(offsets[0]) != 0 \
                or int(offsets[-1]) != sum(len(f) for f in self.flats) \
                or bool((np.diff(offsets) < 0).any()):
            raise ValueError("offsets are len(tags) + 1 non-decreasing ends into the keys")
        self.tags, self.offsets = tags, offsets
        # the keys are that file's bytes, through its mapping (`flats`): written once there
        self.file = None if file is None else Path(file)
        self._dict: dict[bytes, bytes] | None = None

    @classmethod
    def of(cls, tags: np.ndarray, keys: Sequence[bytes] | np.ndarray) -> KeyColumns:
        """From a list of keys, or from keys of one width as the rows of a 2-D byte array."""
        if isinstance(keys, np.ndarray):
            return cls.rows(tags, [keys])
        lengths = np.fromiter(map(len, keys), np.int64, len(keys))
        offsets = np.zeros(len(keys) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(tags, np.frombuffer(b"".join(keys), np.uint8), offsets)

    @classmethod
    def rows(cls, tags: np.ndarray, blocks: Sequence[np.ndarray], *,
             file: str | os.PathLike[str] | None = None) -> KeyColumns:
        """The keys as the rows of 2-D byte arrays (`blocks`, back to back), each array's
        keys of its own width: a build's tables, one array each, never joined. `file`: the
        blocks are its mapping, in order and whole."""
        offsets = np.empty(sum(len(b) for b in blocks) + 1, np.int64)
        at = base = 0
        for block in blocks:
            rows, width = block.shape
            np.multiply(np.arange(rows, dtype=np.int64), width, out=offsets[at:at + rows])
            offsets[at:at + rows] += base
            at, base = at + rows, base + block.size
        offsets[at] = base
        return cls(tags, [b.reshape(-1) for b in blocks], offsets, file=file)

    @classmethod
    def concat(cls, parts: Sequence[KeyColumns]) -> KeyColumns:
        if not parts:
            return cls(np.zeros((0, TAG_SIZE), np.uint8), np.zeros(0, np.uint8), np.zeros(1))
        ends = np.cumsum([0] + [int(p.offsets[-1]) for p in parts])
        offsets = np.concatenate(
            [[0]] + [p.offsets[1:] + e for p, e in zip(parts, ends[:-1], strict=True)])
        return cls(np.concatenate([p.tags for p in parts]),
                   [f for p in parts for f in p.flats], offsets)

    def write(self, path: str | os.PathLike[str]) -> None:
        """The keys' bytes, in order, as the file `path`: nothing to write where the keys are
        that file's shared mapping (its pages are the file's; a durable sync's fsync writes
        them to disk)."""
        if self.file is not None and Path(path).resolve() == self.file.resolve():
            return
        with open(path, "wb") as f:
            for flat in self.flats:
                flat.tofile(f)

    def key(self, i: int) -> bytes:
        """Record `i`'s key."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        for flat in self.flats:  # a key lies in one of them
            if a < len(flat) or a == b:
                return flat[a:b].tobytes()
            a, b = a - len(flat), b - len(flat)
        raise IndexError(i)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def _lookup(self) -> dict[bytes, bytes]:
        if self._dict is None:
            flat, tags = b"".join(f.tobytes() for f in self.flats), self.tags.tobytes()
            ends = self.offsets.tolist()
            self._dict = {tags[i * TAG_SIZE:(i + 1) * TAG_SIZE]: flat[ends[i]:ends[i + 1]]
                          for i in range(len(self.tags))}
        return self._dict

    def __len__(self) -> int:
        return len(self.tags)

    def __iter__(self) -> Iterator[bytes]:
        tags = self.tags.tobytes()
        return (tags[i:i + TAG_SIZE] for i in range(0, len(tags), TAG_SIZE))

    def __getitem__(self, tag: bytes) -> bytes:
        return self._lookup()[tag]

    def __contains__(self, tag: object) -> bool:
        return tag in self._lookup()

