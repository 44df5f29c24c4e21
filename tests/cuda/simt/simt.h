// simt.h: a small SIMT emulator that runs CUDA kernels on the CPU (tests only).
//
// The loader (simt.py) compiles a kernel source with the host C++ compiler as
//
//     #include "simt.h"
//     #include "<kernel>.cu"
//     SIMT_EXPORT(kernel_a) SIMT_EXPORT(kernel_b) ...
//
// Every CUDA thread of a block is a fiber (ucontext) on one OS thread; blocks run
// one after another. A fiber runs until it reaches a synchronisation point
// (__syncthreads, a warp collective) or returns; the scheduler then resumes the
// next ready fiber in the launch's thread order (forward, reverse or shuffled),
// so a kernel that relies on an order CUDA does not promise gives other results
// under another order. Errors CUDA leaves undefined are reported, not hidden:
//   - __syncthreads reached while some thread of the block has returned,
//   - a warp collective whose mask names a lane that has returned (or that does
//     not exist in a partial last warp), or lanes that disagree on the op/mask,
//   - a deadlock (every live thread waits and nothing can complete).
// __shared__ variables live in one ELF section that is filled with 0xFF bytes
// (NaN for f32/f16/bf16) at each block start, as is the dynamic shared memory.
// Since all fibers share one OS thread, atomics are plain read-modify-writes. Each
// fiber stack (256 KiB) sits above a guard page: an overflow faults, loudly.
#pragma once
#define SIMT_EMULATOR 1

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <vector_types.h>
#include <vector_functions.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#ifndef __global__
#define __global__
#endif
#ifndef __device__
#define __device__
#endif
#ifndef __host__
#define __host__
#endif
#ifndef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#endif
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#ifdef __constant__
#undef __constant__
#endif
#define __constant__ static const
#ifdef __shared__
#undef __shared__
#endif
// `__shared__ float x[N];` inside a kernel: one static per process (= per block,
// since blocks run one at a time), gathered in a section that is poisoned per block
#define __shared__ static __attribute__((section("simt_shared"), aligned(16)))

