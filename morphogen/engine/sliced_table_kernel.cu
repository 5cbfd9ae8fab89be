// The tensor-core scan of a TABLE: a page range of the sliced copy starting and stopping
// anywhere, its pages numbered from the table's first page (gpu.py GpuShard.table_scanner).
//
// gpu_kernels.kernel_source() appends this file after sliced_scan_kernel.cu, whose scan body
// (sliced_scan_body<NT, PREFETCH, true>) runs it; here are the two steps that differ from a
// whole-shard scan and the kernels.
//
// Why a kernel of its own. Chunks are aligned in the matrix's page numbering (chunk C holds
// pages [256 C, 256 C + 256)); a key of a table evaluates leaf L = page - table.first_page, and
// its subtree t holds leaves [256 t, 256 t + 256). With shift = table.first_page mod 256, chunk
// position p holds leaf p - shift of subtree t (p >= shift) or leaf p - shift + 256 of subtree
// t - 1 (p < shift), t being the table subtree of the chunk (first_chunk + c: the host passes
// the subtree of its first chunk as first_chunk). So a chunk's masks are two subtrees' masks
// shifted, and consecutive chunks share a subtree: the kernel keeps the last subtree's masks
// (mt, transposed as the MMA reads them) beside the new one's (mt2), expands each subtree once
// (the same PRG work as a whole-shard scan, plus one subtree at a block's first chunk), and
// shifts the two into the chunk's B fragments with funnel shifts (about 64 shifts a thread per
// chunk). Leaves outside [leaf_lo, leaf_hi) get zero masks: the pages before and after the
// table in its first and last chunk (and pages of other tables there) add nothing.
//
// The shift, per key and bit position b: mt row (key, kw) word b holds the masks' bit b of the
// 32 leaves 64 (kw >> 1) + 2 j + (kw & 1), j = 0..31, so for one parity e = kw & 1 the four
// words kw = e, 2 + e, 4 + e, 6 + e are a 128-bit integer over m = leaf >> 1. With u = 256 -
// shift, chunk position 2 m + e holds X[2 m + e + u] of the 512 leaves X = (subtree t - 1,
// subtree t): the bits [a, a + 128) of the 256-bit integer (mt, mt2) of parity (e + u) & 1,
// a = (e + u) >> 1.
//
// Kernel arguments: those of morphogen_sliced_scan_n<NT> (sliced points at the table's first
// chunk, num_chunks counts its chunks), then
//   u32 shift       numpy.uint32   the chunk position of the table's leaf 256 k (its first page
//                                  mod 256, the matrix's chunks being aligned at page 0)
//   u64 leaf_lo     numpy.uint64   first leaf scanned (a shard's part of the table starts here)
//   u64 leaf_hi     numpy.uint64   one past the last leaf scanned

#ifndef SLICE_PAGES
#error "geometry #defines missing: compile morphogen.engine.gpu_kernels.kernel_source()"
#endif

// Steps 1-3 of sliced_scan_body for table subtree `subtree` (negative: none): its masks, zero
// outside the window, transposed into mt_out. Ends with a barrier; block-uniform. The block
// expands subtrees first_subtree, first_subtree + 1, ... in turn; the first live one (inside
// the window) computes its keys' paths from the root, the next ones only what changed.
template <int KG>
__device__ void table_subtree_masks(const long long subtree, const TableWindow& win,
                                    u32* mt_out, uint4* tree, u8* tree_t, uint4* path_s,
                                    u8* path_t, const u32* __restrict__ gkeys, const u32 nkeys,
                                    const u32 key_words, const u32 h, const u32 root_depth,
                                    const long long first_subtree) {
    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const long long first_leaf = subtree * (long long)SLICE_PAGES;
    const bool live = subtree >= 0 && (u64)first_leaf < win.leaf_hi &&
                      (u64)first_leaf + SLICE_PAGES > win.leaf_lo;
    if (!live) {
        for (u32 i = tid; i < nkeys * 8u * MT_STRIDE; i += SLICED_THREADS) mt_out[i] = 0u;
        __syncthreads();
        return;
    }
    // 1. Root-to-subtree path (incremental: live subtrees come in order, one apart).
    const long long window_first = (long long)(win.leaf_lo / SLICE_PAGES);
    const bool fresh = subtree == (first_subtree > window_first ? first_subtree : window_first);
    if (tid < nkeys) {
        const u32* wkey = gkeys + tid * key_words;
        advance_path(path_s + tid * PATH_SLOTS, path_t + tid * PATH_SLOTS, wkey, root_depth,
                     (u32)subtree, fresh);
        tree[tid] = path_s[tid * PATH_SLOTS + root_depth];
        tree_t[tid] = path_t[tid * PATH_SLOTS + root_depth];
    }
    __syncthreads();

    // 2. Levels 1 .. h-1 in place.
    for (u32 l = 0; l + 1u < h; ++l) {
        const u32 half = 1u << (h - 2u - l);
        const u32 work = nkeys << l;
        for (u32 w = tid; w < work; w += SLICED_THREADS) {
            const u32 k = w % nkeys;
            const u32 slot = (w / nkeys) * 2u * half;
            uint4 sl, sr;
            u32 tl, tr;
            dpf_children(tree[slot * KG + k], tree_t[slot * KG + k], gkeys + k * key_words,
                         root_depth + l, sl, tl, sr, tr);
            tree[slot * KG + k] = sl;
            tree_t[slot * KG + k] = (u8)tl;
            tree[(slot + half) * KG + k] = sr;
            tree_t[(slot + half) * KG + k] = (u8)tr;
        }
        __syncthreads();
    }

    // 3. Leaves, zero outside the window, transposed into K-words.
    const u32 level_nodes = 1u << (h - 1u);
    for (u32 task = warp; task < nkeys * 4u; task += SLICED_THREADS / 32u) {
        const u32 k = task >> 2, q = task & 3u;
        const u32 n = 32u * q + lane;
        uint4 left = make_uint4(0u, 0u, 0u, 0u), right = left;
        if (n < level_nodes) {
            const u32* key = gkeys + k * key_words;
            u32 tl, tr;
            dpf_children(tree[n * KG + k], tree_t[n * KG + k], key, root_depth + h - 1u, left,
                         tl, right, tr);
            const uint4 f = load_key_words(key + 4);
            const u64 leaf = (u64)first_leaf + 2u * n;
            const u32 ol = 0u - tl, orr = 0u - tr;
            const u32 kl = (leaf >= win.leaf_lo && leaf < win.leaf_hi) ? ~0u : 0u;
            const u32 kr = (leaf + 1u >= win.leaf_lo && leaf + 1u < win.leaf_hi) ? ~0u : 0u;
            left.x = (left.x ^ (f.x & ol)) & kl; left.y = (left.y ^ (f.y & ol)) & kl;
            left.z = (left.z ^ (f.z & ol)) & kl; left.w = (left.w ^ (f.w & ol)) & kl;
            right.x = (right.x ^ (f.x & orr)) & kr; right.y = (right.y ^ (f.y & orr)) & kr;
            right.z = (right.z ^ (f.z & orr)) & kr; right.w = (right.w ^ (f.w & orr)) & kr;
        }
        transpose_bits32x4(left, lane);
        transpose_bits32x4(right, lane);
        u32* row = mt_out + (k * 8u + 2u * q) * MT_STRIDE + lane;
        row[0] = left.x; row[32] = left.y; row[64] = left.z; row[96] = left.w;
        row += MT_STRIDE;
        row[0] = right.x; row[32] = right.y; row[64] = right.z; row[96] = right.w;
    }
    __syncthreads();
}

