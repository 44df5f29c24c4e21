/* The CPU probe of simd.h. */
#include "cpu/simd.h"
#include "cpu/exec.h"

unsigned gr_cpu_features(void) {
    unsigned f = 0;
#if GR_X86
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")))
        return 0;
    f |= GR_CPU_AVX2;
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")))
        return f;
    f |= GR_CPU_AVX512;
    if (__builtin_cpu_supports("avx512bf16")) f |= GR_CPU_AVX512_BF16;
    if (__builtin_cpu_supports("avx512fp16")) f |= GR_CPU_AVX512_FP16;
    if (__builtin_cpu_supports("avx512vnni")) f |= GR_CPU_AVX512_VNNI;
#endif
    return f;
}

int gr_cpu_native_zen(void) {
#if GR_X86
    __builtin_cpu_init();
    return __builtin_cpu_is("amd");
#else
    return 0;
#endif
}

int gr_cpu_native_family(void) {
    const unsigned f = gr_cpu_features();
    if (!(f & GR_CPU_AVX512)) return GR_FAMILY_AVX2;
    if (!(f & GR_CPU_AVX512_BF16)) return GR_FAMILY_AVX512;
    return f & GR_CPU_AVX512_FP16 ? GR_FAMILY_AVX512_FP16 : GR_FAMILY_AVX512_BF16;
}
