"""Page changes as the bytes that changed (`morphogen.protocol.sparse`): the codec, the admin
updates body that carries it and the party's log file that stores it. What is read back is
the dense batch, byte for byte; anything malformed is refused with a clear error."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest

from morphogen.client.wire import encode_sparse_updates, encode_updates
from morphogen.constants import PAGE_SIZE
from morphogen.party import admin_wire
from morphogen.protocol import sparse
from morphogen.protocol.changes import ChangeBatch
from morphogen.protocol.codec import MSGPACK_TYPE, WireError
from morphogen.publication.records import (
    BLOB_MAGIC,
    SPARSE_MAGIC,
    EpochLogError,
    decode_part,
    encode_batch,
)


def _diffs(rng: np.random.Generator, n: int, touched: int = 40) -> bytes:
    """n XOR diffs that change `touched` scattered bytes each (slots, hashes)."""
    dense = np.zeros((n, PAGE_SIZE), np.uint8)
    for row in dense:
        at = rng.integers(0, PAGE_SIZE - 48, touched // 8)
        for a in at:
            row[a:a + 8] = rng.integers(1, 256, 8)
    return dense.tobytes()


@pytest.mark.parametrize("shape", ["zeros", "dense", "scattered", "edges", "gaps"])
def test_a_buffer_reads_back_whole(shape: str) -> None:
    rng = np.random.default_rng(1)
    buf = np.zeros(5 * PAGE_SIZE, np.uint8)
    if shape == "dense":
        buf[:] = rng.integers(1, 256, buf.size)
    elif shape == "scattered":
        buf[:] = np.frombuffer(_diffs(rng, 5), np.uint8)
    elif shape == "edges":  # runs at the first and the last byte
        buf[0], buf[-1] = 7, 9
    elif shape == "gaps":  # zero gaps just under, at and over the merging gap
        for at, gap in ((100, sparse.GAP - 1), (300, sparse.GAP), (500, sparse.GAP + 1)):
            buf[at] = buf[at + gap + 1] = 5
    packed = sparse.pack(buf)
    assert sparse.unpack(packed, buf.size) == buf.tobytes()
    if shape == "zeros":
        assert len(packed) == 16  # the header alone


def test_a_stretch_longer_than_a_run_is_split(monkeypatch) -> None:
    monkeypatch.setattr(sparse, "LONGEST", 100)
    buf = np.random.default_rng(9).integers(1, 256, 1000).astype(np.uint8)
    packed = sparse.pack(buf)
    assert struct.unpack_from("<QQ", packed)[1] == 10
    assert sparse.unpack(packed, buf.size) == buf.tobytes()


@pytest.mark.parametrize("longest", [sparse.LONGEST, 100])
def test_the_xor_of_rewritten_pages_packs_as_its_dense_diffs(monkeypatch, longest) -> None:
    """An owner packs a block's diffs from the pages and their rows before, never making the
    dense diffs: the bytes equal `pack` of those diffs, whatever changed where (runs at a
    row's edges merging into the next row, rows changed whole, a page listed twice)."""
    monkeypatch.setattr(sparse, "LONGEST", longest)
    rng = np.random.default_rng(5)
    for trial in range(200):
        n, width = int(rng.integers(1, 30)), 64 * int(rng.integers(1, 5))
        pages = rng.integers(0, 256, (n, width), dtype=np.uint8)
        at = rng.integers(0, n, int(rng.integers(0, 2 * n)))
        was = pages[at].copy()
        for _ in range(int(rng.integers(0, 12)) if len(at) else 0):
            j = int(rng.integers(0, len(at)))
            c = int(rng.choice([0, width - 3, rng.integers(0, width)]))  # edges too
            stop = min(width, c + int(rng.integers(1, 30)))
            was[j, c:stop] ^= rng.integers(1, 256, stop - c, dtype=np.uint8)
        if trial % 9 == 0 and len(at):
            was[:] = rng.integers(0, 256, was.shape, dtype=np.uint8)
        want = sparse.pack((pages[at] ^ was).tobytes())
        assert sparse.pack_xor(pages, at, was) == want
        # the rows as they were, kept in another order among others (an owner's buffer)
        order = rng.permutation(len(at) + 3)
        kept = rng.integers(0, 256, (len(at) + 3, width), dtype=np.uint8)
        kept[order[:len(at)]] = was
        assert sparse.pack_xor(pages, at, kept, order[:len(at)]) == want
    with pytest.raises(ValueError, match="for as many"):
        sparse.pack_xor(pages, np.array([0, 0]), np.zeros((1, width), np.uint8), np.array([0]))


def test_a_blocks_diffs_cost_what_changed() -> None:
    dense = _diffs(np.random.default_rng(2), 1000)
    assert len(sparse.pack(dense)) < len(dense) / 20


def _damaged(packed: bytes, how: str) -> bytes:
    total, runs = struct.unpack_from("<QQ", packed)
    raw = bytearray(packed)
    if how == "short":
        return packed[:10]
    if how == "size":
        return struct.pack("<QQ", total + 1, runs) + packed[16:]
    if how == "runs":  # more runs named than there are
        return struct.pack("<QQ", total, runs + 1000) + packed[16:]
    if how == "overlap":  # the second run starts inside the first
        struct.pack_into("<Q", raw, 24, struct.unpack_from("<Q", raw, 16)[0])
        return bytes(raw)
    if how == "outside":  # the last run ends past the buffer
        struct.pack_into("<Q", raw, 16 + 8 * (runs - 1), total)
        return bytes(raw)
    if how == "empty":  # a run of no bytes
        struct.pack_into("<I", raw, 16 + 8 * runs, 0)
        return bytes(raw)
    if how == "extra":
        return packed + b"\x01"
    if how in ("wrap", "wrap-earlier"):
        # the last run (or one before it too) starts near 2^63: start + length wrapped
        # negative in 64 bits, and a run past the buffer passed as in order and inside
        struct.pack_into("<Q", raw, 16 + 8 * (runs - 1), (1 << 63) - 1)
        if how == "wrap-earlier":
            struct.pack_into("<Q", raw, 16 + 8 * (runs - 2), 1 << 62)
        return bytes(raw)
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["short", "size", "runs", "overlap", "outside", "empty",
                                 "extra", "wrap", "wrap-earlier"])