// The chunk's B fragments into `prev` from the masks of subtrees t - 1 (`prev`) and t (`cur`),
// as the header says. A thread owns (key, b) in both buffers, so it may write prev in place.
// The caller synchronizes before the MMAs read prev.
template <int KG>
__device__ void table_shift_masks(u32* prev, const u32* cur, const TableWindow& win,
                                  const u32 nkeys) {
    const u32 u = SLICE_PAGES - win.shift;  // 1..256
    constexpr u32 kBits = MT_STRIDE - 1u;    // bit positions of a page lane (128)
    for (u32 w = threadIdx.x; w < nkeys * kBits; w += SLICED_THREADS) {
        const u32 k = w / kBits, b = w % kBits;
        u32 out[2][4];
#pragma unroll
        for (u32 e = 0; e < 2u; ++e) {
            const u32 ep = (e + u) & 1u, a = (e + u) >> 1;
            const u32 q = a >> 5, r = a & 31u;
#pragma unroll
            for (u32 i = 0; i < 4u; ++i) {
                // words j and j + 1 of the 256-bit (prev, cur) of parity ep; j + 1 = 8 only
                // when r == 0, where it is not used
                const u32 j = i + q;
                const u32 lo = j < 4u ? prev[(k * 8u + 2u * j + ep) * MT_STRIDE + b]
                                      : cur[(k * 8u + 2u * (j - 4u) + ep) * MT_STRIDE + b];
                const u32 j1 = j + 1u;
                const u32 hi = j1 < 4u ? prev[(k * 8u + 2u * j1 + ep) * MT_STRIDE + b]
                               : j1 < 8u ? cur[(k * 8u + 2u * (j1 - 4u) + ep) * MT_STRIDE + b]
                                         : 0u;
                out[e][i] = r ? (lo >> r) | (hi << (32u - r)) : lo;
            }
        }
#pragma unroll
        for (u32 e = 0; e < 2u; ++e) {
#pragma unroll
            for (u32 i = 0; i < 4u; ++i) prev[(k * 8u + 2u * i + e) * MT_STRIDE + b] = out[e][i];
        }
    }
}

// Same registers and occupancy as the whole-shard kernels; twice their mt (sliced.py
// sliced_smem_bytes(nt, table=True)).
#define MG_SLICED_TABLE_KERNEL(NT, MINB, PREFETCH, NAME)                                      \
    extern "C" __global__ void __launch_bounds__(SLICED_THREADS, MINB)                        \
        NAME(const uint4* __restrict__ sliced, const u64 num_chunks, const u64 first_chunk,   \
             const u32* __restrict__ keys, const u32 num_keys, const u32 domain_bits,         \
             const u32 num_groups, uint4* __restrict__ partial, const u32 shift,              \
             const u64 leaf_lo, const u64 leaf_hi) {                                          \
        sliced_scan_body<NT, PREFETCH, true>(sliced, num_chunks, first_chunk, keys, num_keys, \
                                             domain_bits, num_groups, partial,                \
                                             TableWindow{shift, leaf_lo, leaf_hi});           \
    }

MG_SLICED_TABLE_KERNEL(1, 2, false, morphogen_sliced_table_n1)
MG_SLICED_TABLE_KERNEL(2, 1, false, morphogen_sliced_table_n2)
MG_SLICED_TABLE_KERNEL(2, 1, true, morphogen_sliced_table_n2_prefetch)
