// C entry points (for ctypes) that launch the kernels of scan_kernel.cu under emulation.
#include "emu_prelude.h"
// scan_kernel.cu and sliced_scan_kernel.cu as gpu_kernels.kernel_source() generates them (its geometry #defines first),
// written into the build's include directory by tests/unit/_gpu_fakes.py `load_emulator`.
#include "morphogen_scan_kernel.cu"

namespace {

struct ScanArgs {
    int kg;
    const uint4* pages;
    u64 num_pages, first_page;
    const u32* keys;
    u32 num_keys, domain_bits, tile_bits, num_groups;
    uint4* partial;
};

#define MG_CASE(KG)                                                                           \
    case KG:                                                                                  \
        morphogen_scan_k##KG(a.pages, a.num_pages, a.first_page, a.keys, a.num_keys,          \
                             a.domain_bits, a.tile_bits, a.num_groups, a.partial);            \
        break;

void scan_thread(void* p) {
    const ScanArgs& a = *static_cast<const ScanArgs*>(p);
    switch (a.kg) {
        MG_CASE(1)
        MG_CASE(2)
        MG_CASE(3)
        MG_CASE(4)
        MG_CASE(6)
        MG_CASE(8)
        MG_CASE(12)
        MG_CASE(16)
        default:
            break;
    }
}

#define MG_PACKED_CASE(KG)                                                                    \
    case KG:                                                                                  \
        morphogen_packed_k##KG(a.pages, a.num_pages, a.first_page, a.keys, a.num_keys,        \
                               a.domain_bits, a.tile_bits, a.num_groups, a.partial);          \
        break;

// ScanArgs with domain_bits = the packed keys' levels
void packed_thread(void* p) {
    const ScanArgs& a = *static_cast<const ScanArgs*>(p);
    switch (a.kg) {
        MG_PACKED_CASE(1)
        MG_PACKED_CASE(2)
        MG_PACKED_CASE(3)
        MG_PACKED_CASE(4)
        MG_PACKED_CASE(6)
        MG_PACKED_CASE(8)
        MG_PACKED_CASE(12)
        MG_PACKED_CASE(16)
        default:
            break;
    }
}

struct ReduceArgs {
    const uint4* partial;
    uint4* out;
    u32 num_partials, row_lanes;
};

void reduce_thread(void* p) {
    const ReduceArgs& a = *static_cast<const ReduceArgs*>(p);
    morphogen_xor_reduce(a.partial, a.out, a.num_partials, a.row_lanes);
}

struct ReadArgs {
    const uint4* data;
    u64 n16;
    uint4* sink;
};

void read_thread(void* p) {
    const ReadArgs& a = *static_cast<const ReadArgs*>(p);
    morphogen_read_bw(a.data, a.n16, a.sink);
}

struct SlicedArgs {
    int variant;  // index into sliced.SLICED_VARIANTS
    const uint4* sliced;
    u64 num_chunks, first_chunk;
    const u32* keys;
    u32 num_keys, domain_bits, num_groups;
    uint4* partial;
};

void sliced_thread(void* p) {
    const SlicedArgs& a = *static_cast<const SlicedArgs*>(p);
    switch (a.variant) {
        case 0:
            morphogen_sliced_scan_n1(a.sliced, a.num_chunks, a.first_chunk, a.keys, a.num_keys,
                                     a.domain_bits, a.num_groups, a.partial);
            break;
        case 1:
            morphogen_sliced_scan_n2(a.sliced, a.num_chunks, a.first_chunk, a.keys, a.num_keys,
                                     a.domain_bits, a.num_groups, a.partial);
            break;
        case 2:
            morphogen_sliced_scan_n2_prefetch(a.sliced, a.num_chunks, a.first_chunk, a.keys,
                                              a.num_keys, a.domain_bits, a.num_groups,
                                              a.partial);
            break;
        default:
            break;
    }
}

struct TableArgs {
    SlicedArgs s;
    u32 shift;
    u64 leaf_lo, leaf_hi;
};

