"""How many pages a DPF domain must cover, and how a party's pages split into shards."""

from __future__ import annotations


def domain_bits_for(num_pages: int) -> int:
    """The smallest DPF domain that covers ``num_pages`` pages (at least 1 bit)."""
    if num_pages < 1:
        raise ValueError(f"num_pages must be >= 1, got {num_pages}")
    # Integer form of max(1, ceil(log2(P))): exact where floating log2 could round.
    return max(1, (num_pages - 1).bit_length())


def shard_ranges(num_pages: int, num_shards: int) -> list[tuple[int, int]]:
    """Split ``[0, num_pages)`` into ``num_shards`` contiguous ranges whose sizes differ by <= 1.

    The first ``num_pages % num_shards`` ranges get the extra page. An empty shard would scan
    nothing yet still be waited on, so more shards than pages is refused.
    """
    if num_pages < 1:
        raise ValueError(f"num_pages must be >= 1, got {num_pages}")
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    if num_shards > num_pages:
        raise ValueError(f"cannot split {num_pages} pages into {num_shards} non-empty shards")
    base, extra = divmod(num_pages, num_shards)
    ranges = []
    start = 0
    for i in range(num_shards):
        stop = start + base + (1 if i < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges
