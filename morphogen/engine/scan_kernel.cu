// Fused DPF-evaluate + AND-XOR page scan for the GPU engine (morphogen/engine/gpu.py).
//
// One launch of morphogen_scan_k<KG> answers up to `num_keys` DPF keys over one shard's pages:
//
//     partial[pb][k] = XOR over the block's pages p of ( page_p AND tile(mask_k(first_page + p)) )
//
// and morphogen_xor_reduce folds the per-block partials into the (num_keys, 4096)-byte answer.
// PROTOCOL.md sections 2-3 define the PRG (ChaCha8) and the DPF evaluated here.
//
// The source is compiled by CuPy (NVRTC) at load and by `python -m morphogen.engine.nvcc_check`
// with nvcc; the tests also compile it as host C++ through an emulation prelude that defines
// MORPHOGEN_HOST_EMULATION. It therefore includes no headers and uses only builtins.
//
// The geometry (SCAN_THREADS, LANES_PER_PAGE, LANES_PER_THREAD, KEY_HEADER_WORDS,
// MAX_TILE_BITS, PATH_SLOTS, REDUCE_LANES, REDUCE_SLICES, READ_BW_THREADS) is not defined here:
// morphogen/engine/gpu_kernels.py `kernel_source()` prepends it as generated #defines, from the
// Python constants the host plans with (gpu_plan.py, gpu_keys.py, morphogen/constants.py).
//
// Grid and work split (the host side, gpu_plan.py `plan_launch`, must agree):
//   * blockDim.x == SCAN_THREADS (128). Thread `tid` owns the 16-byte lanes tid and tid + 128
//     of every page (LANES_PER_THREAD = 2), so a warp's loads are 512 contiguous bytes.
//   * gridDim.x == num_groups * num_page_blocks. Block b serves key group g = b % num_groups
//     (keys [g*KG, g*KG + KG)) over page block pb = b / num_groups, the local pages
//     [num_pages*pb/num_page_blocks, num_pages*(pb+1)/num_page_blocks). The key groups of one
//     page block are adjacent in the grid, so they run side by side and read the same pages:
//     the first brings a page from HBM, the others find it in L2.
//   * A tile is 2^tile_bits pages aligned in the GLOBAL page numbering. Per tile, the KG
//     "walker" threads advance the root-to-tile-root path of their key (a cached path, so
//     consecutive tiles cost about two PRG calls, not d - tile_bits), then the whole block
//     expands the tile's subtree breadth-first in shared memory, one PRG call per node, and
//     the last level writes the masks, still in shared memory. Masks never reach device memory.
//   * Accumulators stay in registers for the block's whole page range (KG keys x 2 lanes);
//     the block writes its partial rows once, every row fully, with plain stores. The reduce
//     kernel writes every output element. Nothing needs zeroing, nothing races.
//
// Kernel arguments: CuPy does not check the types of scalar arguments, so gpu.py passes each
// scalar as the numpy type named here (gpu_kernels.py documents the same table):
//   const uint4* pages       cupy uint8 array (num_pages*4096 bytes, 16-byte aligned)
//   u64 num_pages            numpy.uint64   pages in this shard
//   u64 first_page           numpy.uint64   global index of the shard's page 0
//   const u32* keys          cupy uint8 array holding num_keys u32 records of key_words(d)
//   u32 num_keys             numpy.uint32
//   u32 domain_bits          numpy.uint32   d, 1..32
//   u32 tile_bits            numpy.uint32   h, 1..min(d, MAX_TILE_BITS)
//   u32 num_groups           numpy.uint32   key groups (gridDim.x = num_groups * page blocks)
//   uint4* partial           cupy uint8 array, page_blocks * num_keys * 4096 bytes
//
// Key record (u32 words, little-endian, stride 12 + 4*d; gpu_keys.py `pack_keys`):
//   [0..3] root seed   [4..7] final_cw   [8] root_t   [9] tcw_left bits (bit i = level i)
//   [10] tcw_right bits   [11] 0   [12 + 4*i .. 15 + 4*i] cw[i]

#ifndef MORPHOGEN_HOST_EMULATION
typedef unsigned int u32;        // numpy.uint32
typedef unsigned long long u64;  // numpy.uint64
typedef unsigned char u8;        // numpy.uint8
#define MG_DYNAMIC_SMEM(name) extern __shared__ uint4 name[]
#endif

#ifndef SCAN_THREADS
#error "geometry #defines missing: compile morphogen.engine.gpu_kernels.kernel_source()"
#endif