namespace simt {

enum { READY = 0, AT_BARRIER = 1, AT_WARP = 2, DONE = 3 };
enum { OP_SHFL_IDX, OP_SHFL_XOR, OP_SHFL_DOWN, OP_SHFL_UP, OP_BALLOT, OP_SYNCWARP };
static const char *const op_names[] = {"__shfl_sync", "__shfl_xor_sync", "__shfl_down_sync",
                                       "__shfl_up_sync", "__ballot_sync", "__syncwarp"};

struct Fiber {
    ucontext_t ctx;
    uint3 tid;
    int warp, lane, state;
};

struct Warp {
    unsigned live;      // lanes that exist in this block and have not returned
    unsigned arrived;   // lanes waiting in the current collective
    unsigned mask;      // the current collective's mask
    int op;
    uint64_t val[32], res[32];
    int arg[32], width[32];
};

struct State {
    uint3 block_idx, block_dim, grid_dim;
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    char *stacks = nullptr;  // one mapping: per fiber a PROT_NONE guard page, then its stack
    size_t stacks_for = 0, stack_stride = 0;
    size_t stack_size = 256 * 1024;
    std::vector<unsigned char> dyn;  // dynamic shared memory
    Fiber *cur = nullptr;
    ucontext_t main_ctx;
    int n_done = 0, n_barrier = 0;
    void (*entry)(void **) = nullptr;
    void **args = nullptr;
    char err[512];
    bool failed = false;
};
static State g;

[[noreturn]] static void fail_and_leave(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail_and_leave(const char *fmt, ...) {
    if (!g.failed) {
        va_list ap;
        va_start(ap, fmt);
        int n = snprintf(g.err, sizeof g.err, "block (%u,%u,%u) thread (%u,%u,%u): ", g.block_idx.x,
                         g.block_idx.y, g.block_idx.z, g.cur->tid.x, g.cur->tid.y, g.cur->tid.z);
        vsnprintf(g.err + n, sizeof g.err - n, fmt, ap);
        va_end(ap);
        g.failed = true;
    }
    swapcontext(&g.cur->ctx, &g.main_ctx);
    abort();  // a failed launch never resumes its fibers
}

static void yield_as(int state) {
    g.cur->state = state;
    swapcontext(&g.cur->ctx, &g.main_ctx);
}

static void syncthreads() {
    if (g.n_done)
        fail_and_leave("__syncthreads reached after %d thread(s) of the block returned", g.n_done);
    int n = (int)g.fibers.size();
    if (++g.n_barrier == n) {  // the last one releases everybody
        g.n_barrier = 0;
        for (auto &f : g.fibers) f.state = READY;
        return;
    }
    yield_as(AT_BARRIER);
}

static uint64_t warp_collective(int op, unsigned mask, uint64_t v, int arg, int width) {
    Fiber *f = g.cur;
    Warp &w = g.warps[f->warp];
    unsigned bit = 1u << f->lane;
    if (!(mask & bit)) fail_and_leave("%s with a mask 0x%08x that leaves out the calling lane %d",
                                      op_names[op], mask, f->lane);
    if (mask & ~w.live)
        fail_and_leave("%s mask 0x%08x names lanes that returned or do not exist (live 0x%08x)",
                       op_names[op], mask, w.live);
    if (width <= 0 || width > 32 || (width & (width - 1)))
        fail_and_leave("%s width %d is not a power of two up to 32", op_names[op], width);
    if (w.arrived == 0) {
        w.op = op;
        w.mask = mask;
    } else if (w.op != op || w.mask != mask) {
        fail_and_leave("%s (mask 0x%08x) meets %s (mask 0x%08x) of other lanes", op_names[op], mask,
                       op_names[w.op], w.mask);
    }
    w.val[f->lane] = v;
    w.arg[f->lane] = arg;
    w.width[f->lane] = width;
    w.arrived |= bit;
    if (w.arrived != mask) {
        yield_as(AT_WARP);
        return w.res[f->lane];
    }
    // the last lane to arrive computes every lane's result
    unsigned ballot = 0;
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1) && w.val[l]) ballot |= 1u << l;
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1)) continue;
        int wd = w.width[l], a = w.arg[l], base = l & ~(wd - 1), src = l;
        switch (op) {
        case OP_SHFL_IDX: src = base + (a & (wd - 1)); break;
        case OP_SHFL_XOR: src = l ^ a; if ((src & ~(wd - 1)) != base) src = l; break;
        case OP_SHFL_DOWN: src = (l - base) + a < wd ? l + a : l; break;
        case OP_SHFL_UP: src = (l - base) >= a ? l - a : l; break;
        default: break;
        }
        if (op <= OP_SHFL_UP && !(mask >> src & 1))
            fail_and_leave("%s: lane %d reads lane %d, which is not in the mask 0x%08x", op_names[op], l,
                           src, mask);
        w.res[l] = op == OP_BALLOT ? ballot : w.val[src];
        g.fibers[f->warp * 32 + l].state = READY;
    }
    w.arrived = 0;
    return w.res[f->lane];
}

static void thread_exited() {
    Fiber *f = g.cur;
    Warp &w = g.warps[f->warp];
    w.live &= ~(1u << f->lane);
    g.n_done++;
    if (w.arrived && (w.mask >> f->lane & 1))
        fail_and_leave("returned while lanes 0x%08x wait in %s with mask 0x%08x", w.arrived,
                       op_names[w.op], w.mask);
    if (g.n_barrier) fail_and_leave("returned while %d thread(s) wait at __syncthreads", g.n_barrier);
}

static void fiber_main() {
    g.entry(g.args);
    thread_exited();
    g.cur->state = DONE;
    // uc_link brings us back to the scheduler
}

template <class T> static inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}
template <class T> static inline T from_bits(uint64_t b) {
    T v;
    memcpy((void *)&v, &b, sizeof v);
    return v;
}

