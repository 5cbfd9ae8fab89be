"""A batch's digest, version 2: the changed bytes in their canonical sparse form
(`sparse.canonical`), one name for one batch however its runs came, taken without its whole
pages; beside version 1 (the whole pages), which logs and publishers of earlier versions name.
What a party's log records under either version reads back and is checked."""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest

from morphogen.client.admin import AdminClient, common_digest_version
from morphogen.client.wire import encode_sparse_updates
from morphogen.constants import PAGE_SIZE
from morphogen.party import admin_wire
from morphogen.protocol import sparse
from morphogen.protocol.changes import ChangeBatch, composed
from morphogen.protocol.codec import MSGPACK_TYPE, WireError
from morphogen.protocol.identity import batch_digest
from morphogen.publication.compaction import make_fold
from morphogen.publication.records import EpochLogError, LogEntry, decode_batch, encode_batch


def _form(size: int, runs: list[tuple[int, bytes]]) -> bytes:
    """A sparse form with exactly these runs (start, bytes), canonical or not."""
    return b"".join((struct.pack("<QQ", size, len(runs)),
                     b"".join(struct.pack("<Q", s) for s, _ in runs),
                     b"".join(struct.pack("<I", len(b)) for _, b in runs),
                     b"".join(b for _, b in runs)))


def _buffer(rng: np.random.Generator, size: int) -> np.ndarray:
    buf = np.zeros(size, np.uint8)
    for _ in range(int(rng.integers(0, 30))):
        at, n = int(rng.integers(0, size)), int(rng.integers(1, 50))
        buf[at:at + n] = rng.integers(0, 3, len(buf[at:at + n]))  # zeros inside runs too
    return buf


def _other_forms(buf: np.ndarray) -> list[bytes]:
    """Valid forms of `buf` that are not `pack`'s: one run over everything, a run per
    byte, runs padded with the zeros around them, runs split where `pack` joins them."""
    size = len(buf)
    nz = np.flatnonzero(buf)
    out = [_form(size, [(0, buf.tobytes())]),
           _form(size, [(int(i), bytes(buf[i:i + 1])) for i in nz])]
    if len(nz):
        lo, hi = max(0, int(nz[0]) - 3), min(size, int(nz[-1]) + 4)
        out.append(_form(size, [(lo, buf[lo:hi].tobytes())]))
        mid = (int(nz[0]) + int(nz[-1]) + 1) // 2
        if int(nz[0]) < mid <= int(nz[-1]):
            out.append(_form(size, [(int(nz[0]), buf[nz[0]:mid].tobytes()),
                                    (mid, buf[mid:nz[-1] + 1].tobytes())]))
    return out


def test_packs_form_is_canonical_and_every_other_form_becomes_it() -> None:
    rng = np.random.default_rng(11)
    for size in (1, 7, 64, 3000):
        for _ in range(60):
            buf = _buffer(rng, size)
            packed = sparse.pack(buf)
            assert sparse.canonical(packed, size) == packed
            for other in _other_forms(buf):
                assert sparse.unpack(other, size) == buf.tobytes()
                assert sparse.canonical(other, size) == packed


@pytest.mark.parametrize("gap", [sparse.GAP - 1, sparse.GAP, sparse.GAP + 1])
def test_zeros_inside_a_run_are_canonical_only_below_the_gap(gap: int) -> None:
    buf = np.zeros(100, np.uint8)
    buf[10] = buf[10 + gap + 1] = 5
    joined = _form(100, [(10, buf[10:12 + gap].tobytes())])
    split = _form(100, [(10, b"\x05"), (11 + gap, b"\x05")])
    assert sparse.canonical(joined, 100) == (joined if gap < sparse.GAP else split)
    assert sparse.canonical(split, 100) == (joined if gap < sparse.GAP else split)


def test_the_xor_of_rewritten_pages_is_packed_canonical() -> None:
    rng = np.random.default_rng(2)
    pages = rng.integers(0, 256, (12, PAGE_SIZE), dtype=np.uint8)
    was = pages.copy()
    for row in was[::2]:
        at = int(rng.integers(0, PAGE_SIZE - 40))
        row[at:at + 40] ^= rng.integers(0, 4, 40, dtype=np.uint8)
    packed = sparse.pack_xor(pages, np.arange(12), was)
    assert sparse.canonical(packed, 12 * PAGE_SIZE) == packed


def _batch(rng: np.random.Generator, n: int = 40) -> ChangeBatch:
    dense = np.zeros((n, PAGE_SIZE), np.uint8)
    for row in dense:
        at = int(rng.integers(0, PAGE_SIZE - 40))
        row[at:at + 40] = rng.integers(0, 256, 40)
    pages = np.sort(rng.choice(10_000, n, replace=False)).astype(np.int64)
    return ChangeBatch(pages, rng.random(n) < 0.2, dense.tobytes())