def test_a_malformed_buffer_is_refused(how: str) -> None:
    dense = _diffs(np.random.default_rng(3), 3)
    bad = _damaged(sparse.pack(dense), how)
    with pytest.raises(sparse.SparseError):
        sparse.unpack(bad, len(dense))
    with pytest.raises(sparse.SparseError):
        next(sparse.dense_chunks(bad, len(dense)))  # before any chunk
    with pytest.raises(sparse.SparseError):
        ChangeBatch.from_packed(np.arange(3, dtype=np.int64), np.zeros(3, bool), bad)
    with pytest.raises(sparse.SparseError):
        sparse.canonical(bad, len(dense))


@pytest.mark.parametrize("chunk", [1, 5, 4096, 6000, 1 << 20])
def test_the_dense_buffer_comes_a_chunk_at_a_time(chunk: int) -> None:
    """Runs cut by a chunk's edge, runs longer than a chunk, and chunks with no run: the
    chunks in order are the dense buffer."""
    rng = np.random.default_rng(4)
    buf = np.frombuffer(_diffs(rng, 6), np.uint8).copy()
    buf[5000:17000] = rng.integers(1, 256, 12000)  # longer than most chunks
    buf[-1] = 3
    packed = sparse.pack(buf)
    got = b"".join(bytes(c) for c in sparse.dense_chunks(packed, buf.size, chunk))
    assert got == buf.tobytes()


def _changes(rng: np.random.Generator, n: int) -> list[tuple[int, str, bytes]]:
    dense = _diffs(rng, n)
    out = []
    for i in range(n):
        kind = "data" if i % 5 == 0 else "diff"
        raw = dense[i * PAGE_SIZE:(i + 1) * PAGE_SIZE]
        out.append((int(rng.integers(0, 900)), kind, raw[:100] if kind == "data" else raw))
    return out


def test_the_sparse_body_is_the_same_batch_as_the_list_body() -> None:
    changes = _changes(np.random.default_rng(4), 50)
    as_list = admin_wire.parse_updates(encode_updates(changes), MSGPACK_TYPE, num_pages=1000,
                                       max_updates=64)
    body = encode_sparse_updates(changes)
    as_runs = admin_wire.parse_updates(body, MSGPACK_TYPE, num_pages=1000, max_updates=64)
    assert np.array_equal(as_runs.pages, as_list.pages)
    assert np.array_equal(as_runs.replace, as_list.replace)
    assert as_runs.data == as_list.data and as_runs.digest == as_list.digest
    assert len(body) < len(encode_updates(changes)) / 10


def _sparse_body(pages: bytes, replace: bytes, data: bytes, **extra) -> bytes:
    return msgpack.packb({"batch": {"pages": pages, "replace": replace, "data": data,
                                    **extra}}, use_bin_type=True)