template <class... A, size_t... I>
static void invoke_(void (*f)(A...), void **a, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>> *>(a[I])...);
}
template <class... A> static void invoke(void (*f)(A...), void **a) {
    invoke_(f, a, std::index_sequence_for<A...>{});
}
template <class... A> static int signature(void (*)(A...), int *sizes, int cap) {
    int s[] = {0, (int)sizeof(A)...};
    int n = (int)sizeof...(A);
    for (int i = 0; i < n && i < cap; i++) sizes[i] = s[i + 1];
    return n;
}

}  // namespace simt

extern "C" char __start_simt_shared[] __attribute__((weak));
extern "C" char __stop_simt_shared[] __attribute__((weak));

// ---- the CUDA built-ins kernels see ----
#define threadIdx (simt::g.cur->tid)
#define blockIdx (simt::g.block_idx)
#define blockDim (simt::g.block_dim)
#define gridDim (simt::g.grid_dim)
#define warpSize 32

static inline void __syncthreads() { simt::syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    simt::warp_collective(simt::OP_SYNCWARP, mask, 0, 0, 32);
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
    return (unsigned)simt::warp_collective(simt::OP_BALLOT, mask, pred != 0, 0, 32);
}
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
static inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return simt::from_bits<T>(simt::warp_collective(simt::OP_SHFL_IDX, mask, simt::to_bits(v), src, width));
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
    return simt::from_bits<T>(simt::warp_collective(simt::OP_SHFL_XOR, mask, simt::to_bits(v), m, width));
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return simt::from_bits<T>(simt::warp_collective(simt::OP_SHFL_DOWN, mask, simt::to_bits(v), (int)d, width));
}
template <class T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return simt::from_bits<T>(simt::warp_collective(simt::OP_SHFL_UP, mask, simt::to_bits(v), (int)d, width));
}

static inline void *simt_dynamic_shared() { return simt::g.dyn.data(); }

// integer and float intrinsics
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int8_t)(a >> (8 * i)) * (int8_t)(b >> (8 * i));
    return c;
}
static inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
    for (int i = 0; i < 4; i++) c += (uint8_t)(a >> (8 * i)) * (uint8_t)(b >> (8 * i));
    return c;
}
// __expf and __logf: glibc declares both
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
static inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }
static inline unsigned __float_as_uint(float x) { unsigned i; memcpy(&i, &x, 4); return i; }
static inline float __int_as_float(int i) { float x; memcpy(&x, &i, 4); return x; }
static inline float __uint_as_float(unsigned i) { float x; memcpy(&x, &i, 4); return x; }
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
template <class T> static inline T __ldg(const T *p) { return *p; }
using std::max;
using std::min;

// atomics: fibers share one OS thread, so a plain read-modify-write is atomic
template <class T> static inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <class T> static inline T atomicMax(T *p, T v) { T o = *p; *p = o > v ? o : v; return o; }
template <class T> static inline T atomicMin(T *p, T v) { T o = *p; *p = o < v ? o : v; return o; }
template <class T> static inline T atomicExch(T *p, T v) { T o = *p; *p = v; return o; }
template <class T> static inline T atomicCAS(T *p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }

// ---- launching ----
enum { SIMT_FORWARD = 0, SIMT_REVERSE = 1, SIMT_SHUFFLED = 2 };

static std::vector<int> simt_order(int n, int order, std::mt19937_64 &rng) {
    std::vector<int> o(n);
    for (int i = 0; i < n; i++) o[i] = order == SIMT_REVERSE ? n - 1 - i : i;
    if (order == SIMT_SHUFFLED) std::shuffle(o.begin(), o.end(), rng);
    return o;
}