// Own helper rather than the runtime's min() overloads: NVRTC and the host emulation agree.
__device__ __forceinline__ u32 min_u32(const u32 a, const u32 b) { return a < b ? a : b; }

// ----------------------------------------------------------------------------------------
// ChaCha8 PRG G(seed) -> (L, R, tL, tR): PROTOCOL.md section 2.

__device__ __forceinline__ u32 rotl32(u32 x, u32 n) { return __funnelshift_l(x, x, n); }

#define MG_QR(a, b, c, d)  \
    a += b;                \
    d = rotl32(d ^ a, 16); \
    c += d;                \
    b = rotl32(b ^ c, 12); \
    a += b;                \
    d = rotl32(d ^ a, 8);  \
    c += d;                \
    b = rotl32(b ^ c, 7);

#define MG_DOUBLE_ROUND(x)                   \
    MG_QR(x[0], x[4], x[8], x[12])           \
    MG_QR(x[1], x[5], x[9], x[13])           \
    MG_QR(x[2], x[6], x[10], x[14])          \
    MG_QR(x[3], x[7], x[11], x[15])          \
    MG_QR(x[0], x[5], x[10], x[15])          \
    MG_QR(x[1], x[6], x[11], x[12])          \
    MG_QR(x[2], x[7], x[8], x[13])           \
    MG_QR(x[3], x[4], x[9], x[14])

#define MG_C0 0x61707865u
#define MG_C1 0x3320646eu
#define MG_C2 0x79622d32u
#define MG_C3 0x6b206574u

// Both blocks (counter 0 and 1) are computed side by side: independent instruction streams
// that the scheduler interleaves, and the compiler shares their identical first quarter rounds.
__device__ __forceinline__ void prg_g(const uint4 s, uint4& left, uint4& right, u32& t_left,
                                      u32& t_right) {
    u32 x[16] = {MG_C0, MG_C1, MG_C2, MG_C3, s.x, s.y, s.z, s.w,
                 s.x,   s.y,   s.z,   s.w,   0u,  0u,  0u,  0u};
    u32 y[16] = {MG_C0, MG_C1, MG_C2, MG_C3, s.x, s.y, s.z, s.w,
                 s.x,   s.y,   s.z,   s.w,   1u,  0u,  0u,  0u};
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        MG_DOUBLE_ROUND(x)
        MG_DOUBLE_ROUND(y)
    }
    left = make_uint4(x[0] + MG_C0, x[1] + MG_C1, x[2] + MG_C2, x[3] + MG_C3);
    right = make_uint4(x[4] + s.x, x[5] + s.y, x[6] + s.z, x[7] + s.w);
    t_left = (y[0] + MG_C0) & 1u;
    t_right = (y[1] + MG_C1) & 1u;
}

// One DPF tree step: both children of node (s, t) at tree level `level`, corrected.
__device__ __forceinline__ void dpf_children(const uint4 s, const u32 t,
                                             const u32* __restrict__ key, const u32 level,
                                             uint4& sl, u32& tl, uint4& sr, u32& tr) {
    prg_g(s, sl, sr, tl, tr);
    const u32 on = 0u - t;  // all ones where the correction applies (branch-free)
    const u32* cw = key + KEY_HEADER_WORDS + 4u * level;
    const uint4 c = make_uint4(__ldg(cw) & on, __ldg(cw + 1) & on, __ldg(cw + 2) & on,
                               __ldg(cw + 3) & on);
    sl.x ^= c.x; sl.y ^= c.y; sl.z ^= c.z; sl.w ^= c.w;
    sr.x ^= c.x; sr.y ^= c.y; sr.z ^= c.z; sr.w ^= c.w;
    tl ^= (__ldg(key + 9) >> level) & t;
    tr ^= (__ldg(key + 10) >> level) & t;
}

// One key's cached root-to-subtree path (path_s / path_t: PATH_SLOTS nodes, the root at 0)
// moved to subtree `index` at depth `root_depth`. Consecutive subtrees share the path above the
// highest bit in which their indices differ, so only the levels below it are recomputed (all of
// them when `whole`: the first subtree a block visits). Node root_depth is then the subtree's
// root.
__device__ __forceinline__ void advance_path(uint4* path_s, u8* path_t,
                                             const u32* __restrict__ key, const u32 root_depth,
                                             const u32 index, const bool whole) {
    u32 from = 0;
    if (!whole && root_depth > 0) {
        const u32 diff = index ^ (index - 1u);
        from = root_depth - (32u - __clz(diff));
    }
    for (u32 i = from; i < root_depth; ++i) {
        uint4 sl, sr;
        u32 tl, tr;
        dpf_children(path_s[i], path_t[i], key, i, sl, tl, sr, tr);
        const bool right = (index >> (root_depth - 1u - i)) & 1u;
        path_s[i + 1] = right ? sr : sl;
        path_t[i + 1] = (u8)(right ? tr : tl);
    }
}

