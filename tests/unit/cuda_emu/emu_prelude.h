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

static dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace emu {

struct Fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    bool done = false;
    bool at_barrier = false;
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

// Runs body(arg) for every thread of every block; returns 0, or 1 on a divergent barrier.
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
        }
        for (;;) {
            std::iota(order.begin(), order.end(), 0u);
            if (s.order == 1) std::reverse(order.begin(), order.end());
            if (s.order == 2) std::shuffle(order.begin(), order.end(), s.rng);
            for (u32 t : order) {
                Fiber& f = s.fibers[t];
                if (f.done) continue;
                f.at_barrier = false;
                s.current = t;
                threadIdx = dim3{t, 0, 0};
                swapcontext(&s.main_ctx, &f.ctx);
            }
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
            if (waiting != threads) {  // some left the kernel while others wait: abandon block
                s.error = 1;
                return s.error;
            }
        }
    }
    return s.error;
}

}  // namespace emu

static inline void __syncthreads() { emu::barrier_wait(); }

#define MG_DYNAMIC_SMEM(name) uint4* name = reinterpret_cast<uint4*>(emu::sched().smem.data())