void table_thread(void* p) {
    const TableArgs& t = *static_cast<const TableArgs*>(p);
    const SlicedArgs& a = t.s;
    switch (a.variant) {
        case 0:
            morphogen_sliced_table_n1(a.sliced, a.num_chunks, a.first_chunk, a.keys, a.num_keys,
                                      a.domain_bits, a.num_groups, a.partial, t.shift, t.leaf_lo,
                                      t.leaf_hi);
            break;
        case 1:
            morphogen_sliced_table_n2(a.sliced, a.num_chunks, a.first_chunk, a.keys, a.num_keys,
                                      a.domain_bits, a.num_groups, a.partial, t.shift, t.leaf_lo,
                                      t.leaf_hi);
            break;
        case 2:
            morphogen_sliced_table_n2_prefetch(a.sliced, a.num_chunks, a.first_chunk, a.keys,
                                               a.num_keys, a.domain_bits, a.num_groups,
                                               a.partial, t.shift, t.leaf_lo, t.leaf_hi);
            break;
        default:
            break;
    }
}

// TableArgs with domain_bits = the keys' levels, first_chunk = first_index, shift = offset,
// leaf_lo/leaf_hi = idx_lo/idx_hi
void sliced_packed_thread(void* p) {
    const TableArgs& t = *static_cast<const TableArgs*>(p);
    const SlicedArgs& a = t.s;
    switch (a.variant) {
        case 0:
            morphogen_sliced_packed_n1(a.sliced, a.num_chunks, a.first_chunk, a.keys, a.num_keys,
                                       a.domain_bits, a.num_groups, a.partial, t.shift,
                                       t.leaf_lo, t.leaf_hi);
            break;
        case 1:
            morphogen_sliced_packed_n2(a.sliced, a.num_chunks, a.first_chunk, a.keys, a.num_keys,
                                       a.domain_bits, a.num_groups, a.partial, t.shift,
                                       t.leaf_lo, t.leaf_hi);
            break;
        case 2:
            morphogen_sliced_packed_n2_prefetch(a.sliced, a.num_chunks, a.first_chunk, a.keys,
                                                a.num_keys, a.domain_bits, a.num_groups,
                                                a.partial, t.shift, t.leaf_lo, t.leaf_hi);
            break;
        default:
            break;
    }
}

struct SliceArgs {
    const uint4* natural;
    u64 num_chunks;
    u32* sliced;
};

void slice_thread(void* p) {
    const SliceArgs& a = *static_cast<const SliceArgs*>(p);
    morphogen_slice_pages(a.natural, a.num_chunks, a.sliced);
}

struct PatchArgs {
    int sliced;
    const uint4* diffs;
    const u32* slots;
    u32 n;
    void* dest;
};

void patch_thread(void* p) {
    const PatchArgs& a = *static_cast<const PatchArgs*>(p);
    if (a.sliced) {
        morphogen_patch_sliced(a.diffs, a.slots, a.n, static_cast<u32*>(a.dest));
    } else {
        morphogen_patch_pages(a.diffs, a.slots, a.n, static_cast<uint4*>(a.dest));
    }
}

}  // namespace

extern "C" int emu_patch(int sliced, u32 grid, u32 block, const uint4* diffs, const u32* slots,
                         u32 n, void* dest) {
    PatchArgs a{sliced, diffs, slots, n, dest};
    return emu::launch(grid, block, 0, patch_thread, &a);
}

extern "C" int emu_sliced(int variant, u32 grid, u64 smem_bytes, const uint4* sliced,
                          u64 num_chunks, u64 first_chunk, const u32* keys, u32 num_keys,
                          u32 domain_bits, u32 num_groups, uint4* partial) {
    if (variant < 0 || variant > 2) return -1;
    SlicedArgs a{variant, sliced, num_chunks, first_chunk, keys, num_keys, domain_bits,
                 num_groups, partial};
    return emu::launch(grid, SLICED_THREADS, smem_bytes, sliced_thread, &a);
}

