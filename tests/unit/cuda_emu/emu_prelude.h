// Host emulation of the CUDA subset used by morphogen/engine/scan_kernel.cu.
//
// Each CUDA thread of a block is a fiber (ucontext) with its own stack; __syncthreads()
// switches back to a scheduler that resumes the next fiber, and starts a new phase once every
// fiber has reached the barrier. Blocks run one after another, so shared memory is one
// process-wide buffer, poisoned before every block: reading a slot nobody wrote gives garbage,
// not a lucky zero. The order in which the fibers run inside a phase is a parameter (forward,
// reverse, shuffled): a kernel whose answer depends on it has an intra-block race, the bug a
// missing barrier causes on the device. Threads that leave the kernel while others wait at a
// barrier are reported as an error.
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#define MORPHOGEN_HOST_EMULATION 1

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned char u8;

struct uint4 {
    u32 x, y, z, w;
};
struct dim3 {
    u32 x, y, z;
};

static inline uint4 make_uint4(u32 x, u32 y, u32 z, u32 w) { return uint4{x, y, z, w}; }

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

template <typename T>
static inline T __ldg(const T* p) { return *p; }
static inline u32 __funnelshift_l(u32 lo, u32 hi, u32 shift) {
    const u64 v = ((u64)hi << 32) | lo;
    return (u32)((v << (shift & 31u)) >> 32);
}
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
// fibers never switch inside a read-modify-write, so a plain one is atomic here
static inline u32 atomicXor(u32* p, u32 v) {
    const u32 old = *p;
    *p = old ^ v;
    return old;
}

static dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace emu {

struct Fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    bool done = false;
    bool at_barrier = false;  // at __syncthreads
    bool at_warp = false;     // at a warp collective (shuffle, mma)
    u32 warp_ops = 0;         // warp collectives this thread has entered
};

// What the lanes of one warp hand each other in a collective: two slots, used alternately,
// so the next collective writes the slot nobody reads any more (all lanes have left the one
// before last once the warp barrier in between released).
struct WarpSlot {
    u32 v[32][6];
};

struct Scheduler {
    ucontext_t main_ctx;
    std::vector<Fiber> fibers;
    u32 current = 0;
    void (*body)(void*) = nullptr;
    void* body_arg = nullptr;
    int order = 0;  // 0 forward, 1 reverse, 2 shuffled
    std::mt19937 rng{12345};
    int error = 0;  // 1: divergent barrier, 2: write past the dynamic shared memory
    std::vector<unsigned char> smem;
    std::vector<WarpSlot> warp_slots;  // [warp][2]
};

inline Scheduler& sched() {
    static Scheduler s;
    return s;
}

inline void fiber_entry() {
    Scheduler& s = sched();
    s.body(s.body_arg);
    s.fibers[s.current].done = true;
    // returning resumes uc_link, the scheduler
}

inline void barrier_wait() {
    Scheduler& s = sched();
    Fiber& f = s.fibers[s.current];
    f.at_barrier = true;
    swapcontext(&f.ctx, &s.main_ctx);
}

// A warp collective: waits until all 32 lanes of the caller's warp have arrived.
inline void warp_wait() {
    Scheduler& s = sched();
    Fiber& f = s.fibers[s.current];
    f.at_warp = true;
    swapcontext(&f.ctx, &s.main_ctx);
}

// Lane `threadIdx.x & 31` publishes `n` words and gets its warp's slot for the collective,
// every lane's words in it once all 32 have arrived.
inline const WarpSlot& warp_exchange(const u32* words, int n);

