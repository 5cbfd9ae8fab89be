// Packed-key scan over the bit-sliced copy of the pages (gpu.py, GpuEngine(kernel="sliced");
// docs/packed-keys.md, docs/gpu.md "Packed keys").
//
// gpu_kernels.kernel_source() appends this file after sliced_scan_kernel.cu, whose MMA
// (mma_and_popc), parity folding, L2 prefetch and answer-row gathering conventions it uses, and
// scan_kernel.cu's PRG and DPF step. The v1 kernels are untouched: this file only adds kernels.
//
// The sliced scan multiplies, per bit position b of a page lane, the chunk's 256 pages (K) by
// the keys' masks at b: B[k][b] = bit b of key k's 16-byte mask of each page. A packed key's
// mask of a page is all ones or all zeros, so B is the same for every b: the key's 256
// selection bits of the chunk, in the layout's K order. They are the MMA's key operand as
// they are: no subtree expansion, no transposition, one 8-word row per key and chunk instead
// of 8 x 128 words. Per chunk and key that costs two or three leaves (one PRG call each along
// a cached path, on threads of their own) against a v1 key's 255-node expansion.
//
// Index of a chunk position: the kernel's chunk c (of the view it is given), position pos, is
// key index first_index + 256 c + pos - offset, selected where that index is in
// [idx_lo, idx_hi) (elsewhere its bit is 0, so pages outside a table's range or the shard
// add nothing). A whole shard passes the view from its first chunk, first_index = 256 x that
// chunk, offset 0; a table the view from the chunk holding the range's first page, first_index
// = the range's first key index, offset = that page's position in its chunk. The 256 bits start
// at index base = first_index + 256 c - offset, so they are bits [sh, sh + 256) of leaves L0,
// L0 + 1, L0 + 2 (L0 = floor(base / 128), sh = base - 128 L0): three leaves where sh > 0, two
// where it is 0.
//
// Block (SLICED_THREADS = 8 warps) and grid as morphogen_sliced_scan_n<NT>: up to KG = 8 NT
// keys a block, blocks over contiguous runs of chunks, partial rows reduced by
// morphogen_xor_reduce. Per chunk:
//   1. leaf walkers: thread 32 s + k (s < 3, k < nkeys) keeps key k's cached path to leaf
//      L0 + s, moved there from where it was (consecutive chunks: 2 leaves on, about two PRG
//      calls), and writes the corrected leaf to shared memory;
//   2. thread (k, q) (q < 4) shifts the leaves' bits to the chunk, masks the window and
//      unzips pages 64 q .. 64 q + 63 into K-words 2 q (even pages) and 2 q + 1 (odd pages);
//   3. the MMAs of sliced_scan_body's step 4, each warp's B fragments loaded once a chunk.
//
// Kernel arguments:
//   const uint4* sliced   u64 num_chunks   u64 first_index   const u32* keys (records of
//   key_words(levels))   u32 num_keys   u32 levels   u32 num_groups   uint4* partial
//   u32 offset   u64 idx_lo   u64 idx_hi

#ifndef SLICE_PAGES
#error "geometry #defines missing: compile morphogen.engine.gpu_kernels.kernel_source()"
#endif

// Leaves a chunk's 256 selection bits can span.
#define MG_CHUNK_LEAVES 3

// The even (`even`) and odd (`odd`) bits of the 64-bit x, each compacted into 32 bits.
__device__ __forceinline__ void unzip_bits64(const u64 x, u32& even, u32& odd) {
    u64 e = x & 0x5555555555555555ull, o = (x >> 1) & 0x5555555555555555ull;
    e = (e | (e >> 1)) & 0x3333333333333333ull;
    o = (o | (o >> 1)) & 0x3333333333333333ull;
    e = (e | (e >> 2)) & 0x0F0F0F0F0F0F0F0Full;
    o = (o | (o >> 2)) & 0x0F0F0F0F0F0F0F0Full;
    e = (e | (e >> 4)) & 0x00FF00FF00FF00FFull;
    o = (o | (o >> 4)) & 0x00FF00FF00FF00FFull;
    e = (e | (e >> 8)) & 0x0000FFFF0000FFFFull;
    o = (o | (o >> 8)) & 0x0000FFFF0000FFFFull;
    even = (u32)((e | (e >> 16)) & 0xFFFFFFFFull);
    odd = (u32)((o | (o >> 16)) & 0xFFFFFFFFull);
}

// A key's cached path moved from leaf `from_index` (valid when `have`) to leaf `index` at depth
// `levels`: only the levels below the highest bit in which the two differ are recomputed.
__device__ __forceinline__ void move_path(uint4* path_s, u8* path_t, const u32* __restrict__ key,
                                          const u32 levels, const u32 index,
                                          const u32 from_index, const bool have) {
    u32 from = 0;
    if (have) {
        if (index == from_index) return;
        from = levels - (32u - __clz(index ^ from_index));
    }
    for (u32 i = from; i < levels; ++i) {
        uint4 sl, sr;
        u32 tl, tr;
        dpf_children(path_s[i], path_t[i], key, i, sl, tl, sr, tr);
        const bool right = (index >> (levels - 1u - i)) & 1u;
        path_s[i + 1] = right ? sr : sl;
        path_t[i + 1] = (u8)(right ? tr : tl);
    }
}

