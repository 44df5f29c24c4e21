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

#if defined(__x86_64__) || defined(__i386__)
#define GR_X86 1
#include <immintrin.h>
#else
#define GR_X86 0
#endif

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

/* The one switch (exec.c): the primitives and kernels of `family`, SIMD where the
 * CPU has it and use_simd is set, else the portable twins; returns whether SIMD
 * kernels were chosen. */
int gr_simd_select(int family, int use_simd);

#endif
