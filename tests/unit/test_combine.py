"""XOR of shard partials under one epoch, and the retrying fan-out."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from morphogen.party.combine import EpochMismatch, ShardFailure, scan_all, xor_partials


def _parts(n_shards: int, n_keys: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (n_keys, 4096), dtype=np.uint8) for _ in range(n_shards)]


def test_xor_in_order_any_input_type() -> None:
    parts = _parts(3, 4)
    want = parts[0] ^ parts[1] ^ parts[2]
    epoch, acc = xor_partials([(5, parts[0].tobytes()), (5, parts[1]), (5, bytearray(parts[2]))],
                              4, 3)
    assert epoch == 5
    assert np.array_equal(acc, want)
    assert acc.flags.writeable and not np.shares_memory(acc, parts[1])


def test_mixed_epochs_refused() -> None:
    parts = _parts(2, 1)
    with pytest.raises(EpochMismatch):
        xor_partials([(1, parts[0]), (2, parts[1])], 1)


def test_missing_or_malformed_partial_refused() -> None:
    parts = _parts(2, 2)
    with pytest.raises(ShardFailure):
        xor_partials([(1, parts[0])], 2, num_shards=2)
    with pytest.raises(ShardFailure):
        xor_partials([(1, parts[0]), (1, parts[1][:1])], 2)
    with pytest.raises(ShardFailure):
        xor_partials([], 2)


def _run(coro):
    return asyncio.run(coro)


def test_scan_all_retries_epoch_mismatch_then_succeeds() -> None:
    parts = _parts(2, 3)
    calls = [0, 0]

    async def shard0():
        calls[0] += 1
        return 2, parts[0]

    async def shard1():
        calls[1] += 1
        return (1 if calls[1] == 1 else 2), parts[1]  # lags one epoch on the first round

    epoch, acc = _run(scan_all([shard0, shard1], 3, attempts=3, backoff_s=0))
    assert epoch == 2
    assert np.array_equal(acc, parts[0] ^ parts[1])
    assert calls == [2, 2]  # the whole fan-out ran again, not only the lagging shard


def test_scan_all_gives_up_and_never_returns_partial() -> None:
    parts = _parts(2, 1)

    async def ok():
        return 1, parts[0]

    async def broken():
        raise ConnectionError("replica died")

    with pytest.raises(ShardFailure):
        _run(scan_all([ok, broken], 1, attempts=3, backoff_s=0))


def test_scan_all_timeout_is_a_shard_failure() -> None:
    async def slow():
        await asyncio.sleep(5)
        return 1, b""

    with pytest.raises(ShardFailure, match="timed out"):
        _run(scan_all([slow], 1, attempts=1, timeout_s=0.05))


def test_scan_all_epoch_mismatch_exhausted() -> None:
    parts = _parts(2, 1)

    async def a():
        return 1, parts[0]

    async def b():
        return 2, parts[1]

    with pytest.raises(EpochMismatch):
        _run(scan_all([a, b], 1, attempts=2, backoff_s=0))


def test_equal_epoch_ids_on_different_data_never_combine() -> None:
    from morphogen.protocol.identity import EpochIdentity

    parts = np.zeros((2, 4096), np.uint8)
    one = EpochIdentity.of_snapshot(1, "blake2b-256:" + "11" * 32)
    rebuilt = EpochIdentity.of_snapshot(1, "blake2b-256:" + "22" * 32)
    with pytest.raises(EpochMismatch):
        xor_partials([(one, parts[0]), (rebuilt, parts[1])], 1)
    batch = "33" * 32
    assert one.after_updates(2, batch) == one.after_updates(2, batch)
    with pytest.raises(EpochMismatch):  # same epoch, another update chain
        xor_partials([(one.after_updates(2, batch), parts[0]),
                      (one.after_updates(2, "44" * 32), parts[1])], 1)
    ident, _ = xor_partials([(one, parts[0]), (one, parts[1])], 1)
    assert ident == one and ident.digest.startswith("0x") and len(ident.digest) == 34
