// Tensor-core page scan over a bit-sliced copy of the pages (gpu.py, GpuEngine(kernel="sliced")).
//
// gpu_kernels.kernel_source() appends this file to scan_kernel.cu, whose PRG (prg_g), DPF step
// (dpf_children), key record layout and partial/reduce conventions it uses, after the generated
// #defines of the geometry (SLICE_PAGES, SLICE_U4, SLICE_THREADS, SLICED_THREADS,
// SLICED_TILE_BITS, SLICED_TREE_SLOTS, MT_STRIDE: sliced.py holds their values).
//
// Why. The fused scan of scan_kernel.cu spends one LOP3 per 32-bit page word per key; past about
// six keys the integer pipe, not HBM, bounds it (ncu on an H100: 64-72 % ALU, 8-26 % DRAM).
// Over GF(2) the scan is a matrix product, one per bit position b (0..127) of a 16-byte lane:
//
//     answer[key][lane][b] = parity( sum over pages p of mask_key(p)[b] * page_p[lane][b] )
//
// and `mma.sync ... .b1.b1.s32.and.popc` computes such sums on the tensor cores, at about 9.6x
// the AND-XOR rate of the integer pipe (bench/gpu/mma_rate.py on an H100, where it compiles to
// the native BMMA.168256.AND.POPC). Both operands need the pages along the reduction (K)
// dimension, so the pages are stored bit-sliced once, at load (morphogen_slice_pages), and each
// scan transposes only its masks, in registers.
//
// Sliced layout (sliced.py `slice_pages` is the same in NumPy; tests hold the two together):
//   * chunks of 256 pages aligned in the GLOBAL page numbering: chunk C holds global pages
//     [256 C, 256 C + 256); the shard's buffer starts at chunk first_page >> 8, and pages outside
//     the shard are zero (so they add nothing, whatever their masks);
//   * K order inside a chunk: K-word kw (0..7), bit j (0..31) is chunk page
//     64 * (kw >> 1) + 2 * j + (kw & 1) -- the order in which the DPF leaf step below hands
//     pages to warp lanes, so the masks need no reordering;
//   * a chunk is 65536 uint4; uint4 (b * 16 + G) * 32 + lane, lane = 4 g + tig (g 0..7,
//     tig 0..3), component r (x, y, z, w = 0..3) holds the 32 K-bits of K-word tig + 4 (r >> 1)
//     of page-lane 16 G + g + 8 (r & 1) at bit position b. That is the A fragment (a0..a3) of
//     mma.m16n8k256.row for rows = 16 page lanes: one 16-byte load per thread feeds one MMA.
//
// Scan (morphogen_sliced_scan_n<NT>): block = 8 warps, up to KG = 8 NT keys. Grid and partials
// as in scan_kernel.cu: block b serves key group b % num_groups over a contiguous run of chunks
// and writes one partial row per key; morphogen_xor_reduce folds the rows. Per chunk:
//   1. KG walker threads advance their key's root-to-chunk path (cached, ~2 PRG calls a chunk);
//   2. the block expands the chunk's subtree breadth-first in shared memory down to the level
//      above the leaves;
//   3. leaf step, one warp per (key, quarter): lane j expands node 32 q + j into chunk pages
//      64 q + 2 j (+1), corrects them into masks, and a 32x32 bit transpose (shuffles) turns the
//      lanes' masks into K-words: mt[key][kw][b], the B fragments of the MMA;
//   4. warp w multiplies bit positions b in [16 w, 16 w + 16) for all 16 page-lane groups:
//      one MMA per (b, G, n-tile) with C = 0, whose count parities (bit 0 of each s32) are
//      folded into per-thread parity words. Counts never leave the registers.
//      In the _prefetch kernel (the host's plan picks it: sliced.py PREFETCH_MAX_GROUPS) a warp
//      asks L2 for its first SLICED_PREFETCH_ROUNDS rounds of a chunk's A fragments before step
//      1, so they arrive while the masks are expanded, and in each round for the round that far
//      ahead.
// The parities are gathered through shared memory into natural answer rows at the end.