extern "C" int emu_sliced_table(int variant, u32 grid, u64 smem_bytes, const uint4* sliced,
                                u64 num_chunks, u64 first_chunk, const u32* keys, u32 num_keys,
                                u32 domain_bits, u32 num_groups, uint4* partial, u32 shift,
                                u64 leaf_lo, u64 leaf_hi) {
    if (variant < 0 || variant > 2) return -1;
    TableArgs a{{variant, sliced, num_chunks, first_chunk, keys, num_keys, domain_bits,
                 num_groups, partial},
                shift, leaf_lo, leaf_hi};
    return emu::launch(grid, SLICED_THREADS, smem_bytes, table_thread, &a);
}

extern "C" int emu_sliced_packed(int variant, u32 grid, u64 smem_bytes, const uint4* sliced,
                                 u64 num_chunks, u64 first_index, const u32* keys, u32 num_keys,
                                 u32 levels, u32 num_groups, uint4* partial, u32 offset,
                                 u64 idx_lo, u64 idx_hi) {
    if (variant < 0 || variant > 2) return -1;
    TableArgs a{{variant, sliced, num_chunks, first_index, keys, num_keys, levels, num_groups,
                 partial},
                offset, idx_lo, idx_hi};
    return emu::launch(grid, SLICED_THREADS, smem_bytes, sliced_packed_thread, &a);
}

extern "C" int emu_slice_pages(u32 grid, const uint4* natural, u64 num_chunks, u32* sliced) {
    SliceArgs a{natural, num_chunks, sliced};
    return emu::launch(grid, SLICE_THREADS, 0, slice_thread, &a);
}

extern "C" void emu_set_order(int order, unsigned seed) {
    emu::sched().order = order;
    emu::sched().rng.seed(seed);
}

extern "C" int emu_scan(int kg, u32 grid, u64 smem_bytes, const uint4* pages, u64 num_pages,
                        u64 first_page, const u32* keys, u32 num_keys, u32 domain_bits,
                        u32 tile_bits, u32 num_groups, uint4* partial) {
    if (kg != 1 && kg != 2 && kg != 3 && kg != 4 && kg != 6 && kg != 8 && kg != 12 && kg != 16)
        return -1;
    ScanArgs a{kg, pages, num_pages, first_page, keys, num_keys, domain_bits, tile_bits,
               num_groups, partial};
    return emu::launch(grid, SCAN_THREADS, smem_bytes, scan_thread, &a);
}

extern "C" int emu_packed(int kg, u32 grid, u64 smem_bytes, const uint4* pages, u64 num_pages,
                          u64 first_index, const u32* keys, u32 num_keys, u32 levels,
                          u32 tile_bits, u32 num_groups, uint4* partial) {
    if (kg != 1 && kg != 2 && kg != 3 && kg != 4 && kg != 6 && kg != 8 && kg != 12 && kg != 16)
        return -1;
    ScanArgs a{kg, pages, num_pages, first_index, keys, num_keys, levels, tile_bits,
               num_groups, partial};
    return emu::launch(grid, SCAN_THREADS, smem_bytes, packed_thread, &a);
}

extern "C" int emu_reduce(u32 grid, const uint4* partial, uint4* out, u32 num_partials,
                          u32 row_lanes) {
    ReduceArgs a{partial, out, num_partials, row_lanes};
    return emu::launch(grid, REDUCE_LANES * REDUCE_SLICES, 0, reduce_thread, &a);
}

extern "C" int emu_read_bw(u32 grid, const uint4* data, u64 n16, uint4* sink) {
    ReadArgs a{data, n16, sink};
    return emu::launch(grid, READ_BW_THREADS, 0, read_thread, &a);
}

// G(seed) on one seed: left, right (4 words each), tl, tr -> out[10].
extern "C" void emu_prg_g(const u32* seed, u32* out) {
    uint4 l, r;
    u32 tl, tr;
    prg_g(make_uint4(seed[0], seed[1], seed[2], seed[3]), l, r, tl, tr);
    const u32 v[10] = {l.x, l.y, l.z, l.w, r.x, r.y, r.z, r.w, tl, tr};
    std::memcpy(out, v, sizeof v);
}