// Runs entry(args) for every thread of every block; 0, or -1 with a message in err.
extern "C" int simt_launch(void (*entry)(void **), void **args, const unsigned *grid, const unsigned *block,
                           size_t dyn_shared, int order, unsigned long long seed, char *err, int errlen) {
    using namespace simt;
    g.entry = entry;
    g.args = args;
    g.failed = false;
    g.err[0] = 0;
    g.grid_dim = make_uint3(grid[0], grid[1], grid[2]);
    g.block_dim = make_uint3(block[0], block[1], block[2]);
    int nt = (int)(block[0] * block[1] * block[2]);
    if (nt <= 0 || nt > 1024) {
        snprintf(err, errlen, "block of %d threads (1..1024)", nt);
        return -1;
    }
    int nw = (nt + 31) / 32;
    g.fibers.assign(nt, Fiber{});
    g.warps.assign(nw, Warp{});
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (g.stacks_for < (size_t)nt || g.stack_stride != g.stack_size + page) {
        if (g.stacks) munmap(g.stacks, g.stacks_for * g.stack_stride);
        g.stack_stride = g.stack_size + page;
        void *m = mmap(nullptr, nt * g.stack_stride, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            g.stacks = nullptr;
            g.stacks_for = 0;
            snprintf(err, errlen, "no memory for %d fiber stacks", nt);
            return -1;
        }
        g.stacks = (char *)m;
        g.stacks_for = nt;
        for (int t = 0; t < nt; t++) mprotect(g.stacks + t * g.stack_stride, page, PROT_NONE);  // overflow faults
    }
    g.dyn.assign(dyn_shared + 16, 0xff);
    std::mt19937_64 rng(seed);
    long nb = (long)grid[0] * grid[1] * grid[2];
    std::vector<int> blocks = simt_order((int)nb, order, rng);
    size_t shared_bytes = __start_simt_shared ? (size_t)(__stop_simt_shared - __start_simt_shared) : 0;
    for (int b : blocks) {
        g.block_idx = make_uint3(b % grid[0], b / grid[0] % grid[1], b / (grid[0] * grid[1]));
        if (shared_bytes) memset(__start_simt_shared, 0xff, shared_bytes);
        memset(g.dyn.data(), 0xff, g.dyn.size());
        g.n_done = g.n_barrier = 0;
        for (int w = 0; w < nw; w++) {
            int lanes = std::min(32, nt - 32 * w);
            g.warps[w].live = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
        }
        for (int t = 0; t < nt; t++) {
            Fiber &f = g.fibers[t];
            f.tid = make_uint3(t % block[0], t / block[0] % block[1], t / (block[0] * block[1]));
            f.warp = t / 32;
            f.lane = t % 32;
            f.state = READY;
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = g.stacks + (size_t)t * g.stack_stride + page;
            f.ctx.uc_stack.ss_size = g.stack_size;
            f.ctx.uc_link = &g.main_ctx;
            makecontext(&f.ctx, fiber_main, 0);
        }
        std::vector<int> threads = simt_order(nt, order, rng);
        while (g.n_done < nt) {
            bool ran = false;
            for (int t : threads) {
                if (g.fibers[t].state != READY) continue;
                g.cur = &g.fibers[t];
                ran = true;
                swapcontext(&g.main_ctx, &g.cur->ctx);
                if (g.failed) {
                    snprintf(err, errlen, "%s", g.err);
                    return -1;
                }
            }
            if (!ran) {
                snprintf(err, errlen,
                         "block (%u,%u,%u): deadlock: %d thread(s) at __syncthreads, %d returned, the rest "
                         "in warp collectives that cannot complete",
                         g.block_idx.x, g.block_idx.y, g.block_idx.z, g.n_barrier, g.n_done);
                return -1;
            }
        }
    }
    return 0;
}

extern "C" void simt_set_stack_size(size_t n) { simt::g.stack_size = (n + 4095) & ~(size_t)4095; }

#define SIMT_EXPORT(f)                                                                            \
    extern "C" void simt_entry_##f(void **a) { simt::invoke(f, a); }                             \
    extern "C" int simt_sig_##f(int *sizes, int cap) { return simt::signature(f, sizes, cap); }