#ifndef SLICE_PAGES
#error "geometry #defines missing: compile morphogen.engine.gpu_kernels.kernel_source()"
#endif

// Lane j holds row j of a 32x32 bit matrix (bit c = column c) in each of v's four words;
// afterwards lane i holds column i (bit j = row j's bit i), word by word. Five butterfly steps:
// a step swaps the off-diagonal s x s blocks between lanes l and l ^ s.
__device__ __forceinline__ void transpose_bits32x4(uint4& v, const u32 lane) {
    const u32 keep_lo[5] = {0x0000FFFFu, 0x00FF00FFu, 0x0F0F0F0Fu, 0x33333333u, 0x55555555u};
#pragma unroll
    for (int i = 0; i < 5; ++i) {
        const u32 s = 16u >> i;
        const bool hi = (lane & s) != 0u;
        const u32 keep = hi ? ~keep_lo[i] : keep_lo[i];
        const u32 rot = hi ? 32u - s : s;  // the partner's bits land where `keep` is clear
        u32 p;
        p = __shfl_xor_sync(0xFFFFFFFFu, v.x, s);
        v.x = (v.x & keep) | (__funnelshift_l(p, p, rot) & ~keep);
        p = __shfl_xor_sync(0xFFFFFFFFu, v.y, s);
        v.y = (v.y & keep) | (__funnelshift_l(p, p, rot) & ~keep);
        p = __shfl_xor_sync(0xFFFFFFFFu, v.z, s);
        v.z = (v.z & keep) | (__funnelshift_l(p, p, rot) & ~keep);
        p = __shfl_xor_sync(0xFFFFFFFFu, v.w, s);
        v.w = (v.w & keep) | (__funnelshift_l(p, p, rot) & ~keep);
    }
}

// ----------------------------------------------------------------------------------------
// Natural pages -> sliced chunks, at load. One warp per (chunk, K-word, page lane): lane j
// reads page-lane `pl` of chunk page 64 (kw >> 1) + 2 j + (kw & 1); after the transpose lane
// i holds the K-word of bit position 32 w + i in word w.
//   const uint4* natural   cupy uint8 array, num_chunks * 256 pages in natural layout
//   u64 num_chunks         numpy.uint64
//   u32* sliced            cupy uint8 array, num_chunks * SLICE_U4 * 16 bytes
// Block: SLICE_THREADS; any grid (grid-stride over the num_chunks * 2048 warp tasks).

extern "C" __global__ void __launch_bounds__(SLICE_THREADS)
    morphogen_slice_pages(const uint4* __restrict__ natural, const u64 num_chunks,
                          u32* __restrict__ sliced) {
    const u32 lane = threadIdx.x & 31u;
    const u64 warps = (u64)gridDim.x * (blockDim.x >> 5);
    const u64 tasks = num_chunks * 2048ull;
    for (u64 t = (u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); t < tasks;
         t += warps) {
        const u64 chunk = t >> 11;
        const u32 kw = (u32)(t >> 8) & 7u;
        const u32 pl = (u32)t & 255u;
        const u32 page = 64u * (kw >> 1) + 2u * lane + (kw & 1u);
        uint4 v = __ldg(natural + (chunk * SLICE_PAGES + page) * LANES_PER_PAGE + pl);
        transpose_bits32x4(v, lane);
        const u32 g = pl & 7u, row_hi = (pl >> 3) & 1u, group = pl >> 4;
        const u32 r = row_hi + 2u * (kw >> 2);
        u32* out = sliced + chunk * (SLICE_U4 * 4ull) + (4u * g + (kw & 3u)) * 4u + r;
        const u32 words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const u32 b = 32u * w + lane;
            out[(b * 16u + group) * 128u] = words[w];
        }
    }
}

// ----------------------------------------------------------------------------------------
// The scan.

