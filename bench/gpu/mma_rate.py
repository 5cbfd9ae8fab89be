"""How fast the candidate GF(2) inner loops run on this GPU: the instruction rates the scan
kernels are built on, each as AND-accumulate bit operations per second.

    python bench/gpu/mma_rate.py [--out DIR]

* lop3         acc ^= page & mask on the integer pipe (the fused kernel's inner loop):
               32 bit-ANDs per instruction and thread
* bmma         mma.m16n8k256 .b1 .and.popc accumulating in C: 16*8*256 bit-ANDs per warp
* bmma_parity  the same with C = 0 and the count parities folded into packed words as the
               sliced kernel does (3 PRMT + shift/AND/XOR per MMA and thread)
* imma         mma.m16n8k32 .s8 (what bit planes fed as 0/1 bytes would run on): 16*8*32 MACs
* chacha       the DPF's PRG, prg_g (two ChaCha8 blocks) per second: the other half of a scan

Every kernel runs a long unrolled loop of independent chains over a full grid, timed with CUDA
events after a warm-up; medians of 7 runs. The `asm volatile` bodies keep the compiler from
folding the loops. Writes mma_rate_<device>.csv.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import RESULTS, write_csv  # noqa: E402

SOURCE = r"""
typedef unsigned int u32;

extern "C" __global__ void lop3(u32* out, const u32 n, const u32 seed) {
    u32 d[8], acc[8];
    const u32 m = seed * 0x9E3779B9u ^ threadIdx.x;
#pragma unroll
    for (int i = 0; i < 8; ++i) { d[i] = seed + i * 0x01000193u + threadIdx.x; acc[i] = i; }
    for (u32 it = 0; it < n; ++it) {
#pragma unroll
        for (int r = 0; r < 8; ++r) {
#pragma unroll
            for (int i = 0; i < 8; ++i)
                asm volatile("lop3.b32 %0, %1, %2, %0, 0x6A;" : "+r"(acc[i]) : "r"(d[i]), "r"(m));
        }
    }
    u32 x = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) x ^= acc[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}

