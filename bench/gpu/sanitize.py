"""Small GPU run for compute-sanitizer: every scan kernel variant against the reference engine.

    compute-sanitizer --tool memcheck python bench/gpu/sanitize.py [--tables-only|--packed-only]

700 pages at a shard offset (so tiles straddle the shard's edges), both scan kernels, key counts
that reach every kernel variant and the multi-launch path (1 .. 100), table scans at a
mid-chunk offset, page writes and scans of the written pages, and the same with packed keys
(packed_scan_kernel.cu, sliced_packed_kernel.cu), compared byte for byte. Small on purpose:
under the sanitizer every access is checked.
"""

from __future__ import annotations

import sys

import numpy as np

from morphogen.engine.gpu import GpuEngine
from morphogen.engine.reference import ReferenceEngine
from morphogen.protocol import dpf
from morphogen.protocol.packed import PackedKeyBatch, generate_packed_keys


def packed(d: int, targets) -> PackedKeyBatch:
    return PackedKeyBatch.from_keys([generate_packed_keys(d, int(t))[0] for t in targets])


def main() -> int:
    rng = np.random.default_rng(5)
    n, first, d = 700, 123, 11
    pages = rng.integers(0, 256, (n, 4096), dtype=np.uint8)
    ref = ReferenceEngine().load(pages, first)
    bad = []
    tables_only = "--tables-only" in sys.argv[1:]  # the new kernels alone: a shorter run
    packed_only = "--packed-only" in sys.argv[1:]
    for kernel in ("fused", "sliced"):
        shard = GpuEngine(pool_size=1, kernel=kernel).load(pages, first)
        # packed keys: whole shard (every variant, the multi-launch path), a mid-chunk table
        for k in (1, 3, 24, 96, 100):
            keys = packed(d, rng.integers(first, first + n, k))
            if not np.array_equal(shard.scan(keys), ref.scan(keys)):
                bad.append((kernel, "packed", k))
        for k in (3, 40):
            lo, m = first + 77, 500
            keys = packed(9, rng.integers(0, m, k))
            want = ReferenceEngine().load(pages[lo - first : lo - first + m], 0).scan(keys)
            if not np.array_equal(shard.table_scanner(lo, m, 0).scan(keys), want):
                bad.append((kernel, "packed table", k))
        if packed_only:
            shard.close()
            continue
        for k in () if tables_only else (1, 3, 5, 24, 96, 100):
            targets = rng.integers(first, first + n, k)
            keys = [dpf.generate_keys(d, int(t))[int(rng.integers(2))] for t in targets]
            if not np.array_equal(shard.scan(keys), ref.scan(keys)):
                bad.append((kernel, k))
        # table scans at a mid-chunk offset (sliced_table_kernel.cu), then page writes
        # (patch_kernel.cu) and the same scans on the written pages
        lo, m = first + 77, 500
        for k in (3, 24, 40):
            keys = [dpf.generate_keys(9, int(t))[0] for t in rng.integers(0, m, k)]
            want = ReferenceEngine().load(pages[lo - first : lo - first + m], 0).scan(keys)
            if not np.array_equal(shard.table_scanner(lo, m, 0).scan(keys), want):
                bad.append((kernel, "table", k))
        written = pages.copy()
        where = np.array([first, first + 1, 255, 256, 300, first + n - 1])
        diffs = rng.integers(0, 256, (where.size, 4096), dtype=np.uint8)
        shard.write_pages(where, diffs)
        written[where - first] ^= diffs
        keys = [dpf.generate_keys(d, int(t))[0] for t in where]
        if not np.array_equal(shard.scan(keys), ReferenceEngine().load(written, first)
                              .scan(keys)):
            bad.append((kernel, "written", len(keys)))
        shard.close()
    print("sanitize: scans", "MISMATCH for (kernel, keys) " + str(bad) if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