@pytest.mark.parametrize("case,status,message", [
    ("outside", 400, "update 1: page 1000 is outside the matrix of 1000 pages"),
    ("negative", 400, "update 0: page -1 is outside"),
    ("too_many", 400, "a request holds 1..2 updates, got 3"),
    ("none", 400, "a request holds 1..2 updates, got 0"),
    ("lengths", 400, "batch.pages is 8 bytes a change"),
    ("flags", 400, "batch.replace holds 0 (diff) or 1 (data)"),
    ("size", 400, "batch.data: the sparse buffer is of"),
    ("corrupt", 400, "batch.data:"),
    ("wrap", 400, "batch.data: the runs overlap, are empty or leave the buffer"),
    ("field", 422, ""),
])
def test_a_bad_sparse_body_is_refused(case: str, status: int, message: str) -> None:
    dense = _diffs(np.random.default_rng(5), 2)
    pages, flags, data = np.array([3, 4], "<i8").tobytes(), b"\0\0", sparse.pack(dense)
    max_updates = 2
    if case == "outside":
        pages = np.array([3, 1000], "<i8").tobytes()
    elif case == "negative":
        pages = np.array([-1, 4], "<i8").tobytes()
    elif case == "too_many":
        pages, flags = np.array([1, 2, 3], "<i8").tobytes(), b"\0\0\0"
        data = sparse.pack(dense + bytes(PAGE_SIZE))
    elif case == "none":
        pages, flags, data = b"", b"", sparse.pack(b"")
    elif case == "lengths":
        pages = pages[:-1]
    elif case == "flags":
        flags = b"\0\2"
    elif case == "size":
        data = sparse.pack(dense[:PAGE_SIZE])
    elif case == "corrupt":
        data = _damaged(data, "overlap")
    elif case == "wrap":
        data = _damaged(data, "wrap-earlier")
    body = _sparse_body(pages, flags, data, **({"extra": 1} if case == "field" else {}))
    with pytest.raises(WireError) as err:
        admin_wire.parse_updates(body, MSGPACK_TYPE, num_pages=1000, max_updates=max_updates)
    assert err.value.status == status
    assert message in err.value.message


def test_the_log_stores_a_batch_of_diffs_as_its_changed_bytes() -> None:
    rng = np.random.default_rng(6)
    dense = _diffs(rng, 300)
    batch = ChangeBatch(rng.integers(0, 1 << 20, 300).astype(np.int64),
                        rng.random(300) < 0.1, dense)
    raw = b"".join(encode_batch(batch))
    assert raw[:4] == SPARSE_MAGIC and len(raw) < len(dense) / 10
    back = decode_part(raw, "p")
    assert back.data == batch.data and back.digest == batch.digest
    # random pages gain nothing from runs: stored whole, as before
    whole = ChangeBatch(np.arange(3, dtype=np.int64), np.ones(3, bool),
                        rng.integers(0, 256, 3 * PAGE_SIZE, np.uint8).tobytes())
    raw = b"".join(encode_batch(whole))
    assert raw[:4] == BLOB_MAGIC and decode_part(raw, "p").data == whole.data
    # a damaged sparse file is refused, named
    head = 16 + 9 * 300
    for bad in (raw[:0] + b"".join(encode_batch(batch))[:head + 5],
                b"".join(encode_batch(batch))[:head] + _damaged(sparse.pack(dense), "runs")):
        with pytest.raises(EpochLogError, match="p: .*corrupt"):
            decode_part(bad, "p")


@pytest.mark.parametrize("says,sparse_cap,body_cap", [
    (True, None, None), (False, None, None), (None, None, None),
    (True, 10, 0),  # the batch in one body of changed bytes, just within the body limit
    (True, 9, 0),  # more pages than such a body may carry: parts
    (True, 10, -1),  # a body over the party's limit: parts
])
def test_the_admin_client_sends_the_form_the_party_takes(says, sparse_cap, body_cap) -> None:
    import httpx

    from morphogen.client.admin import AdminClient

    bodies: list[dict] = []

    def route(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            status = {"admin_max_updates": 64}
            if says is not None:
                status["admin_sparse_updates"] = says
            if sparse_cap is not None:
                limit = len(encode_sparse_updates(changes)) + body_cap
                status.update(admin_max_sparse_updates=sparse_cap, admin_max_body_bytes=limit)
            return httpx.Response(200, json=status)
        bodies.append(msgpack.unpackb(request.content, raw=False))
        return httpx.Response(200, json={"epoch_id": 2, "identity": "0x" + "ab" * 16})

    changes = _changes(np.random.default_rng(7), 10)
    # as triples, and as one batch (what a publisher sends both parties, packed once)
    for sent in (ChangeBatch.from_triples(changes), changes):
        bodies.clear()
        with AdminClient("http://a", "t" * 32, transport=httpx.MockTransport(route)) as client:
            client.updates(sent, "pub-1")
            client.updates(sent, "pub-2", max_per_request=4)  # over the request's cap
        if isinstance(sent, ChangeBatch):
            from_batch = list(bodies)
    # the same batches (a replacement sent from a batch is its page zero-padded: the same)
    def parsed(body: dict) -> tuple:
        got = admin_wire.parse_updates(msgpack.packb(body, use_bin_type=True), MSGPACK_TYPE,
                                       num_pages=1000, max_updates=100, max_sparse=100)
        return got.pages.tolist(), got.replace.tolist(), got.data

    assert [parsed(b) for b in bodies] == [parsed(b) for b in from_batch]
    one = says and sparse_cap == 10 and body_cap == 0
    assert len(bodies) == 1 + (1 if one else 3)
    assert all(("batch" in b) == bool(says) and ("updates" in b) != bool(says) for b in bodies)
    if one:
        assert len(bodies[1]["batch"]["pages"]) == 8 * 10


@pytest.mark.parametrize("shape", ["diffs", "random"])
def test_a_batch_crosses_processes_as_its_changed_bytes(shape: str) -> None:
    """A router hands each shard the batch pickled: a block's diffs as their changed bytes,
    random pages whole; the same batch and digest arrive either way."""
    import pickle

    rng = np.random.default_rng(9)
    n = 64
    data = (_diffs(rng, n) if shape == "diffs"
            else rng.integers(0, 256, n * PAGE_SIZE, dtype=np.uint8).tobytes())
    batch = ChangeBatch(np.arange(n, dtype=np.int64) * 3, np.zeros(n, bool), data)
    digest = batch.digest
    raw = pickle.dumps(batch, protocol=5)
    back = pickle.loads(raw)
    assert np.array_equal(back.pages, batch.pages) and np.array_equal(back.replace, batch.replace)
    assert back.data == batch.data and back.digest == digest
    if shape == "diffs":
        assert len(raw) < len(data) / 10 and back.packed == batch.packed
    else:
        assert len(raw) > len(data)
    # a batch parsed from a body of changed bytes keeps them: sent on without packing again
    body = encode_sparse_updates(batch)
    parsed = admin_wire.parse_updates(body, MSGPACK_TYPE, num_pages=1000, max_updates=n)
    assert "packed" in parsed.__dict__
    # and makes its whole pages only when they are read: its digest comes from the changed
    # bytes, and so do its log file and its pickled form where those are the smaller
    assert parsed.digest == digest and "data" not in parsed.__dict__
    encode_batch(parsed)
    again = pickle.loads(pickle.dumps(parsed, protocol=5))
    assert ("data" in parsed.__dict__) == (shape == "random")
    assert again.digest == digest and again.data == parsed.data == batch.data


def test_a_shard_takes_its_pages_of_a_batch_without_unpacking_it_to_bytes() -> None:
    """What a shard keeps of a batch of changed bytes (`select`) is each of its pages, copied
    from a buffer that is neither made into bytes nor kept with the batch; the same changes
    as a batch of whole pages gives, at any range."""
    rng = np.random.default_rng(4)
    n = 40
    data = _diffs(rng, n)
    pages = np.sort(rng.choice(1000, n, replace=False)).astype(np.int64)
    replace = rng.integers(0, 2, n).astype(bool)
    whole = ChangeBatch(pages, replace, data)
    assert sparse.unpack_array(whole.packed, len(data)).tobytes() == data
    for lo, hi in ((0, 1000), (200, 700), (int(pages[3]), int(pages[3]) + 1), (5000, 6000)):
        packed = ChangeBatch.from_packed(pages, replace, whole.packed)
        got = packed.select(lo, hi)
        assert "data" not in packed.__dict__
        assert got == whole.select(lo, hi)
        assert all(isinstance(getattr(c, "data", getattr(c, "diff", None)), bytes)
                   for c in got)
        assert len(got) == int(((pages >= lo) & (pages < hi)).sum())
    # a batch whose bytes were unpacked already reads them where they are
    packed = ChangeBatch.from_packed(pages, replace, whole.packed)
    assert packed.data == data
    assert packed.select(0, 1000) == whole.select(0, 1000)