// Runs body(arg) for every thread of every block; returns 0, 1 on a divergent barrier (or a
// warp collective some lanes of the warp never reach), 2 on a write past the shared memory.
inline int launch(u32 grid, u32 threads, size_t smem_bytes, void (*body)(void*), void* arg) {
    Scheduler& s = sched();
    gridDim = dim3{grid, 1, 1};
    blockDim = dim3{threads, 1, 1};
    s.body = body;
    s.body_arg = arg;
    s.error = 0;
    const size_t canary = 64;  // bytes past the requested size that must stay untouched
    s.smem.assign(smem_bytes + canary, 0);
    if (s.fibers.size() < threads) s.fibers.resize(threads);
    s.warp_slots.assign(2 * ((threads + 31) / 32), WarpSlot{});
    std::vector<u32> order(threads);
    for (u32 b = 0; b < grid; ++b) {
        blockIdx = dim3{b, 0, 0};
        std::fill(s.smem.begin(), s.smem.end(), (unsigned char)(0xA5 ^ (b * 29u)));
        for (u32 t = 0; t < threads; ++t) {
            Fiber& f = s.fibers[t];
            if (f.stack.empty()) f.stack.resize(256 * 1024);
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack.data();
            f.ctx.uc_stack.ss_size = f.stack.size();
            f.ctx.uc_link = &s.main_ctx;
            makecontext(&f.ctx, fiber_entry, 0);
            f.done = false;
            f.at_barrier = false;
            f.at_warp = false;
            f.warp_ops = 0;
        }
        for (;;) {
            std::iota(order.begin(), order.end(), 0u);
            if (s.order == 1) std::reverse(order.begin(), order.end());
            if (s.order == 2) std::shuffle(order.begin(), order.end(), s.rng);
            // every runnable thread runs to its next wait: a barrier, a warp collective, the end
            for (u32 t : order) {
                Fiber& f = s.fibers[t];
                if (f.done || f.at_barrier || f.at_warp) continue;
                s.current = t;
                threadIdx = dim3{t, 0, 0};
                swapcontext(&s.main_ctx, &f.ctx);
            }
            // release the warps whose 32 lanes all reached their collective, else the barrier
            bool released = false;
            for (u32 w0 = 0; w0 < threads; w0 += 32) {
                bool all = true;
                for (u32 l = w0; l < w0 + 32 && l < threads; ++l) all = all && s.fibers[l].at_warp;
                if (!all) continue;
                for (u32 l = w0; l < w0 + 32 && l < threads; ++l) s.fibers[l].at_warp = false;
                released = true;
            }
            if (released) continue;
            u32 done = 0, waiting = 0;
            for (u32 t = 0; t < threads; ++t) {
                done += s.fibers[t].done;
                waiting += s.fibers[t].at_barrier;
            }
            if (done == threads) {
                for (size_t i = smem_bytes; i < smem_bytes + canary; ++i) {
                    if (s.smem[i] != (unsigned char)(0xA5 ^ (b * 29u))) {
                        s.error = 2;
                        return s.error;
                    }
                }
                break;
            }
            // some left the kernel (or wait in a warp collective its warp never completes)
            // while others wait at a barrier: abandon the block
            if (waiting != threads) {
                s.error = 1;
                return s.error;
            }
            for (u32 t = 0; t < threads; ++t) s.fibers[t].at_barrier = false;
        }
    }
    return s.error;
}

inline const WarpSlot& warp_exchange(const u32* words, int n) {
    Scheduler& s = sched();
    Fiber& f = s.fibers[s.current];
    const u32 tid = s.current;
    WarpSlot& slot = s.warp_slots[2 * (tid >> 5) + (f.warp_ops++ & 1u)];
    for (int i = 0; i < n; ++i) slot.v[tid & 31u][i] = words[i];
    warp_wait();
    return slot;
}

}  // namespace emu

static inline void __syncthreads() { emu::barrier_wait(); }

// Warp shuffles and the tensor-core AND-popc MMA, as warp collectives (the full-warp mask is
// the only one the kernels use).
static inline u32 __shfl_xor_sync(u32 mask, u32 v, u32 lane_mask) {
    (void)mask;
    const emu::WarpSlot& slot = emu::warp_exchange(&v, 1);
    return slot.v[(threadIdx.x & 31u) ^ lane_mask][0];
}

static inline u32 __byte_perm(u32 x, u32 y, u32 s) {
    const u64 v = ((u64)y << 32) | x;
    u32 out = 0;
    for (int i = 0; i < 4; ++i) out |= (u32)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
    return out;
}

// mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc with C = 0 (PTX ISA fragment
// layouts): A row g (+8 for a1, a3), K-word tig (+4 for a2, a3); B column g, K-word tig (b0)
// and tig + 4 (b1); D row g (+8 for d2, d3), column 2 tig (+1 for d1, d3).
static inline void emu_mma_and_popc(u32& d0, u32& d1, u32& d2, u32& d3, const uint4 a,
                                    const u32 b0, const u32 b1) {
    const u32 mine[6] = {a.x, a.y, a.z, a.w, b0, b1};
    const emu::WarpSlot& slot = emu::warp_exchange(mine, 6);
    const u32 lane = threadIdx.x & 31u, g = lane >> 2, tig = lane & 3u;
    u32 d[4];
    for (int r = 0; r < 4; ++r) {
        const u32 row = g + 8u * (r >> 1), col = 2u * tig + (r & 1);
        u32 sum = 0;
        for (u32 kw = 0; kw < 8; ++kw) {
            const u32 a_lane = 4u * (row & 7u) + (kw & 3u);
            const u32 a_word = slot.v[a_lane][(row >> 3) + 2u * (kw >> 2)];
            const u32 b_word = slot.v[4u * col + (kw & 3u)][4 + (kw >> 2)];
            sum += (u32)__builtin_popcount(a_word & b_word);
        }
        d[r] = sum;
    }
    d0 = d[0]; d1 = d[1]; d2 = d[2]; d3 = d[3];
}

#define MG_DYNAMIC_SMEM(name) uint4* name = reinterpret_cast<uint4*>(emu::sched().smem.data())