// d = popc-sums of (a AND b) over K = 256: rows = 16 page lanes, columns = 8 keys, C = 0.
__device__ __forceinline__ void mma_and_popc(u32& d0, u32& d1, u32& d2, u32& d3, const uint4 a,
                                             const u32 b0, const u32 b1) {
#ifdef MORPHOGEN_HOST_EMULATION  // tests/unit/cuda_emu: the same product, as a warp collective
    emu_mma_and_popc(d0, d1, d2, d3, a, b0, b1);
#else
    asm("mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
        : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3)
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "r"(0u));
#endif
}

// The count parities of one MMA (D components d0..d3) into the two accumulator words of its
// (n-tile, G), for bit position bl of the warp's 16 (a constant once the caller's loop is
// unrolled); parity_bits() reads them back.
// SLICED_FOLD_IMAD: acc[0] bit BL holds component 0's parity, bit 16 + BL component 1's; acc[1]
// components 2 and 3. A count is at most 256, so d0 + (d1 << 16) is exact, and two IMADs (FMA
// pipe) build each word, leaving one LOP3 a word to the integer pipe that the PRG saturates.
// Otherwise: three byte permutes gather the four low bytes, a shift and a LOP3 place them; byte
// r of acc[bl >> 3] holds component r at bit bl & 7 (four integer-pipe instructions an MMA).
__device__ __forceinline__ void fold_parities(u32 (&acc)[2], const int bl, const u32 d0,
                                              const u32 d1, const u32 d2, const u32 d3) {
#if SLICED_FOLD_IMAD
    const u32 keep = 0x00010001u << bl;
    acc[0] ^= (d0 * (1u << bl) + d1 * (1u << (16 + bl))) & keep;
    acc[1] ^= (d2 * (1u << bl) + d3 * (1u << (16 + bl))) & keep;
#else
    const u32 y = __byte_perm(__byte_perm(d0, d1, 0x0040u), __byte_perm(d2, d3, 0x0040u),
                              0x5410u);
    acc[bl >> 3] ^= (y << (bl & 7)) & (0x01010101u << (bl & 7));
#endif
}

// The 16 parities of D component r (bit bl = the warp's bit position bl) from fold_parities'
// words.
__device__ __forceinline__ u32 parity_bits(const u32 (&acc)[2], const int r) {
#if SLICED_FOLD_IMAD
    return (acc[r >> 1] >> (16 * (r & 1))) & 0xFFFFu;
#else
    return ((acc[0] >> (8 * r)) & 0xFFu) | (((acc[1] >> (8 * r)) & 0xFFu) << 8);
#endif
}

// L2 prefetch of `lines` 128-byte lines from p (lines a multiple of 32: each lane asks for
// every 32nd), or with SLICED_PREFETCH_BULK one bulk prefetch by lane 0.
__device__ __forceinline__ void prefetch_l2(const uint4* p, const u32 lines, const u32 lane) {
#if defined(MORPHOGEN_HOST_EMULATION)  // a hint only: no answer depends on it
    (void)p; (void)lines; (void)lane;
#elif SLICED_PREFETCH_BULK
    if (lane == 0u) {
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(lines * 128u)
                     : "memory");
    }
#else
    const char* base = reinterpret_cast<const char*>(p);
    for (u32 i = lane; i < lines; i += 32u) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(base + 128ull * i));
    }
#endif
}

// A fragments of one bit-position round of a warp (16 G x 32 lanes: 8 KiB), in uint4 and lines.
constexpr u32 kRoundU4 = SLICE_U4 / 128u;
constexpr u32 kRoundLines = kRoundU4 * 16u / 128u;