__device__ __forceinline__ uint4 load_key_words(const u32* __restrict__ p) {
    return make_uint4(__ldg(p), __ldg(p + 1), __ldg(p + 2), __ldg(p + 3));
}

// ----------------------------------------------------------------------------------------
// Page loads: U pages x 2 lanes of 16 bytes per thread in flight; pages at or past `end`
// read as zero, which leaves the accumulators unchanged.

template <int U>
__device__ __forceinline__ void load_group(uint4 (&d)[U][LANES_PER_THREAD],
                                           const uint4* __restrict__ pages, const u64 p,
                                           const u64 end, const u32 tid) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const bool ok = p + u < end;
        const uint4* src = pages + (p + u) * LANES_PER_PAGE + tid;
#pragma unroll
        for (int i = 0; i < LANES_PER_THREAD; ++i) {
            d[u][i] = ok ? __ldg(src + i * SCAN_THREADS) : make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

// Local index one past the last page of the tile holding local page p, capped at `hi`.
__device__ __forceinline__ u64 tile_stop(const u64 p, const u64 first_page, const u32 tile_bits,
                                         const u64 hi) {
    const u64 stop = (((first_page + p) >> tile_bits) + 1ull) << tile_bits;
    const u64 local = stop - first_page;
    return local < hi ? local : hi;
}

// ----------------------------------------------------------------------------------------
// The fused scan. KG keys per block; U pages per load group.

template <int KG, int U>
__device__ __forceinline__ void scan_body(const uint4* __restrict__ pages, const u64 num_pages,
                                          const u64 first_page, const u32* __restrict__ keys,
                                          const u32 num_keys, const u32 domain_bits,
                                          const u32 tile_bits, const u32 num_groups,
                                          uint4* __restrict__ partial) {
    MG_DYNAMIC_SMEM(morphogen_smem);
    const u32 h = tile_bits;
    const u32 tile_pages = 1u << h;
    const u32 tile_mask = tile_pages - 1u;
    const u32 root_depth = domain_bits - h;  // depth of a tile's subtree root (D0)
    const u32 key_words = KEY_HEADER_WORDS + 4u * domain_bits;
    const u32 tid = threadIdx.x;

    // Shared memory: masks [tile_pages][KG] uint4 (the BFS works in place in this array),
    // path seeds [KG][PATH_SLOTS] uint4, then control bits: node t [tile_pages][KG] u8 and
    // path t [KG][PATH_SLOTS] u8. gpu_plan.py `scan_smem_bytes` gives the same size.
    uint4* masks = morphogen_smem;
    uint4* path_s = masks + (u64)tile_pages * KG;
    u8* node_t = reinterpret_cast<u8*>(path_s + KG * PATH_SLOTS);
    u8* path_t = node_t + (u64)tile_pages * KG;

    const u32 group = blockIdx.x % num_groups;
    const u32 page_block = blockIdx.x / num_groups;
    const u32 num_page_blocks = gridDim.x / num_groups;
    const u64 lo = num_pages * page_block / num_page_blocks;
    const u64 hi = num_pages * (page_block + 1ull) / num_page_blocks;

    uint4 acc[KG][LANES_PER_THREAD];
#pragma unroll
    for (int k = 0; k < KG; ++k) {
#pragma unroll
        for (int i = 0; i < LANES_PER_THREAD; ++i) acc[k][i] = make_uint4(0u, 0u, 0u, 0u);
    }

    if (lo < hi) {
        // Walker thread w < KG follows key group*KG + w; padding slots of the last group
        // repeat the last key and are never written out.
        const u32 my_key = min_u32(group * KG + (tid < KG ? tid : 0u), num_keys - 1u);
        const u32* wkey = keys + (u64)my_key * key_words;
        if (tid < KG) {
            path_s[tid * PATH_SLOTS] = load_key_words(wkey);
            path_t[tid * PATH_SLOTS] = (u8)(__ldg(wkey + 8) & 1u);
        }
        const u32 first_tile = (u32)((first_page + lo) >> h);
        const u32 last_tile = (u32)((first_page + hi - 1ull) >> h);

        u64 p = lo;  // first page of the next load group (block-uniform)

        for (u32 tile = first_tile;; ++tile) {
            // 1. Root-to-tile path: recompute only below the highest bit that changed.
            if (tid < KG) {
                advance_path(path_s + tid * PATH_SLOTS, path_t + tid * PATH_SLOTS, wkey,
                             root_depth, tile, tile == first_tile);
                masks[tid] = path_s[tid * PATH_SLOTS + root_depth];
                node_t[tid] = path_t[tid * PATH_SLOTS + root_depth];
            }
            __syncthreads();

            // 2. Breadth-first expansion in place: level l holds node n at slot n << (h - l).
            for (u32 l = 0; l < h; ++l) {
                const u32 stride = tile_pages >> l;
                const u32 half = stride >> 1;
                const u32 work = (u32)KG << l;
                const bool last = l + 1u == h;
                for (u32 w = tid; w < work; w += SCAN_THREADS) {
                    const u32 k = w % KG;  // consecutive threads take consecutive keys:
                    const u32 n = w / KG;  // their shared-memory accesses are adjacent
                    const u32* key =
                        keys + (u64)min_u32(group * KG + k, num_keys - 1u) * key_words;
                    const u32 slot = n * stride;
                    uint4 sl, sr;
                    u32 tl, tr;
                    dpf_children(masks[slot * KG + k], node_t[slot * KG + k], key,
                                 root_depth + l, sl, tl, sr, tr);
                    if (last) {  // leaves: mask = s XOR (final_cw if t)
                        const uint4 f = load_key_words(key + 4);
                        const u32 ol = 0u - tl, orr = 0u - tr;
                        sl.x ^= f.x & ol; sl.y ^= f.y & ol; sl.z ^= f.z & ol; sl.w ^= f.w & ol;
                        sr.x ^= f.x & orr; sr.y ^= f.y & orr; sr.z ^= f.z & orr;
                        sr.w ^= f.w & orr;
                    } else {
                        node_t[slot * KG + k] = (u8)tl;
                        node_t[(slot + half) * KG + k] = (u8)tr;
                    }
                    masks[slot * KG + k] = sl;
                    masks[(slot + half) * KG + k] = sr;
                }
                __syncthreads();
            }

            // 3. Scan the tile's pages in this block's range; the next group's loads are
            //    issued before this group's arithmetic.
            const u64 stop = tile_stop(p, first_page, h, hi);
            uint4 nxt[U][LANES_PER_THREAD];
            load_group<U>(nxt, pages, p, stop, tid);
            while (p < stop) {
                uint4 cur[U][LANES_PER_THREAD];
#pragma unroll
                for (int u = 0; u < U; ++u) {
#pragma unroll
                    for (int i = 0; i < LANES_PER_THREAD; ++i) cur[u][i] = nxt[u][i];
                }
                const u64 here = p;
                p = (p + U < stop) ? p + U : stop;
                if (p < stop) load_group<U>(nxt, pages, p, stop, tid);
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    // past `stop` the data is zero; the slot stays inside the tile's masks
                    const uint4* m = masks + (((u32)(first_page + here) + u) & tile_mask) * KG;
#pragma unroll
                    for (int k = 0; k < KG; ++k) {
                        const uint4 mk = m[k];
#pragma unroll
                        for (int i = 0; i < LANES_PER_THREAD; ++i) {
                            acc[k][i].x ^= cur[u][i].x & mk.x;
                            acc[k][i].y ^= cur[u][i].y & mk.y;
                            acc[k][i].z ^= cur[u][i].z & mk.z;
                            acc[k][i].w ^= cur[u][i].w & mk.w;
                        }
                    }
                }
            }
            if (tile == last_tile) break;
            __syncthreads();  // the next tile's expansion overwrites the masks read above
        }
    }

    // 4. This block's partial rows: every lane of every real key, written once.
#pragma unroll
    for (int k = 0; k < KG; ++k) {
        const u32 key = group * KG + k;
        if (key < num_keys) {
            uint4* row = partial + ((u64)page_block * num_keys + key) * LANES_PER_PAGE + tid;
#pragma unroll
            for (int i = 0; i < LANES_PER_THREAD; ++i) row[i * SCAN_THREADS] = acc[k][i];
        }
    }
}