// Dynamic shared memory (sliced.py `sliced_packed_smem_bytes` gives the same):
//   rows    u32   [KG][LANES_PER_PAGE][4]   the answer rows at the end; sel (u32 [KG][8]) and
//                                           leaves (uint4 [KG][3]) before them, in its head
//   path_s  uint4 [3][KG][PATH_SLOTS]
//   path_t  u8    [3][KG][PATH_SLOTS]
//   walk_at u32   [3][KG]                   the leaf each path reached (~0u: none yet); here,
//                                           not in registers, which the MMA loop needs all of
template <int NT, bool PREFETCH>
__device__ __forceinline__ void sliced_packed_body(
    const uint4* __restrict__ sliced, const u64 num_chunks, const u64 first_index,
    const u32* __restrict__ keys, const u32 num_keys, const u32 levels, const u32 num_groups,
    uint4* __restrict__ partial, const u32 offset, const u64 idx_lo, const u64 idx_hi) {
    constexpr u32 KG = 8 * NT;
    MG_DYNAMIC_SMEM(morphogen_smem);
    uint4* rows_area = morphogen_smem;
    uint4* leaves = rows_area;                                          // [KG][3]
    u32* sel = reinterpret_cast<u32*>(leaves + KG * MG_CHUNK_LEAVES);   // [KG][8]
    uint4* path_s = rows_area + KG * LANES_PER_PAGE;                    // [3][KG][PATH_SLOTS]
    u8* path_t = reinterpret_cast<u8*>(path_s + MG_CHUNK_LEAVES * KG * PATH_SLOTS);
    u32* walk_at = reinterpret_cast<u32*>(path_t + MG_CHUNK_LEAVES * KG * PATH_SLOTS);

    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const u32 g = lane >> 2, tig = lane & 3u;
    const u32 key_words = KEY_HEADER_WORDS + 4u * levels;
    const u32 group = blockIdx.x % num_groups;
    const u32 page_block = blockIdx.x / num_groups;
    const u32 num_page_blocks = gridDim.x / num_groups;
    const u32 key0 = (u32)((u64)num_keys * group / num_groups);
    const u32 nkeys = (u32)((u64)num_keys * (group + 1u) / num_groups) - key0;
    const u64 lo = num_chunks * page_block / num_page_blocks;
    const u64 hi = num_chunks * (page_block + 1ull) / num_page_blocks;
    const u32* gkeys = keys + (u64)key0 * key_words;
    const long long num_leaves = 1ll << levels;

    // Walker (slot warp, key lane): its path from the root, no leaf reached yet.
    const bool walker = warp < MG_CHUNK_LEAVES && lane < nkeys;
    if (walker && lo < hi) {
        const u32* wkey = gkeys + lane * key_words;
        const u32 wpath = (warp * KG + lane) * PATH_SLOTS;
        path_s[wpath] = load_key_words(wkey);
        path_t[wpath] = (u8)(__ldg(wkey + 8) & 1u);
        walk_at[warp * KG + lane] = ~0u;
    }

    u32 acc[NT][16][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int G = 0; G < 16; ++G) acc[nt][G][0] = acc[nt][G][1] = 0u;
    }

    for (u64 c = lo; c < hi; ++c) {
        if (PREFETCH) {
            prefetch_l2(sliced + c * SLICE_U4 + 16u * warp * kRoundU4,
                        SLICED_PREFETCH_ROUNDS * kRoundLines, lane);
        }
        // base >= -255: a table's part starts at most 255 positions into its first chunk
        const long long base = (long long)first_index + 256ll * (long long)c - (long long)offset;
        const long long leaf0 = ((base + 256ll) >> 7) - 2ll;
        const u32 sh = (u32)(base - 128ll * leaf0);

        // 1. Leaves L0 .. L0 + 2 (outside the domain: zero, never walked).
        if (walker) {
            const u32* wkey = gkeys + lane * key_words;
            const u32 wpath = (warp * KG + lane) * PATH_SLOTS;
            const long long index = leaf0 + (long long)warp;
            uint4 leaf = make_uint4(0u, 0u, 0u, 0u);
            if (index >= 0 && index < num_leaves && (warp < 2u || sh != 0u)) {
                const u32 at = walk_at[warp * KG + lane];
                move_path(path_s + wpath, path_t + wpath, wkey, levels, (u32)index, at,
                          at != ~0u);
                walk_at[warp * KG + lane] = (u32)index;
                const uint4 f = load_key_words(wkey + 4);
                const u32 on = 0u - (u32)path_t[wpath + levels];
                leaf = path_s[wpath + levels];
                leaf.x ^= f.x & on; leaf.y ^= f.y & on; leaf.z ^= f.z & on; leaf.w ^= f.w & on;
            }
            leaves[lane * MG_CHUNK_LEAVES + warp] = leaf;
        }
        __syncthreads();

        // 2. The chunk's selection as K-words: thread (k, q) builds words 2 q and 2 q + 1.
        if (tid < 4u * nkeys) {
            const u32 k = tid >> 2, q = tid & 3u;
            const u32* w = reinterpret_cast<const u32*>(leaves + k * MG_CHUNK_LEAVES);
            u32 half[2];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const u32 bit = sh + 64u * q + 32u * (u32)j;  // < 384
                const u32 i = bit >> 5, r = bit & 31u;
                const u64 pair = (u64)w[i] | ((i + 1u < 12u ? (u64)w[i + 1u] : 0ull) << 32);
                u32 v = (u32)(pair >> r);
                // positions 64 q + 32 j + (0..31) outside [idx_lo, idx_hi) select nothing
                const long long p0 = base + 64ll * q + 32ll * j;
                const long long a = (long long)idx_lo - p0, b = (long long)idx_hi - p0;
                const u32 keep_from = a <= 0 ? 0xFFFFFFFFu : a >= 32 ? 0u : ~((1u << a) - 1u);
                const u32 keep_to = b >= 32 ? 0xFFFFFFFFu : b <= 0 ? 0u : (1u << b) - 1u;
                half[j] = v & keep_from & keep_to;
            }
            u32 even, odd;
            unzip_bits64((u64)half[0] | ((u64)half[1] << 32), even, odd);
            sel[k * 8u + 2u * q] = even;
            sel[k * 8u + 2u * q + 1u] = odd;
        }
        __syncthreads();

        // 3. Tensor-core AND-popc over this chunk, the same B fragments for every bit position.
        u32 b0[NT], b1[NT];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const u32 ks = 8u * nt + g;
            const bool real = ks < nkeys;
            b0[nt] = real ? sel[ks * 8u + tig] : 0u;
            b1[nt] = real ? sel[ks * 8u + tig + 4u] : 0u;
        }
        const uint4* a_base = sliced + c * SLICE_U4 + lane;