def test_version_2_names_the_batch_however_it_came() -> None:
    rng = np.random.default_rng(5)
    batch = _batch(rng)
    v1, v2 = batch.digest, batch.with_digest(2).digest
    assert v1 == batch_digest(batch.pages, batch.replace, batch.data) and v2 != v1
    size = len(batch) * PAGE_SIZE
    buf = np.frombuffer(batch.data, np.uint8)
    came = [ChangeBatch.from_packed(batch.pages, batch.replace, f)
            for f in [batch.packed, *_other_forms(buf)]]
    for b in came:
        assert b.with_digest(2).digest == v2
        assert "data" not in b.__dict__  # taken from the runs, no page made whole
        assert b.digest == v1  # version 1 unless named, as before
    # another byte, page or flag is another batch
    changed = bytearray(batch.data)
    changed[5 * PAGE_SIZE + 3] ^= 1
    flipped = batch.replace.copy()
    flipped[0] ^= True
    for other in (ChangeBatch(batch.pages, batch.replace, bytes(changed)),
                  ChangeBatch(batch.pages + 1, batch.replace, batch.data),
                  ChangeBatch(batch.pages, flipped, batch.data)):
        assert other.with_digest(2).digest != v2
    # the version rides with the batch between processes, its digest computed once
    taken = came[-1].with_digest(2)
    assert taken.digest == v2
    back = pickle.loads(pickle.dumps(taken, protocol=5))
    assert back.digest_version == 2 and back.digest == v2
    assert pickle.loads(pickle.dumps(batch.with_digest(2))).digest == v2
    assert batch.with_digest(1) is batch
    with pytest.raises(ValueError, match="digest version"):
        batch.with_digest(3)
    with pytest.raises(ValueError, match="digest version"):
        ChangeBatch(batch.pages, batch.replace, batch.data, 0)
    assert sparse.canonical(batch.packed, size) == batch.packed


@pytest.mark.parametrize("version", [1, 2])
def test_the_log_reads_a_batch_under_the_version_its_record_names(version: int) -> None:
    rng = np.random.default_rng(8)
    batch = _batch(rng).with_digest(version)
    raw = b"".join(encode_batch(batch))
    entry = LogEntry(3, "updates", 5, blob="b", blob_digest=batch.digest, count=len(batch))
    back = decode_batch(raw, entry, "b")
    assert back.digest_version == version and back.digest == batch.digest
    assert back.data == batch.data and np.array_equal(back.pages, batch.pages)
    # the record's version decides what the batch names from then on (a shard's identity)
    named = LogEntry(3, "updates", 5, blob="b", blob_digest=batch.with_digest(3 - version).digest,
                     count=len(batch))
    assert decode_batch(raw, named, "b").digest_version == 3 - version
    # another batch's digest, of either version, is refused
    other = _batch(rng)
    for digest in (other.digest, other.with_digest(2).digest, "00" * 32):
        bad = LogEntry(3, "updates", 5, blob="b", blob_digest=digest, count=len(batch))
        with pytest.raises(EpochLogError, match="batch digest does not match record 3"):
            decode_batch(raw, bad, "b")
    # whole pages (a batch whose runs would not be smaller) read back the same way
    whole = ChangeBatch(batch.pages[:3], np.ones(3, bool),
                        rng.integers(1, 256, 3 * PAGE_SIZE, np.uint8).tobytes())
    whole = whole.with_digest(version)
    raw = b"".join(encode_batch(whole))
    entry = LogEntry(4, "updates", 6, blob="w", blob_digest=whole.digest, count=3)
    assert decode_batch(raw, entry, "w").data == whole.data


@pytest.mark.parametrize("last", [1, 2])
def test_a_fold_is_digested_as_its_newest_batch(last: int) -> None:
    rng = np.random.default_rng(3)
    batches = [_batch(rng).with_digest(1), _batch(rng).with_digest(last)]
    entries = [LogEntry(i, "updates", 5 + i, identity="0x" + "ab" * 16, base_epoch=4 + i,
                        blob=f"b{i}", blob_digest=b.digest, count=len(b),
                        snapshot_checksum="c", chain="00" * 32)
               for i, b in enumerate(batches)]
    made = make_fold(entries, lambda es: batches)
    entry, parts = made.entry, made.parts
    folded = composed(batches)
    assert entry.blob_digest == folded.with_digest(last).digest
    assert decode_batch(b"".join(parts), entry, "f").data == folded.data


def test_the_request_names_the_version() -> None:
    assert admin_wire.digest_version(None) == 1
    assert admin_wire.digest_version("2") == 2
    for bad in ("3", "0", "v2", ""):
        with pytest.raises(WireError) as err:
            admin_wire.digest_version(bad)
        assert err.value.status == 400 and "Morphogen-Batch-Digest" in err.value.message
    rng = np.random.default_rng(4)
    batch = _batch(rng)
    parsed = admin_wire.parse_updates(encode_sparse_updates(batch), MSGPACK_TYPE,
                                      num_pages=10_000, max_updates=100).with_digest(2)
    assert parsed.digest == batch.with_digest(2).digest


class _Says:
    """A party's status as `AdminClient` reads it, from a party of either version."""

    def __init__(self, digests: list[int] | None) -> None:
        self.digests = digests

    def __call__(self) -> dict:
        out = {"admin_max_updates": 1024}
        if self.digests is not None:
            out["admin_batch_digests"] = self.digests
        return out


@pytest.mark.parametrize("a,b,common", [([1, 2], [1, 2], 2), ([1, 2], None, 1),
                                        (None, None, 1), ([1], [1, 2], 1)])
def test_publishers_name_version_2_only_where_both_parties_take_it(a, b, common) -> None:
    clients = []
    for says in (a, b):
        c = AdminClient("http://127.0.0.1:9", "t" * 40)
        c.status = _Says(says)  # type: ignore[method-assign]
        clients.append(c)
    assert common_digest_version(clients) == common
    for c in clients:
        c.close()
