"""Combining shard partials into one answer: XOR in query order under one epoch.

XOR is associative, so any split of the pages gives the same answer; what must never happen is
an answer assembled from partials of different data, or from fewer partials than shards (a
missing shard would silently drop its pages from the XOR). Both are errors here, and the fan-out
retries a bounded number of times before giving up. A partial names its data by an
`EpochIdentity` (epoch id, snapshot checksum, update chain): equal epoch ids are not enough,
since a replica that restarted on a rebuilt snapshot may report the same id over other pages.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, TypeVar

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.party.redact import reason
from morphogen.protocol.codec import WireError

log = logging.getLogger(__name__)


class ShardFailure(RuntimeError):
    """A shard failed, timed out or answered something malformed."""


class EpochMismatch(RuntimeError):
    """Partials of one request came from different epochs (or different data)."""

    def __init__(self, message: str, identities: frozenset[Any] = frozenset()) -> None:
        super().__init__(message)
        self.identities = identities


Ident = TypeVar("Ident", bound=Hashable)


def xor_partials(
    partials: Sequence[tuple[Ident, Any]], num_keys: int, num_shards: int | None = None
) -> tuple[Ident, np.ndarray]:
    """XOR the shards' `(identity, accumulators)` into one `(num_keys, 4096)` array.

    Accumulators may be bytes-like or uint8 arrays. Raises EpochMismatch when the identities
    differ and ShardFailure when a partial is missing or has the wrong size.
    """
    if num_shards is not None and len(partials) != num_shards:
        raise ShardFailure(f"{len(partials)} partials for {num_shards} shards")
    if not partials:
        raise ShardFailure("no partials")
    epochs = {e for e, _ in partials}
    if len(epochs) != 1:
        raise EpochMismatch(f"shards answered from {len(epochs)} different epochs: "
                            + ", ".join(sorted(str(e) for e in epochs)), frozenset(epochs))
    want = num_keys * PAGE_SIZE
    acc: np.ndarray | None = None
    for i, (_, data) in enumerate(partials):
        arr = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
        if arr.size != want:
            raise ShardFailure(f"shard {i} answered {arr.size} bytes, expected {want}")
        arr = arr.reshape(num_keys, PAGE_SIZE)
        if acc is None:
            acc = arr.copy()
        else:
            np.bitwise_xor(acc, arr, out=acc)
    assert acc is not None
    return epochs.pop(), acc


ShardCall = Callable[[], Awaitable[tuple[Any, Any]]]


async def _call(call: ShardCall, timeout_s: float | None) -> tuple[Any, Any]:
    if timeout_s is None:
        return await call()
    return await asyncio.wait_for(call(), timeout_s)


async def scan_all(
    calls: Sequence[ShardCall],
    num_keys: int,
    *,
    attempts: int = 3,
    backoff_s: float = 0.05,
    timeout_s: float | None = None,
    on_mismatch: Callable[[frozenset[Any]], None] | None = None,
) -> tuple[Any, np.ndarray]:
    """Call every shard concurrently and XOR the partials; retry the whole fan-out on a shard
    failure or an epoch mismatch, at most `attempts` times, then raise the last error.

    A retry re-runs every shard (not only the failed one) so that all partials of the answer
    come from one round and can be checked against one epoch. A shard that refuses the request
    itself (a `WireError` with a 4xx status, e.g. keys of a domain a rotation replaced) ends
    the fan-out at once: retrying the same keys cannot succeed. `on_mismatch` sees the
    identities of a round that disagreed, before the retry (the caller may ask for another).
    """
    last: Exception | None = None
    for attempt in range(max(1, attempts)):
        if attempt:
            await asyncio.sleep(backoff_s * (2 ** (attempt - 1)))
        results = await asyncio.gather(
            *(_call(c, timeout_s) for c in calls), return_exceptions=True
        )
        failed = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
        if failed:
            for _, exc in failed:
                if isinstance(exc, asyncio.CancelledError):
                    raise exc
                if isinstance(exc, WireError) and exc.status < 500:
                    raise exc
            i, exc = failed[0]
            kind = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
            last = ShardFailure(f"shard {i} failed ({kind})")
            log.warning("scan attempt %d: %d shard(s) failed, first: shard %d (%s)",
                        attempt + 1, len(failed), i,
                        kind if isinstance(exc, TimeoutError) else reason(exc))
            continue
        try:
            return xor_partials(results, num_keys, len(calls))  # type: ignore[arg-type]
        except (EpochMismatch, ShardFailure) as exc:
            last = exc
            log.warning("scan attempt %d: %s", attempt + 1, exc)
            if isinstance(exc, EpochMismatch) and on_mismatch is not None:
                on_mismatch(exc.identities)
    assert last is not None
    raise last
