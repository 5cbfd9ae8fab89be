"""Page changes: what an admin update publishes, as objects and as one batch in transit.

`PageUpdate` XORs a diff into a page, `PageWrite` replaces a page; `ChangeBatch` carries many of
either between the router, the shards and the epoch log as three buffers, and its `digest` is
what an epoch identity's update chain hashes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.protocol.identity import (
    DIGEST_VERSIONS,
    batch_digest,
    batch_digest_chunks,
    batch_digest_sparse,
)


@dataclass(frozen=True)
class PageUpdate:
    """XOR `diff` into global page `page` (4096 bytes)."""

    page: int
    diff: bytes

    def __post_init__(self) -> None:
        if len(self.diff) != PAGE_SIZE:
            raise ValueError(f"a page diff is {PAGE_SIZE} bytes, got {len(self.diff)}")
        if self.page < 0:
            raise ValueError("page numbers are non-negative")


@dataclass(frozen=True)
class PageWrite:
    """Replace global page `page` with `data` (at most 4096 bytes, zero-padded)."""

    page: int
    data: bytes

    def __post_init__(self) -> None:
        if len(self.data) > PAGE_SIZE:
            raise ValueError(f"a page is at most {PAGE_SIZE} bytes, got {len(self.data)}")
        if self.page < 0:
            raise ValueError("page numbers are non-negative")


Change = PageUpdate | PageWrite


@dataclass(frozen=True, eq=False)
class ChangeBatch:
    """Page changes in transit (router -> shards): one page array, one flag array, one blob.

    Thousands of small Python objects would each be pickled on every hop; this is three
    buffers. `replace[i]` marks a page replacement (its data zero-padded to 4096 bytes),
    otherwise `data[i]` is an XOR diff. Order matters: changes apply in sequence.
    `digest_version` says how `digest` is taken (`identity.DIGEST_VERSIONS`).
    """

    pages: np.ndarray  # (n,) int64, global page numbers
    replace: np.ndarray  # (n,) bool
    data: bytes  # n * 4096 bytes
    digest_version: int = 1

    def __post_init__(self) -> None:
        n = _checked_count(self.pages, self.replace)
        if len(self.data) != n * PAGE_SIZE:
            raise ValueError(f"{n} changes need {n * PAGE_SIZE} bytes of data")
        _checked_version(self.digest_version)

    @classmethod
    def from_changes(cls, changes: Sequence[Change]) -> ChangeBatch:
        pages = np.fromiter((c.page for c in changes), np.int64, len(changes))
        replace = np.fromiter((isinstance(c, PageWrite) for c in changes), bool, len(changes))
        blob = bytearray(len(changes) * PAGE_SIZE)
        for i, c in enumerate(changes):
            raw = c.data if isinstance(c, PageWrite) else c.diff
            blob[i * PAGE_SIZE : i * PAGE_SIZE + len(raw)] = raw
        return cls(pages, replace, bytes(blob))

    @classmethod
    def from_triples(cls, changes: Sequence[tuple[int, str, bytes]]) -> ChangeBatch:
        """`(page, "diff" | "data", bytes)` triples, as the admin client takes them and the
        owner's versions hold them (ValueError for another kind, a diff of another size than
        a page, or data longer than one)."""
        pages = np.fromiter((int(p) for p, _, _ in changes), np.int64, len(changes))
        replace = np.zeros(len(changes), bool)
        blob = bytearray(len(changes) * PAGE_SIZE)
        for i, (_, kind, raw) in enumerate(changes):
            if kind not in ("diff", "data"):
                raise ValueError("an update is a 'diff' (XOR) or a 'data' (replacement)")
            if len(raw) > PAGE_SIZE or (kind == "diff" and len(raw) != PAGE_SIZE):
                raise ValueError(f"a diff is {PAGE_SIZE} bytes and a page at most {PAGE_SIZE}")
            replace[i] = kind == "data"
            blob[i * PAGE_SIZE:i * PAGE_SIZE + len(raw)] = raw
        return cls(pages, replace, bytes(blob))

    @classmethod
    def from_packed(cls, pages: np.ndarray, replace: np.ndarray,
                    packed: bytes | bytearray | memoryview) -> ChangeBatch:
        """The batch whose data's sparse form (`morphogen.protocol.sparse`) is `packed`
        (SparseError when it is malformed or of another size); it keeps that form, to send
        on as it came."""
        from morphogen.protocol import sparse  # compiled kernels: only a publisher's

        n = _checked_count(pages, replace)
        raw = bytes(packed)
        sparse.check(raw, n * PAGE_SIZE)
        # its whole pages are made only if asked for: a router that logs the runs and hands
        # them on to its shards, or a follower that sends them to both parties, never does
        batch = object.__new__(_Packed)
        object.__setattr__(batch, "pages", pages)
        object.__setattr__(batch, "replace", replace)
        object.__setattr__(batch, "digest_version", 1)
        batch.__dict__["packed"] = raw
        return batch

    def with_digest(self, version: int) -> ChangeBatch:
        """This batch (its buffers shared, not copied) with its digest taken as `version`
        says (ValueError for a version this one does not know)."""
        if _checked_version(version) == self.digest_version:
            return self
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.__dict__.pop("digest", None)
        object.__setattr__(other, "digest_version", version)
        return other

    @cached_property
    def packed(self) -> bytes:
        """The data's sparse form: a block's XOR diffs are a few dozen changed bytes a page."""
        from morphogen.protocol import sparse

        return sparse.pack(self.data)

    def __reduce__(self) -> tuple:
        # between processes (a router's batch to each shard) as the changed bytes where that
        # is smaller: whole pages would cross once a shard, 4 KiB each, however little changed
        known = {k: self.__dict__[k] for k in ("digest", "digest_version")
                 if k in self.__dict__}
        packed = self.packed
        if len(packed) < len(self) * PAGE_SIZE:
            return _unpickle_packed, (self.pages, self.replace, packed, known)
        return _unpickle, (self.pages, self.replace, self.data, known)

    def __len__(self) -> int:
        return int(self.pages.shape[0])

    def triples(self) -> list[tuple[int, str, bytes]]:
        """`(page, "diff" | "data", 4096 bytes)` of each change, in order (`from_triples`)."""
        view = memoryview(self.data)
        return [(page, "data" if whole else "diff", bytes(view[i * PAGE_SIZE:(i + 1) * PAGE_SIZE]))
                for i, (page, whole) in enumerate(zip(self.pages.tolist(),
                                                      self.replace.tolist(), strict=True))]

    @cached_property
    def digest(self) -> str:
        """What the epoch identity's update chain hashes: the whole batch, whatever part of it
        a shard holds, so every shard of a party derives the same identity. Version 2 hashes
        the changed bytes (a block's few hundred KiB), version 1 every page whole (a block's
        20 MiB on a table of 16 M records)."""
        if self.digest_version == 2:
            return batch_digest_sparse(self.pages, self.replace, self._canonical())
        if "data" not in self.__dict__:  # changed bytes not unpacked: hashed a piece at a time
            from morphogen.protocol import sparse

            size = len(self) * PAGE_SIZE
            return batch_digest_chunks(self.pages, self.replace, size,
                                       sparse.dense_chunks(self.packed, size))
        return batch_digest(self.pages, self.replace, self.data)

    def _canonical(self) -> bytes:
        """The data's canonical sparse form: `packed`, which `sparse.pack` made."""
        return self.packed

    def max_page(self) -> int:
        return int(self.pages.max()) if len(self) else -1

    def select(self, first_page: int, stop_page: int) -> list[Change]:
        """The changes to pages in `[first_page, stop_page)`, in order, as objects."""
        inside = np.flatnonzero((self.pages >= first_page) & (self.pages < stop_page))
        view = self._dense()
        out: list[Change] = []
        for i in inside.tolist():
            raw = bytes(view[i * PAGE_SIZE : (i + 1) * PAGE_SIZE])
            page = int(self.pages[i])
            out.append(PageWrite(page, raw) if self.replace[i] else PageUpdate(page, raw))
        return out

    def rows(self, first_page: int, stop_page: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The changes to pages in `[first_page, stop_page)`, in order, as arrays: (pages,
        replace, data (k, 4096) uint8). Where every change is inside, the data is the batch's
        own rows (its bytes, or the array its changed bytes were unpacked into), not a copy;
        else a copy of the rows inside."""
        inside = (self.pages >= first_page) & (self.pages < stop_page)
        data = np.frombuffer(self._dense(), np.uint8).reshape(len(self), PAGE_SIZE)
        if inside.all():
            return self.pages.copy(), self.replace.copy(), data
        return self.pages[inside], self.replace[inside], data[inside]

    def row_slices(self, first_page: int, stop_page: int, rows: int
                   ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """`rows(first_page, stop_page)` a slice of `rows` changes at a time, in order, never
        unpacked whole: a fold of millions of pages is some 60 bytes a page as changed
        bytes and 4 KiB a page as rows. A slice's data may be a view of a buffer the next
        slice overwrites: use each before asking for the next."""
        n = len(self)
        if "data" in self.__dict__ or not isinstance(self, _Packed):
            view = memoryview(self.data)
            chunks: Iterator[memoryview] = (view[lo * PAGE_SIZE:min(n, lo + rows) * PAGE_SIZE]
                                            for lo in range(0, n, rows))
        else:
            from morphogen.protocol import sparse

            chunks = sparse.dense_chunks(self.packed, n * PAGE_SIZE, rows * PAGE_SIZE)
        for lo, chunk in zip(range(0, n, rows), chunks, strict=True):
            pages = self.pages[lo:lo + rows]
            inside = (pages >= first_page) & (pages < stop_page)
            if inside.any():
                data = np.frombuffer(chunk, np.uint8).reshape(len(pages), PAGE_SIZE)
                if inside.all():  # one shard of one: no copy
                    yield pages, self.replace[lo:lo + rows], data
                else:
                    yield pages[inside], self.replace[lo:lo + rows][inside], data[inside]

    def _dense(self) -> memoryview:
        """The data's bytes, for `select` and `rows` to take pages out of."""
        return memoryview(self.data)


class _Packed(ChangeBatch):
    """A batch that came as its changed bytes (`ChangeBatch.from_packed`, checked then): its
    whole pages are unpacked the first time they are read."""

    @cached_property
    def data(self) -> bytes:  # type: ignore[override]
        from morphogen.protocol import sparse

        return sparse.unpack(self.packed, len(self) * PAGE_SIZE)

    def _canonical(self) -> bytes:
        # the runs came from elsewhere (a client, a file): any valid form names these bytes
        from morphogen.protocol import sparse

        return sparse.canonical(self.packed, len(self) * PAGE_SIZE)

    def _dense(self) -> memoryview:
        # a shard takes its rows from the unpacked array (`rows`) and never reads the batch
        # whole again: the array is neither copied to bytes nor cached on the batch (a
        # block's is some 19 MiB)
        if "data" in self.__dict__:
            return memoryview(self.data)
        from morphogen.protocol import sparse

        return memoryview(sparse.unpack_array(self.packed, len(self) * PAGE_SIZE))


def _checked_version(version: int) -> int:
    if type(version) is not int or version not in DIGEST_VERSIONS:
        raise ValueError(f"batch digest version {version!r}: this version takes "
                         + " or ".join(map(str, DIGEST_VERSIONS)))
    return version


def _checked_count(pages: np.ndarray, replace: np.ndarray) -> int:
    """The number of changes of a batch's page and flag arrays (ValueError when they do not
    make one)."""
    n = int(pages.shape[0]) if pages.ndim == 1 else -1
    if n < 0 or replace.shape != (n,):
        raise ValueError("pages and replace must be two arrays of the same length")
    if n and int(pages.min()) < 0:
        raise ValueError("page numbers are non-negative")
    return n


def _unpickle(pages: np.ndarray, replace: np.ndarray, data: bytes, known: dict) -> ChangeBatch:
    batch = ChangeBatch(pages, replace, data)
    batch.__dict__.update(known)
    return batch


def _unpickle_packed(pages: np.ndarray, replace: np.ndarray, packed: bytes,
                     known: dict) -> ChangeBatch:
    batch = ChangeBatch.from_packed(pages, replace, packed)
    batch.__dict__.update(known)
    return batch


def joined(batches: Sequence[ChangeBatch]) -> ChangeBatch:
    """The batches one after another, as one batch (its changes in the same order)."""
    if len(batches) == 1:
        return batches[0]
    return ChangeBatch(np.concatenate([b.pages for b in batches]).astype(np.int64),
                       np.concatenate([b.replace for b in batches]).astype(bool),
                       b"".join(bytes(b.data) for b in batches))


def composed(batches: Sequence[ChangeBatch]) -> ChangeBatch:
    """One batch whose effect on any matrix equals applying `batches` in order: at most one
    change a page, sorted by page. A replacement absorbs whatever came before it on its page
    and XOR diffs after it fold into its data; diffs alone fold into one diff. What a
    compacted epoch log replays in place of the batches it folded: made from the batches'
    changed bytes (`morphogen.protocol.compose`), it keeps them, and its whole pages are
    made only if read."""
    from morphogen.protocol.compose import composed_parts

    pages, flags, packed = composed_parts([b.pages for b in batches],
                                          [b.replace for b in batches],
                                          [b.packed for b in batches])
    return ChangeBatch.from_packed(pages, flags, packed)