// Dynamic shared memory of one block (sliced.py `sliced_smem_bytes` gives the same):
//   tree   uint4 [SLICED_TREE_SLOTS][KG]   level l node n at slot n << (h - 1 - l)
//   path_s uint4 [KG][PATH_SLOTS]
//   mt     u32   [KG * 8][MT_STRIDE]       transposed masks; at the end, the answer rows
//   tree_t u8    [SLICED_TREE_SLOTS][KG]
//   path_t u8    [KG][PATH_SLOTS]
// The table scan's half (sliced_table_kernel.cu): one subtree's masks into an mt buffer, and
// the shift of two subtrees' masks onto a chunk's pages.
struct TableWindow {
    u32 shift;        // chunk position of a subtree's leaf 0 (the table's first page mod 256)
    u64 leaf_lo;      // leaves (table pages) scanned: [leaf_lo, leaf_hi); others are zero
    u64 leaf_hi;
};
template <int KG>
__device__ void table_subtree_masks(long long subtree, const TableWindow& win, u32* mt_out,
                                    uint4* tree, u8* tree_t, uint4* path_s, u8* path_t,
                                    const u32* __restrict__ gkeys, u32 nkeys, u32 key_words,
                                    u32 h, u32 root_depth, long long first_subtree);
template <int KG>
__device__ void table_shift_masks(u32* prev, const u32* cur, const TableWindow& win, u32 nkeys);

