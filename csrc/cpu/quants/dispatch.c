/* The kernel level (quants.h, ggmlrpc_quants_simd) and the getters MUL_MAT and
 * the converters call: each type's portable kernels (quants.c) with the
 * architecture's ones of the level in force in their place (x86/quants_x86.c
 * fills them; quants_impl.h falls back to none elsewhere).
 */
#include "cpu/quants/quants_impl.h"

/* -1 until first use, then the level in force: 0 portable, 1 AVX2, 2 AVX2 and the
 * AVX-512 VNNI decode kernels (x86/quants_vnni.c) */
static int gr_level = -1;

static int gr_simd_level(void) {
    int level = __atomic_load_n(&gr_level, __ATOMIC_RELAXED);
    if (level < 0) {
        /* every thread that races here computes the same value */
        level = gr_arch_level();
        __atomic_store_n(&gr_level, level, __ATOMIC_RELAXED);
    }
    return level;
}

int ggmlrpc_quants_simd(int level) {
    if (level < 0) {
        return gr_simd_level();
    }
    const int hw = gr_arch_level();
    const int set = level < hw ? level : hw;
    __atomic_store_n(&gr_level, set, __ATOMIC_RELAXED);
    return set;
}

/* type's architecture kernels at the level in force: all NULL at level 0 */
static gr_arch_kernels gr_arch(uint32_t type) {
    gr_arch_kernels k = {0};
    const int level = gr_simd_level();
    if (level >= 1 && type < GR_NTYPES) gr_arch_kernels_of(type, level, &k);
    return k;
}

/* the portable kernels of type, with the level's architecture ones in their place */
static bool gr_resolve(uint32_t type, gr_qtraits *k) {
    const gr_qtraits *t = gr_portable(type);
    if (t == NULL) return false;
    *k = *t;
    const gr_arch_kernels a = gr_arch(type);
    if (a.to_float) k->to_float = a.to_float;
    if (a.from_float) k->from_float = a.from_float;
    if (a.vec_dot) k->vec_dot = a.vec_dot;
    return true;
}

ggmlrpc_to_float_fn ggmlrpc_get_to_float(uint32_t type) {
    gr_qtraits k;
    return gr_resolve(type, &k) ? k.to_float : NULL;
}

ggmlrpc_from_float_fn ggmlrpc_get_from_float(uint32_t type) {
    gr_qtraits k;
    return gr_resolve(type, &k) ? k.from_float : NULL;
}

ggmlrpc_vec_dot_fn ggmlrpc_get_vec_dot(uint32_t weight_type) {
    gr_qtraits k;
    return gr_resolve(weight_type, &k) ? k.vec_dot : NULL;
}

ggmlrpc_vec_dot_fn ggmlrpc_get_vec_dot_gemm(uint32_t weight_type) {
    const ggmlrpc_vec_dot_fn gemm = gr_arch(weight_type).vec_dot_gemm;
    return gemm ? gemm : ggmlrpc_get_vec_dot(weight_type);
}

int ggmlrpc_q4_0_act_sums(const void *act_blocks, int32_t *sums, int64_t nb) {
    const gr_arch_kernels k = gr_arch(GR_TYPE_Q4_0);
    if (k.act_sums == NULL) return -1;
    k.act_sums(act_blocks, sums, nb);
    return 0;
}

ggmlrpc_vec_dot_sums_fn ggmlrpc_get_vec_dot_q4_0_sums(void) { return gr_arch(GR_TYPE_Q4_0).vec_dot_sums; }

ggmlrpc_vec_dot_4xn_sums_fn ggmlrpc_get_vec_dot_4xn_sums(uint32_t weight_type) {
    const gr_arch_kernels k = gr_arch(weight_type);
    return k.act_sums_4xn ? k.vec_dot_4xn_sums : NULL;
}

int ggmlrpc_4xn_act_sums(uint32_t weight_type, const void *act_blocks, int32_t *sums, int64_t nb) {
    const gr_arch_kernels k = gr_arch(weight_type);
    if (k.act_sums_4xn == NULL) return -1;
    k.act_sums_4xn(act_blocks, sums, nb);
    return 0;
}

/* only beside the very vec_dot whose order they repeat: the architecture's */
ggmlrpc_vec_dot_rows4_fn ggmlrpc_get_vec_dot_rows4(uint32_t weight_type) {
    return gr_arch(weight_type).vec_dot_rows4;
}

ggmlrpc_vec_dot_4xn_fn ggmlrpc_get_vec_dot_4xn(uint32_t weight_type) { return gr_arch(weight_type).vec_dot_4xn; }

ggmlrpc_panel_dot_fn ggmlrpc_get_panel_dot(uint32_t weight_type) { return gr_arch(weight_type).panel_dot; }

ggmlrpc_cpanel_dot_fn ggmlrpc_get_cpanel_dot(uint32_t weight_type) { return gr_arch(weight_type).cpanel_dot; }

int ggmlrpc_vec_dot_type(uint32_t weight_type) {
    const gr_qtraits *t = gr_portable(weight_type);
    return t ? t->vec_dot_type : -1;
}

static bool gr_whole_blocks(uint32_t type, int64_t n) {
    const gr_qtraits *t = gr_portable(type);
    return t != NULL && n >= 0 && n % t->blck == 0;
}

int ggmlrpc_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n) {
    const ggmlrpc_to_float_fn f = ggmlrpc_get_to_float(type);
    if (f == NULL || !gr_whole_blocks(type, n)) return -1;
    f(src, dst, n);
    return 0;
}

int ggmlrpc_quantize_row(uint32_t type, const float *src, void *dst, int64_t n) {
    const ggmlrpc_from_float_fn f = ggmlrpc_get_from_float(type);
    if (f == NULL || !gr_whole_blocks(type, n)) return -1;
    f(src, dst, n);
    return 0;
}

int ggmlrpc_quantize_row_ref(uint32_t type, const float *src, void *dst, int64_t n) {
    const gr_qtraits *t = gr_portable(type);
    if (t == NULL || t->from_float_ref == NULL) {
        return ggmlrpc_quantize_row(type, src, dst, n);
    }
    if (!gr_whole_blocks(type, n)) return -1;
    t->from_float_ref(src, dst, n);
    return 0;
}

int ggmlrpc_vec_dot(uint32_t weight_type, int64_t n, float *s, const void *w_row, const void *act_row) {
    const ggmlrpc_vec_dot_fn f = ggmlrpc_get_vec_dot(weight_type);
    if (f == NULL || !gr_whole_blocks(weight_type, n)) return -1;
    const int act = ggmlrpc_vec_dot_type(weight_type);
    if (act < 0 || !gr_whole_blocks((uint32_t)act, n)) return -1;
    f(n, s, w_row, act_row);
    return 0;
}
