// Page updates written into a shard's device copy in place (gpu_writes.py, GpuShard.write_pages).
//
// gpu_kernels.kernel_source() appends this file after the scan kernels; it uses their types
// and the geometry #defines (LANES_PER_PAGE, SLICE_PAGES, SLICE_U4).
//
// An update is an XOR diff of one page (PROTOCOL.md, PageUpdate), and both layouts are linear
// over GF(2), so a diff is applied by XOR-ing the diff's own image into the copy: only the words
// that hold the page's bits change, nothing is re-sliced, no other page crosses the bus.
//   * fused layout (pages as stored): the diff's 16-byte lanes XORed into the page's;
//   * sliced layout (sliced.py, sliced_scan_kernel.cu): bit b of page-lane pl of chunk page p
//     is bit j of the word of (b, G = pl >> 4, g = pl & 7, tig = kw & 3, r = (pl >> 3 & 1) +
//     2 (kw >> 2)), kw = 2 (p >> 6) + (p & 1), j = (p & 63) >> 1. A word holds 32 pages' bits,
//     so two updates of the same chunk may share words: the bits are flipped with atomicXor.
// The host merges updates of one page into one diff, so no two threads write one fused lane.
//
// Arguments (both kernels): const uint4* diffs (n diffs of 4096 bytes), const u32* slots (the
// page's index in the shard's buffer: global page - 256 * first chunk for the sliced layout,
// global page - first_page for the fused one), u32 n, then the buffer. Block: any multiple of
// 32 threads; any grid (grid-stride over n * LANES_PER_PAGE lanes).

#ifndef LANES_PER_PAGE
#error "geometry #defines missing: compile morphogen.engine.gpu_kernels.kernel_source()"
#endif

extern "C" __global__ void morphogen_patch_pages(const uint4* __restrict__ diffs,
                                                 const u32* __restrict__ slots, const u32 n,
                                                 uint4* __restrict__ pages) {
    const u64 lanes = (u64)n * LANES_PER_PAGE;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < lanes;
         i += (u64)gridDim.x * blockDim.x) {
        const u64 page = slots[i / LANES_PER_PAGE];
        const uint4 d = diffs[i];
        uint4* p = pages + page * LANES_PER_PAGE + i % LANES_PER_PAGE;
        uint4 v = *p;
        v.x ^= d.x; v.y ^= d.y; v.z ^= d.z; v.w ^= d.w;
        *p = v;
    }
}

extern "C" __global__ void morphogen_patch_sliced(const uint4* __restrict__ diffs,
                                                  const u32* __restrict__ slots, const u32 n,
                                                  u32* __restrict__ sliced) {
    const u64 lanes = (u64)n * LANES_PER_PAGE;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < lanes;
         i += (u64)gridDim.x * blockDim.x) {
        const u32 slot = slots[i / LANES_PER_PAGE];
        const u32 pl = (u32)(i % LANES_PER_PAGE);
        const u32 p = slot % SLICE_PAGES;
        const u64 chunk = slot / SLICE_PAGES;
        const u32 kw = 2u * (p >> 6) + (p & 1u), bit = 1u << ((p & 63u) >> 1);
        const u32 g = pl & 7u, group = pl >> 4;
        const u32 r = ((pl >> 3) & 1u) + 2u * (kw >> 2);
        u32* base = sliced + chunk * (SLICE_U4 * 4ull) + (4u * g + (kw & 3u)) * 4u + r;
        const uint4 d = diffs[i];
        const u32 words[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            for (u32 m = words[w]; m != 0u; m &= m - 1u) {  // the diff's set bits only
                const u32 b = 32u * w + (u32)(__ffs(m) - 1);
                atomicXor(base + (b * 16u + group) * 128u, bit);
            }
        }
    }
}