#pragma unroll
        for (int bl = 0; bl < 16; ++bl) {
            const u32 b = 16u * warp + bl;
            if (PREFETCH && bl + SLICED_PREFETCH_ROUNDS < 16) {
                prefetch_l2(a_base - lane + (b + SLICED_PREFETCH_ROUNDS) * kRoundU4, kRoundLines,
                            lane);
            }
#pragma unroll
            for (int G = 0; G < 16; ++G) {
                const uint4 a = __ldg(a_base + (b * 16u + G) * 32u);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    if (nt > 0 && nkeys <= 8u * nt) continue;  // block-uniform
                    u32 d0, d1, d2, d3;
                    mma_and_popc(d0, d1, d2, d3, a, b0[nt], b1[nt]);
                    fold_parities(acc[nt][G], bl, d0, d1, d2, d3);
                }
            }
        }
        __syncthreads();  // every warp has its B fragments before the next chunk's leaves land
    }

    // 4. Answer rows, gathered as sliced_scan_body's step 5 does.
    __syncthreads();
    unsigned short* rows16 = reinterpret_cast<unsigned short*>(rows_area);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int G = 0; G < 16; ++G) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const u32 ks = 8u * nt + 2u * tig + (r & 1);
                const u32 plane = 16u * G + g + 8u * (r >> 1);
                const u32 bits = parity_bits(acc[nt][G], r);
                rows16[(ks * LANES_PER_PAGE + plane) * 8u + warp] = (unsigned short)bits;
            }
        }
    }
    __syncthreads();
    for (u32 i = tid; i < nkeys * LANES_PER_PAGE; i += SLICED_THREADS) {
        partial[((u64)page_block * num_keys + key0) * LANES_PER_PAGE + i] = rows_area[i];
    }
}

#define MG_SLICED_PACKED_KERNEL(NT, MINB, PREFETCH, NAME)                                     \
    extern "C" __global__ void __launch_bounds__(SLICED_THREADS, MINB)                        \
        NAME(const uint4* __restrict__ sliced, const u64 num_chunks, const u64 first_index,   \
             const u32* __restrict__ keys, const u32 num_keys, const u32 levels,              \
             const u32 num_groups, uint4* __restrict__ partial, const u32 offset,             \
             const u64 idx_lo, const u64 idx_hi) {                                            \
        sliced_packed_body<NT, PREFETCH>(sliced, num_chunks, first_index, keys, num_keys,     \
                                         levels, num_groups, partial, offset, idx_lo,         \
                                         idx_hi);                                             \
    }

MG_SLICED_PACKED_KERNEL(1, 2, false, morphogen_sliced_packed_n1)
MG_SLICED_PACKED_KERNEL(2, 1, false, morphogen_sliced_packed_n2)
MG_SLICED_PACKED_KERNEL(2, 1, true, morphogen_sliced_packed_n2_prefetch)
