// Packed-key page scan over pages as stored (the fused layout; gpu.py, docs/packed-keys.md).
//
// gpu_kernels.kernel_source() appends this file to scan_kernel.cu, whose PRG (prg_g), DPF step
// (dpf_children), cached path (advance_path), page loads (load_group, tile_stop), key record
// layout and partial/reduce conventions it uses. The v1 kernels are untouched: this file only
// adds kernels.
//
// A packed key's tree has `levels` = d - 7 levels and its leaf j holds the selection bits of
// pages [128 j, 128 j + 128) (bit p & 127, LSB first within little-endian 32-bit words, which
// is the spec's little-endian 128-bit integer). A page's mask for a key is then all ones or
// all zeros, and the scan is a conditional XOR of whole pages:
//
//     partial[pb][k] = XOR over the block's pages p with bit_k(first_index + p) of page_p
//
// Same grid, work split, accumulators, partial rows and reduce as morphogen_scan_k<KG>, with
// the tile counted in leaves: a tile is 2^tile_bits leaves (2^(tile_bits + 7) pages) aligned
// in the key's numbering. Per tile the walkers advance their key's cached path to the tile's
// root (depth levels - tile_bits), the block expands the tile's subtree breadth-first in shared
// memory (one PRG call per node: 2^tile_bits per key per tile, 1/128 of a v1 key's), and one
// pass applies the final correction word, so the leaves in shared memory are the selection
// bits. The page loop then costs per key and page a shared-memory broadcast read, a shift and
// the AND-XOR of the page's lanes (one LOP3 per 32-bit word, as the v1 kernel's).
//
// `first_index` numbers the kernel's page 0 in the keys' domain: the shard's first page for a
// whole-shard scan, a table's page index for a table scan at any offset (the fused layout
// stores pages as they are, so gpu_tables.py passes a view at the range's first page).
//
// Kernel arguments (scalars as the numpy types named; gpu_kernels.py documents the table):
//   const uint4* pages   u64 num_pages   u64 first_index   const u32* keys (records of
//   key_words(levels), gpu_keys.py `pack_keys`)   u32 num_keys   u32 levels (0..25)
//   u32 tile_bits (0..min(levels, MAX_TILE_BITS))   u32 num_groups   uint4* partial

#ifndef SCAN_THREADS
#error "geometry #defines missing: compile morphogen.engine.gpu_kernels.kernel_source()"
#endif

template <int KG, int U>
__device__ __forceinline__ void packed_scan_body(const uint4* __restrict__ pages,
                                                 const u64 num_pages, const u64 first_index,
                                                 const u32* __restrict__ keys,
                                                 const u32 num_keys, const u32 levels,
                                                 const u32 tile_bits, const u32 num_groups,
                                                 uint4* __restrict__ partial) {
    MG_DYNAMIC_SMEM(morphogen_smem);
    const u32 h = tile_bits;
    const u32 tile_leaves = 1u << h;
    const u32 tile_mask = tile_leaves - 1u;
    const u32 root_depth = levels - h;  // depth of a tile's subtree root
    const u32 key_words = KEY_HEADER_WORDS + 4u * levels;
    const u32 tid = threadIdx.x;

    // Shared memory as scan_body's with leaves for pages (gpu_plan.py scan_smem_bytes):
    // leaves [tile_leaves][KG] uint4, path seeds [KG][PATH_SLOTS] uint4, node t
    // [tile_leaves][KG] u8, path t [KG][PATH_SLOTS] u8.
    uint4* leaves = morphogen_smem;
    uint4* path_s = leaves + (u64)tile_leaves * KG;
    u8* node_t = reinterpret_cast<u8*>(path_s + KG * PATH_SLOTS);
    u8* path_t = node_t + (u64)tile_leaves * KG;
    const u32* leaf_words = reinterpret_cast<const u32*>(leaves);

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
        const u32 my_key = min_u32(group * KG + (tid < KG ? tid : 0u), num_keys - 1u);
        const u32* wkey = keys + (u64)my_key * key_words;
        if (tid < KG) {
            path_s[tid * PATH_SLOTS] = load_key_words(wkey);
            path_t[tid * PATH_SLOTS] = (u8)(__ldg(wkey + 8) & 1u);
        }
        const u32 page_tile_bits = h + 7u;
        const u32 first_tile = (u32)((first_index + lo) >> page_tile_bits);
        const u32 last_tile = (u32)((first_index + hi - 1ull) >> page_tile_bits);

        u64 p = lo;

        for (u32 tile = first_tile;; ++tile) {
            // 1. Root-to-tile path (cached: about two PRG calls a tile).
            if (tid < KG) {
                advance_path(path_s + tid * PATH_SLOTS, path_t + tid * PATH_SLOTS, wkey,
                             root_depth, tile, tile == first_tile);
                leaves[tid] = path_s[tid * PATH_SLOTS + root_depth];
                node_t[tid] = path_t[tid * PATH_SLOTS + root_depth];
            }
            __syncthreads();

            // 2. Breadth-first expansion in place: level l holds node n at slot n << (h - l).
            for (u32 l = 0; l < h; ++l) {
                const u32 stride = tile_leaves >> l;
                const u32 half = stride >> 1;
                const u32 work = (u32)KG << l;
                for (u32 w = tid; w < work; w += SCAN_THREADS) {
                    const u32 k = w % KG;
                    const u32 n = w / KG;
                    const u32* key =
                        keys + (u64)min_u32(group * KG + k, num_keys - 1u) * key_words;
                    const u32 slot = n * stride;
                    uint4 sl, sr;
                    u32 tl, tr;
                    dpf_children(leaves[slot * KG + k], node_t[slot * KG + k], key,
                                 root_depth + l, sl, tl, sr, tr);
                    node_t[slot * KG + k] = (u8)tl;
                    node_t[(slot + half) * KG + k] = (u8)tr;
                    leaves[slot * KG + k] = sl;
                    leaves[(slot + half) * KG + k] = sr;
                }
                __syncthreads();
            }

            // 3. Leaves: s XOR (final_cw if t). Separate from the last level so a tile of one
            //    leaf (h = 0, the root itself when levels = 0) is corrected too.
            for (u32 w = tid; w < ((u32)KG << h); w += SCAN_THREADS) {
                const u32 k = w % KG;
                const u32* key = keys + (u64)min_u32(group * KG + k, num_keys - 1u) * key_words;
                const uint4 f = load_key_words(key + 4);
                const u32 on = 0u - (u32)node_t[w];
                uint4 s = leaves[w];
                s.x ^= f.x & on; s.y ^= f.y & on; s.z ^= f.z & on; s.w ^= f.w & on;
                leaves[w] = s;
            }
            __syncthreads();

            // 4. The tile's pages in this block's range: each key's bit selects whole pages.
            const u64 stop = tile_stop(p, first_index, page_tile_bits, hi);
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
                    // past `stop` the data is zero; the index stays inside the tile's leaves
                    const u32 g = (u32)(first_index + here) + u;
                    const u32 bit = g & 127u;
                    const u32* w = leaf_words + (((g >> 7) & tile_mask) * KG) * 4u + (bit >> 5);
#pragma unroll
                    for (int k = 0; k < KG; ++k) {
                        const u32 m = 0u - ((w[4 * k] >> (bit & 31u)) & 1u);
#pragma unroll
                        for (int i = 0; i < LANES_PER_THREAD; ++i) {
                            acc[k][i].x ^= cur[u][i].x & m;
                            acc[k][i].y ^= cur[u][i].y & m;
                            acc[k][i].z ^= cur[u][i].z & m;
                            acc[k][i].w ^= cur[u][i].w & m;
                        }
                    }
                }
            }
            if (tile == last_tile) break;
            __syncthreads();  // the next tile's expansion overwrites the leaves read above
        }
    }

    // 5. This block's partial rows: every lane of every real key, written once.
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

// Same variants, page groups and register caps as MG_SCAN_KERNEL (nvcc_check: no spill).
#define MG_PACKED_KERNEL(KG, U, MINB)                                                         \
    extern "C" __global__ void __launch_bounds__(SCAN_THREADS, MINB) morphogen_packed_k##KG(  \
        const uint4* __restrict__ pages, const u64 num_pages, const u64 first_index,          \
        const u32* __restrict__ keys, const u32 num_keys, const u32 levels,                   \
        const u32 tile_bits, const u32 num_groups, uint4* __restrict__ partial) {             \
        packed_scan_body<KG, U>(pages, num_pages, first_index, keys, num_keys, levels,        \
                                tile_bits, num_groups, partial);                              \
    }

MG_PACKED_KERNEL(1, 4, 4)
MG_PACKED_KERNEL(2, 4, 4)
MG_PACKED_KERNEL(3, 4, 4)
MG_PACKED_KERNEL(4, 4, 4)
MG_PACKED_KERNEL(6, 4, 3)
MG_PACKED_KERNEL(8, 2, 3)
MG_PACKED_KERNEL(12, 2, 2)
MG_PACKED_KERNEL(16, 2, 2)