#define BMMA(D0, D1, D2, D3, C0, C1, C2, C3, A0, A1, A2, A3, B0, B1)                          \
    asm volatile("mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc "                 \
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"         \
                 : "=r"(D0), "=r"(D1), "=r"(D2), "=r"(D3)                                     \
                 : "r"(A0), "r"(A1), "r"(A2), "r"(A3), "r"(B0), "r"(B1), "r"(C0), "r"(C1),     \
                   "r"(C2), "r"(C3))

extern "C" __global__ void bmma(u32* out, const u32 n, const u32 seed) {
    const u32 a0 = seed ^ threadIdx.x, a1 = a0 * 3u, a2 = a0 * 5u, a3 = a0 * 7u;
    const u32 b0 = a0 ^ 0x5555u, b1 = a0 ^ 0x7777u;
    u32 d[8][4];
#pragma unroll
    for (int c = 0; c < 8; ++c) d[c][0] = d[c][1] = d[c][2] = d[c][3] = c;
    for (u32 it = 0; it < n; ++it) {
#pragma unroll
        for (int c = 0; c < 8; ++c)
            BMMA(d[c][0], d[c][1], d[c][2], d[c][3], d[c][0], d[c][1], d[c][2], d[c][3],
                 a0, a1, a2, a3, b0, b1);
    }
    u32 x = 0;
#pragma unroll
    for (int c = 0; c < 8; ++c) x ^= d[c][0] ^ d[c][1] ^ d[c][2] ^ d[c][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}

extern "C" __global__ void bmma_parity(u32* out, const u32 n, const u32 seed) {
    u32 a[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) a[c] = (seed + c) ^ (threadIdx.x * 0x9E3779B9u);
    const u32 b0 = seed ^ 0x5555u, b1 = seed ^ 0x7777u;
    u32 acc[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[c] = 0u;
    for (u32 it = 0; it < n; ++it) {
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            u32 d0, d1, d2, d3;
            BMMA(d0, d1, d2, d3, 0u, 0u, 0u, 0u, a[c], a[(c + 1) & 7], a[(c + 2) & 7],
                 a[(c + 3) & 7], b0, b1);
            const u32 y = __byte_perm(__byte_perm(d0, d1, 0x0040u),
                                      __byte_perm(d2, d3, 0x0040u), 0x5410u);
            acc[c] ^= (y << (c & 7)) & (0x01010101u << (c & 7));
        }
#pragma unroll
        for (int c = 0; c < 8; ++c) a[c] ^= acc[(c + 3) & 7];  // the next A depends on this one
    }
    u32 x = 0;
#pragma unroll
    for (int c = 0; c < 8; ++c) x ^= acc[c];
    out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}

extern "C" __global__ void imma(u32* out, const u32 n, const u32 seed) {
    const u32 a0 = seed ^ threadIdx.x, a1 = a0 * 3u, a2 = a0 * 5u, a3 = a0 * 7u;
    const u32 b0 = a0 ^ 0x5555u, b1 = a0 ^ 0x7777u;
    u32 d[8][4];
#pragma unroll
    for (int c = 0; c < 8; ++c) d[c][0] = d[c][1] = d[c][2] = d[c][3] = c;
    for (u32 it = 0; it < n; ++it) {
#pragma unroll
        for (int c = 0; c < 8; ++c)
            asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                         "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                         : "+r"(d[c][0]), "+r"(d[c][1]), "+r"(d[c][2]), "+r"(d[c][3])
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    u32 x = 0;
#pragma unroll
    for (int c = 0; c < 8; ++c) x ^= d[c][0] ^ d[c][1] ^ d[c][2] ^ d[c][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}
"""

# (kernel, iterations, bit-ANDs per iteration and thread: per-warp work / 32, display name)
CASES = (
    ("lop3", 4096, 8 * 8 * 32, "LOP3 AND-XOR"),
    ("bmma", 2048, 8 * 16 * 8 * 256 / 32, "BMMA m16n8k256 and.popc"),
    ("bmma_parity", 2048, 8 * 16 * 8 * 256 / 32, "BMMA + parity fold"),
    ("imma", 2048, 8 * 16 * 8 * 32 / 32, "IMMA m16n8k32 s8"),
)


def chacha_rate(cp, runs: int) -> tuple[float, float]:
    """prg_g calls per second through the scan kernel's own source (scan_kernel.cu)."""
    from morphogen.engine.gpu_kernels import kernel_source

    body = kernel_source().split("// Page loads", 1)[0]  # the PRG and DPF step only
    src = body + r"""
extern "C" __global__ void chacha(u32* out, const u32 n, const u32 seed) {
    uint4 s = make_uint4(seed, threadIdx.x, blockIdx.x, 7u);
    u32 x = 0;
    for (u32 it = 0; it < n; ++it) {
        uint4 l, r; u32 tl, tr;
        prg_g(s, l, r, tl, tr);
        s = (tl ? l : r);
        x ^= tr;
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = x ^ s.x;
}
"""
    mod = cp.RawModule(code=src, options=("-std=c++17",))
    fn = mod.get_function("chacha")
    return _time(cp, fn, 1024, runs)


def _time(cp, fn, iters: int, runs: int, threads: int = 256) -> tuple[float, float]:
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    grid = sms * 8
    out = cp.zeros(grid * threads, cp.uint32)
    args = (out, cp.uint32(iters), cp.uint32(12345))
    fn((grid,), (threads,), args)
    cp.cuda.runtime.deviceSynchronize()
    times = []
    for _ in range(runs):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn((grid,), (threads,), args)
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b))
    ms = statistics.median(times)
    calls = grid * threads * iters
    return ms, calls / (ms / 1e3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    import cupy as cp
    from scan_gpu import device_slug

    device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    clock = cp.cuda.Device().attributes["ClockRate"] / 1e6
    mod = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    rows, lop3_rate = [], None
    for name, iters, per_iter, label in CASES:
        ms, thread_iters = _time(cp, mod.get_function(name), iters, args.runs)
        rate = thread_iters * per_iter  # bit-ANDs accumulated per second
        lop3_rate = lop3_rate or rate
        rows.append({"device": device, "case": name, "ms": round(ms, 3),
                     "tbitops_s": round(rate / 1e12, 2),
                     "vs_lop3": round(rate / lop3_rate, 2)})
        print(f"{label:26s} {ms:8.3f} ms  {rate / 1e12:9.2f} T bit-ANDs/s  "
              f"x{rate / lop3_rate:6.2f} of LOP3")
    ms, calls = chacha_rate(cp, args.runs)
    rows.append({"device": device, "case": "chacha_prg_g", "ms": round(ms, 3),
                 "tbitops_s": round(calls / 1e12, 4), "vs_lop3": ""})
    print(f"{'ChaCha8 prg_g (2 blocks)':26s} {ms:8.3f} ms  {calls / 1e9:9.2f} G calls/s "
          f"(max clock {clock:.2f} GHz)")
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / f"mma_rate_{device_slug(device)}.csv", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