// Register budget per variant: __launch_bounds__(128, MINB) caps registers at 65536/(128*MINB)
// so that MINB blocks fit per SM; the accumulators take KG*8 registers. nvcc_check fails the
// build on any spill.
#define MG_SCAN_KERNEL(KG, U, MINB)                                                           \
    extern "C" __global__ void __launch_bounds__(SCAN_THREADS, MINB) morphogen_scan_k##KG(    \
        const uint4* __restrict__ pages, const u64 num_pages, const u64 first_page,           \
        const u32* __restrict__ keys, const u32 num_keys, const u32 domain_bits,              \
        const u32 tile_bits, const u32 num_groups, uint4* __restrict__ partial) {             \
        scan_body<KG, U>(pages, num_pages, first_page, keys, num_keys, domain_bits,           \
                         tile_bits, num_groups, partial);                                     \
    }

MG_SCAN_KERNEL(1, 4, 4)
MG_SCAN_KERNEL(2, 4, 4)
MG_SCAN_KERNEL(3, 4, 4)
MG_SCAN_KERNEL(4, 4, 4)
MG_SCAN_KERNEL(6, 4, 3)
MG_SCAN_KERNEL(8, 2, 3)
MG_SCAN_KERNEL(12, 2, 2)
MG_SCAN_KERNEL(16, 2, 2)

