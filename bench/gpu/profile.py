r"""One scan each of 3, 24 and 96 keys over a random in-memory matrix, for Nsight Compute.

    ncu --kernel-name regex:"morphogen_(sliced_)?scan" --launch-skip 3 \
        python bench/gpu/profile.py [GiB]

Load warms every kernel variant (3 small launches for the default sliced kernel, 8 for
MORPHOGEN_GPU_KERNEL=fused: skip as many); then one launch per key count.
`dram__bytes_read.sum` against pages x 4096 says whether the key groups of a launch share each
page through L2 (one HBM read) or each read it again.
"""

from __future__ import annotations

import sys

import numpy as np

from morphogen.engine.gpu import GpuEngine
from morphogen.protocol import dpf


def main() -> int:
    gib = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
    n = int(gib * (1 << 30)) // 4096
    rng = np.random.default_rng(1)
    pages = np.frombuffer(rng.bytes(n * 4096), np.uint8).reshape(n, 4096)
    d = max(1, (n - 1).bit_length())
    shard = GpuEngine(pool_size=1).load(pages)
    for k in (3, 24, 96):
        targets = rng.integers(0, n, k)
        batch = dpf.KeyBatch.from_keys([dpf.generate_keys(d, int(t))[0] for t in targets])
        _, t = shard.scan_timed(batch)
        print(f"profile: {n} pages ({n * 4096} bytes), {k} keys: kernel {t.kernel_ms:.2f} ms")
    shard.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
