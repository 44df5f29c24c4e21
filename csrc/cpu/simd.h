/* SIMD in one place: whether this build can compile x86 kernels, the one probe of
 * the CPU's features, and the one switch that picks every SIMD kernel table of the
 * executor for a kernel family.
 *
 * The build stays baseline x86-64: SIMD kernels carry target attributes and run
 * only where gr_cpu_features() finds their instructions. Each file that has such
 * kernels keeps a portable twin of every one (the specification the SIMD version is
 * tested against) and a table the switch fills in:
 *   vec.c              the vector primitives (gr_vec_init), with the x86 versions
 *                      in x86/vec_x86.c
 *   matmul/tiled.c     the tiled K-quant sums, K panels and, on AVX-512 VNNI
 *                      CPUs outside the AVX2 family, weight panels (gr_tiled_init)
 *   quants/quants.c    the quant formats' row kernels, with the x86 versions in
 *                      quants/x86/ (ggmlrpc_quants_simd: not per family, as the
 *                      codecs' bits do not depend on it)
 */
#ifndef GGMLRPC_CPU_SIMD_H
#define GGMLRPC_CPU_SIMD_H

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#define GR_X86 1
#include <immintrin.h>
#else
#define GR_X86 0
#endif

/* How far ahead of the weights it is reading a decode kernel asks for the next
 * ones. A matrix-vector product streams every weight once and does little with
 * each: one core waiting on memory keeps too few lines in flight, and the
 * hardware prefetcher alone was measured at about 8 GB/s on one core of a
 * Sapphire Rapids class host against 11 GB/s with this (Q8_0 rows, weights not in
 * cache). A prefetch never faults, so the address may lie past the weights. */
#define GR_PREFETCH_AHEAD 8192

static inline __attribute__((always_inline)) void gr_prefetch_ahead(const void *p) {
#if GR_X86
    _mm_prefetch((const char *)((uintptr_t)p + GR_PREFETCH_AHEAD), _MM_HINT_T0);
#else
    __builtin_prefetch((const void *)((uintptr_t)p + GR_PREFETCH_AHEAD));
#endif
}

/* The same, into the second-level cache only, for the kernels that read four
 * weight rows side by side (a block of each in turn: four short streams a row
 * apart, which the hardware prefetchers do not follow). Fetched into the first
 * level, their lines in flight are bounded by its few miss buffers: on a Zen 4
 * class core, Q8_0 rows from memory were read at 10.7 GB/s against 28 with
 * this, Q6_K at 8.5 against 19. The kernels that read one row after another keep
 * gr_prefetch_ahead: there the hardware follows the stream, the kernel's compute
 * is the limit, and the first level's copy saves it a little (Q4_K, two columns:
 * 11.8 against 11.1 GB/s). */
static inline __attribute__((always_inline)) void gr_prefetch_ahead_l2(const void *p) {
#if GR_X86
    _mm_prefetch((const char *)((uintptr_t)p + GR_PREFETCH_AHEAD), _MM_HINT_T1);
#else
    __builtin_prefetch((const void *)((uintptr_t)p + GR_PREFETCH_AHEAD), 0, 2);
#endif
}

/* every cache line of `bytes` bytes at p itself (a hint: never faults) */
static inline __attribute__((always_inline)) void gr_prefetch_lines(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o);
}

/* the same for every cache line of `bytes` bytes from p */
static inline __attribute__((always_inline)) void gr_prefetch_block_ahead(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) gr_prefetch_ahead((const char *)p + o);
}

static inline __attribute__((always_inline)) void gr_prefetch_block_ahead_l2(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) gr_prefetch_ahead_l2((const char *)p + o);
}

/* CPU features, as bits; each one includes the ones before it. */
enum gr_cpu_feature {
    GR_CPU_AVX2 = 1,          /* AVX2 + FMA + F16C: the AVX2 family's kernels */
    GR_CPU_AVX512 = 2,        /* AVX-512 F, DQ, BW, VL */
    GR_CPU_AVX512_BF16 = 4,   /* ... and AVX512-BF16 */
    GR_CPU_AVX512_FP16 = 8,   /* ... and AVX512-FP16 (not implied by BF16 in the bits) */
    GR_CPU_AVX512_VNNI = 16,  /* AVX-512 with VNNI (integer sums only: no family depends on it) */
};

/* The one probe: GR_CPU_* bits of this CPU (0 off x86). */
unsigned gr_cpu_features(void);
/* The family (enum gr_family) a native ggml build on this CPU is. */
int gr_cpu_native_family(void);
/* Whether GCC tunes a native build on this CPU for AMD Zen. Zen tunings keep the
 * multiply-add chains of ggml's scalar loops unfused (they avoid FMA chains) where
 * the generic and Intel tunings fuse them: the same family sums those loops two ways. */
int gr_cpu_native_zen(void);

/* The one switch (exec.c): the primitives and kernels of `family` as a build tuned
 * for Zen (zen) or not compiles them, SIMD where the CPU has it and use_simd is set,
 * else the portable twins; returns whether SIMD kernels were chosen. */
int gr_simd_select(int family, int zen, int use_simd);

#endif