// ----------------------------------------------------------------------------------------
// out[j] = XOR over b < num_partials of partial[b * row_lanes + j], for j < row_lanes
// (row_lanes = num_keys * 256). Block: 16 lanes x 16 slices of the partials; grid:
// ceil(row_lanes / 16). Every output lane is written, whatever was there before.
//   const uint4* partial   cupy uint8 array       uint4* out     cupy uint8 array
//   u32 num_partials       numpy.uint32           u32 row_lanes  numpy.uint32

extern "C" __global__ void __launch_bounds__(REDUCE_LANES * REDUCE_SLICES)
    morphogen_xor_reduce(const uint4* __restrict__ partial, uint4* __restrict__ out,
                         const u32 num_partials, const u32 row_lanes) {
    __shared__ uint4 slices[REDUCE_SLICES][REDUCE_LANES];
    const u32 lx = threadIdx.x % REDUCE_LANES;
    const u32 sy = threadIdx.x / REDUCE_LANES;
    const u32 lane = blockIdx.x * REDUCE_LANES + lx;
    uint4 a = make_uint4(0u, 0u, 0u, 0u), b = a;
    if (lane < row_lanes) {
        u32 j = sy;
        for (; j + REDUCE_SLICES < num_partials; j += 2 * REDUCE_SLICES) {
            const uint4 v = __ldg(partial + (u64)j * row_lanes + lane);
            const uint4 w = __ldg(partial + (u64)(j + REDUCE_SLICES) * row_lanes + lane);
            a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w;
            b.x ^= w.x; b.y ^= w.y; b.z ^= w.z; b.w ^= w.w;
        }
        if (j < num_partials) {
            const uint4 v = __ldg(partial + (u64)j * row_lanes + lane);
            a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w;
        }
    }
    a.x ^= b.x; a.y ^= b.y; a.z ^= b.z; a.w ^= b.w;
    slices[sy][lx] = a;
    __syncthreads();
    if (sy == 0 && lane < row_lanes) {
#pragma unroll
        for (int s = 1; s < REDUCE_SLICES; ++s) {
            const uint4 v = slices[s][lx];
            a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w;
        }
        out[lane] = a;
    }
}

// ----------------------------------------------------------------------------------------
// Plain vectorised read of n16 16-byte words (the card's read bandwidth, for the benchmark),
// eight loads in flight per thread; sink[global thread] = XOR of what the thread read, so
// the host can check the sum and the loads cannot be optimised away. Block: READ_BW_THREADS.
//   const uint4* data   cupy uint8 array      u64 n16   numpy.uint64
//   uint4* sink         cupy uint8 array of gridDim.x * READ_BW_THREADS * 16 bytes

extern "C" __global__ void __launch_bounds__(READ_BW_THREADS)
    morphogen_read_bw(const uint4* __restrict__ data, const u64 n16, uint4* __restrict__ sink) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    uint4 a = make_uint4(0u, 0u, 0u, 0u);
    for (; i + 7 * stride < n16; i += 8 * stride) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = __ldg(data + i + u * stride);
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            a.x ^= v[u].x; a.y ^= v[u].y; a.z ^= v[u].z; a.w ^= v[u].w;
        }
    }
    for (; i < n16; i += stride) {
        const uint4 v = __ldg(data + i);
        a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w;
    }
    sink[(u64)blockIdx.x * blockDim.x + threadIdx.x] = a;
}