template <int NT, bool PREFETCH, bool TABLE = false>
__device__ __forceinline__ void sliced_scan_body(const uint4* __restrict__ sliced,
                                                 const u64 num_chunks, const u64 first_chunk,
                                                 const u32* __restrict__ keys, const u32 num_keys,
                                                 const u32 domain_bits, const u32 num_groups,
                                                 uint4* __restrict__ partial,
                                                 const TableWindow win = TableWindow{0u, 0ull,
                                                                                     0ull}) {
    constexpr u32 KG = 8 * NT;
    MG_DYNAMIC_SMEM(morphogen_smem);
    uint4* tree = morphogen_smem;
    uint4* path_s = tree + SLICED_TREE_SLOTS * KG;
    u32* mt = reinterpret_cast<u32*>(path_s + KG * PATH_SLOTS);
    // a table scan keeps two subtrees' masks, in mt and after it, their roles swapping each
    // chunk: mt below is the one the chunk's MMAs read
    u32* const mt_base = mt;
    u8* tree_t = reinterpret_cast<u8*>(mt + (TABLE ? 2 : 1) * KG * 8 * MT_STRIDE);
    u8* path_t = tree_t + SLICED_TREE_SLOTS * KG;

    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const u32 g = lane >> 2, tig = lane & 3u;
    const u32 h = min_u32(domain_bits, SLICED_TILE_BITS);
    const u32 root_depth = domain_bits - h;  // depth of a chunk's subtree root
    const u32 key_words = KEY_HEADER_WORDS + 4u * domain_bits;
    const u32 group = blockIdx.x % num_groups;
    const u32 page_block = blockIdx.x / num_groups;
    const u32 num_page_blocks = gridDim.x / num_groups;
    // groups split the keys evenly, so every block has the same PRG work
    const u32 key0 = (u32)((u64)num_keys * group / num_groups);
    const u32 nkeys = (u32)((u64)num_keys * (group + 1u) / num_groups) - key0;
    const u64 lo = num_chunks * page_block / num_page_blocks;
    const u64 hi = num_chunks * (page_block + 1ull) / num_page_blocks;
    const u32* gkeys = keys + (u64)key0 * key_words;

    // acc[nt][G]: the parities of D components 0..3 of the MMAs for bit positions 16 warp + bl,
    // page-lane group G, n-tile nt, laid out as fold_parities says.
    u32 acc[NT][16][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int G = 0; G < 16; ++G) acc[nt][G][0] = acc[nt][G][1] = 0u;
    }

    if (lo < hi && tid < nkeys) {
        const u32* wkey = gkeys + tid * key_words;
        path_s[tid * PATH_SLOTS] = load_key_words(wkey);
        path_t[tid * PATH_SLOTS] = (u8)(__ldg(wkey + 8) & 1u);
    }
    for (u64 c = lo; c < hi; ++c) {
        const u32 chunk = (u32)(first_chunk + c);  // the subtree root's index at root_depth
        if (PREFETCH) {  // the head of this warp's share, while the masks expand
            prefetch_l2(sliced + c * SLICE_U4 + 16u * warp * kRoundU4,
                        SLICED_PREFETCH_ROUNDS * kRoundLines, lane);
        }
        if (TABLE) {
            // Chunk c holds leaves of table subtrees first_chunk + c - 1 (positions below
            // win.shift) and first_chunk + c: expand the latter into mt2 (the former is in mt,
            // from the chunk before, or expanded now at the block's first chunk), then shift
            // both into mt, the B fragments of this chunk. mt2 becomes the next chunk's mt.
            const long long t = (long long)(first_chunk + c);
            const u32 odd = (u32)(c - lo) & 1u;
            mt = mt_base + odd * (KG * 8 * MT_STRIDE);
            u32* const mt2 = mt_base + (odd ^ 1u) * (KG * 8 * MT_STRIDE);
            const long long t0 = (long long)(first_chunk + lo) - 1;  // the block's first
            if (c == lo) {
                table_subtree_masks<KG>(t - 1, win, mt, tree, tree_t, path_s, path_t, gkeys,
                                        nkeys, key_words, h, root_depth, t0);
            }
            table_subtree_masks<KG>(t, win, mt2, tree, tree_t, path_s, path_t, gkeys, nkeys,
                                    key_words, h, root_depth, t0);
            table_shift_masks<KG>(mt, mt2, win, nkeys);
            __syncthreads();
        } else {
            // 1. Root-to-chunk path: recompute only below the highest bit that changed.
            if (tid < nkeys) {
                const u32* wkey = gkeys + tid * key_words;
                advance_path(path_s + tid * PATH_SLOTS, path_t + tid * PATH_SLOTS, wkey,
                             root_depth, chunk, c == lo);
                tree[tid] = path_s[tid * PATH_SLOTS + root_depth];
                tree_t[tid] = path_t[tid * PATH_SLOTS + root_depth];
            }
            __syncthreads();

            // 2. Levels 1 .. h-1 in place; consecutive threads take consecutive keys.
            for (u32 l = 0; l + 1u < h; ++l) {
                const u32 half = 1u << (h - 2u - l);
                const u32 work = nkeys << l;
                for (u32 w = tid; w < work; w += SLICED_THREADS) {
                    const u32 k = w % nkeys;
                    const u32 slot = (w / nkeys) * 2u * half;
                    uint4 sl, sr;
                    u32 tl, tr;
                    dpf_children(tree[slot * KG + k], tree_t[slot * KG + k],
                                 gkeys + k * key_words, root_depth + l, sl, tl, sr, tr);
                    tree[slot * KG + k] = sl;
                    tree_t[slot * KG + k] = (u8)tl;
                    tree[(slot + half) * KG + k] = sr;
                    tree_t[(slot + half) * KG + k] = (u8)tr;
                }
                __syncthreads();
            }

            // 3. Leaves and their transposition into B fragments.
            const u32 level_nodes = 1u << (h - 1u);
            for (u32 task = warp; task < nkeys * 4u; task += SLICED_THREADS / 32u) {
                const u32 k = task >> 2, q = task & 3u;
                const u32 n = 32u * q + lane;
                uint4 left = make_uint4(0u, 0u, 0u, 0u), right = left;
                if (n < level_nodes) {  // a domain under 256 pages has fewer leaves: the rest 0
                    const u32* key = gkeys + k * key_words;
                    u32 tl, tr;
                    dpf_children(tree[n * KG + k], tree_t[n * KG + k], key, root_depth + h - 1u,
                                 left, tl, right, tr);
                    const uint4 f = load_key_words(key + 4);
                    const u32 ol = 0u - tl, orr = 0u - tr;
                    left.x ^= f.x & ol; left.y ^= f.y & ol; left.z ^= f.z & ol;
                    left.w ^= f.w & ol;
                    right.x ^= f.x & orr; right.y ^= f.y & orr; right.z ^= f.z & orr;
                    right.w ^= f.w & orr;
                }
                transpose_bits32x4(left, lane);
                transpose_bits32x4(right, lane);
                u32* row = mt + (k * 8u + 2u * q) * MT_STRIDE + lane;
                row[0] = left.x; row[32] = left.y; row[64] = left.z; row[96] = left.w;
                row += MT_STRIDE;
                row[0] = right.x; row[32] = right.y; row[64] = right.z; row[96] = right.w;
            }
            __syncthreads();
        }

        // 4. Tensor-core AND-popc over this chunk; parities folded into acc.
        const uint4* a_base = sliced + c * SLICE_U4 + lane;
#pragma unroll
        for (int bl = 0; bl < 16; ++bl) {
            const u32 b = 16u * warp + bl;
            if (PREFETCH && bl + SLICED_PREFETCH_ROUNDS < 16) {
                prefetch_l2(a_base - lane + (b + SLICED_PREFETCH_ROUNDS) * kRoundU4, kRoundLines,
                            lane);
            }
            u32 b0[NT], b1[NT];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const u32 ks = 8u * nt + g;
                const bool real = ks < nkeys;  // absent keys multiply as zero columns
                b0[nt] = real ? mt[(ks * 8u + tig) * MT_STRIDE + b] : 0u;
                b1[nt] = real ? mt[(ks * 8u + tig + 4u) * MT_STRIDE + b] : 0u;
            }
#pragma unroll
            for (int G = 0; G < 16; ++G) {
                const uint4 a = __ldg(a_base + (b * 16u + G) * 32u);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    if (nt > 0 && nkeys <= 8u * nt) continue;  // block-uniform: warps agree
                    u32 d0, d1, d2, d3;
                    mma_and_popc(d0, d1, d2, d3, a, b0[nt], b1[nt]);
                    fold_parities(acc[nt][G], bl, d0, d1, d2, d3);
                }
            }
        }
        // the next chunk's leaf step rewrites mt only after the barrier in its step 1
        if (TABLE) {
            __syncthreads();  // every warp is done with mt before the next subtree lands there
        }
    }

    // 5. Answer rows: thread (warp, g, tig) owns half-word `warp` (bit positions 16 warp ..
    //    16 warp + 15) of every lane it multiplied, for keys 8 nt + 2 tig (+1).
    __syncthreads();
    unsigned short* rows16 = reinterpret_cast<unsigned short*>(mt);  // [KG][256 lanes][8]
    // (a table scan's mt is either buffer, each of which holds the rows)
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
    const uint4* rows = reinterpret_cast<const uint4*>(mt);
    for (u32 i = tid; i < nkeys * LANES_PER_PAGE; i += SLICED_THREADS) {
        partial[((u64)page_block * num_keys + key0) * LANES_PER_PAGE + i] = rows[i];
    }
}

// Registers: acc takes 32 NT, and the unrolled (b, G) loop keeps 16 A fragments in flight; n1
// fits 128 registers (two blocks per SM), n2 needs about 240 (one). nvcc_check fails any spill.
#define MG_SLICED_KERNEL(NT, MINB, PREFETCH, NAME)                                            \
    extern "C" __global__ void __launch_bounds__(SLICED_THREADS, MINB)                        \
        NAME(const uint4* __restrict__ sliced, const u64 num_chunks, const u64 first_chunk,   \
             const u32* __restrict__ keys, const u32 num_keys, const u32 domain_bits,         \
             const u32 num_groups, uint4* __restrict__ partial) {                             \
        sliced_scan_body<NT, PREFETCH>(sliced, num_chunks, first_chunk, keys, num_keys,       \
                                       domain_bits, num_groups, partial);                     \
    }

MG_SLICED_KERNEL(1, 2, false, morphogen_sliced_scan_n1)
MG_SLICED_KERNEL(2, 1, false, morphogen_sliced_scan_n2)
MG_SLICED_KERNEL(2, 1, true, morphogen_sliced_scan_n2_prefetch)
