/* The matmul kernels alone, at each quant kernel level this CPU has (1: AVX2,
 * 2: AVX2 and the AVX-512 VNNI kernels): what a level change buys, without a
 * server, a network or another process in the way. Not a comparison with ggml
 * (llama_bench.py is); see bench/README.md.
 *
 *   decode: weights of ~150 MB (far past the caches; or the MB of the first
 *           argument: 2 keeps them in cache, where the compute is the limit) times 1, 2, 4 or 8 activation
 *           rows, rows split between 1 or 2 threads: the kernel the executor takes
 *           for a column (four weight rows at a time where the level has it) or a
 *           small batch (ggmlrpc_vec_dot_4xn, or its offset form with the activation
 *           rows' sums computed once where the level has it, as the server runs
 *           Q8_0/Q4_0/Q5_0 on AVX-512 VNNI), in GB/s of weights read, best of 20
 *           passes;
 *   prompt: a 1024 x 2816 weight matrix times 64 columns on one thread: level 1's
 *           eight-column panels against level 2's sixteen-column ones, in CPU
 *           cycles per output block (one output's 32 products) at a nominal 2.6 GHz.
 *
 * Build and run from the repository root:
 *   cc -O3 -Icsrc bench/kernels.c csrc/cpu/quants/[a-z]*.c csrc/cpu/quants/x86/[a-z]*.c \
 *      csrc/cpu/simd.c csrc/common/[a-z]*.c -lpthread -lm -o /tmp/kernels && /tmp/kernels
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/quants/quants.h"

enum { K = 1024, T_Q4_0 = 2, T_Q5_0 = 6, T_Q8_0 = 8, T_Q4_K = 12, T_Q6_K = 14 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* bytes of one block and of its elements, and where its f16 scale sits */
static void block_of(uint32_t type, size_t *bytes, int *elems, size_t *scale_at) {
    switch (type) {
    case T_Q4_0: *bytes = 18, *elems = 32, *scale_at = 0; break;
    case T_Q5_0: *bytes = 22, *elems = 32, *scale_at = 0; break;
    case T_Q8_0: *bytes = 34, *elems = 32, *scale_at = 0; break;
    case T_Q4_K: *bytes = 144, *elems = 256, *scale_at = 0; break;
    default: *bytes = 210, *elems = 256, *scale_at = 208; break;   /* Q6_K */
    }
}

/* random blocks with sane f16 scales (1.0 to about 1.25) */
static char *random_weights(uint32_t type, int64_t rows, size_t *row_bytes) {
    size_t bb, at;
    int be;
    block_of(type, &bb, &be, &at);
    *row_bytes = (size_t)(K / be) * bb;
    char *w = aligned_alloc(64, ((size_t)rows * *row_bytes + 63) & ~(size_t)63);
    for (size_t i = 0; i < (size_t)rows * *row_bytes; i++) w[i] = (char)rand();
    for (int64_t b = 0; b < rows * (K / be); b++) {
        const uint16_t h = (uint16_t)(0x3c00 + rand() % 256);
        memcpy(w + (size_t)b * bb + at, &h, 2);
        if (type == T_Q4_K) memcpy(w + (size_t)b * bb + 2, &h, 2);   /* dmin */
    }
    return w;
}

static void random_activation(uint32_t act_type, void *dst) {
    float x[K];
    for (int i = 0; i < K; i++) x[i] = (float)(rand() % 2001 - 1000) / 500.0f;
    ggmlrpc_get_from_float(act_type)(x, dst, K);
}

typedef struct {
    uint32_t type;
    const char *w;
    size_t row_bytes;
    int64_t r0, r1;
    const void *const *act;   /* ncols activation rows */
    const int32_t *const *sums;   /* their lane sums for the offset form, or NULL */
    int ncols;
    float *out;
} decode_part;

static void *decode_rows(void *arg) {
    const decode_part *p = arg;
    const ggmlrpc_vec_dot_fn one = ggmlrpc_get_vec_dot(p->type);
    const ggmlrpc_vec_dot_rows4_fn four = ggmlrpc_get_vec_dot_rows4(p->type);
    const ggmlrpc_vec_dot_4xn_fn tile = p->ncols > 1 ? ggmlrpc_get_vec_dot_4xn(p->type) : NULL;
    const ggmlrpc_vec_dot_4xn_sums_fn tile_s = tile && p->sums ? ggmlrpc_get_vec_dot_4xn_sums(p->type) : NULL;
    int64_t r = p->r0;
    for (; (four || tile) && r + 4 <= p->r1; r += 4) {
        const void *w[4] = {p->w + r * p->row_bytes, p->w + (r + 1) * p->row_bytes, p->w + (r + 2) * p->row_bytes,
                            p->w + (r + 3) * p->row_bytes};
        float v[4 * GGMLRPC_4XN_COLS];
        if (tile_s) tile_s(K, v, w, p->act, p->sums, p->ncols), p->out[r] = v[0];
        else if (tile) tile(K, v, w, p->act, p->ncols), p->out[r] = v[0];
        else for (int j = 0; j < p->ncols; j++) four(K, p->out + r, w, p->act[j]);
    }
    for (; r < p->r1; r++)
        for (int j = 0; j < p->ncols; j++) one(K, p->out + r, p->w + r * p->row_bytes, p->act[j]);
    return NULL;
}

static unsigned decode_mb = 150;   /* MB of weights of a decode case */

/* best of 20 passes (400 in cache) of the rows split between nth threads, in seconds */
static double decode_best(const decode_part *job, int nth, int64_t rows) {
    double best = 1e9;
    for (int pass = 0; pass < (decode_mb < 16 ? 400 : 20); pass++) {
        pthread_t th[2];
        decode_part parts[2];
        const double t0 = now();
        for (int i = 0; i < nth; i++) {
            parts[i] = *job;
            parts[i].r0 = rows * i / nth, parts[i].r1 = rows * (i + 1) / nth;
            pthread_create(&th[i], NULL, decode_rows, &parts[i]);
        }
        for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
        const double e = now() - t0;
        if (e < best) best = e;
    }
    return best;
}

static void bench_decode(uint32_t type, const char *name, int level) {
    size_t rb, bb, at;
    int be;
    block_of(type, &bb, &be, &at);
    const int64_t rows = (int64_t)(((size_t)decode_mb << 20) / ((size_t)(K / be) * bb));
    char *w = random_weights(type, rows, &rb);
    static char acts[GGMLRPC_4XN_COLS][K * 2];
    static int32_t sums[GGMLRPC_4XN_COLS][K / 32 * GGMLRPC_4XN_SUMS];
    const void *act[GGMLRPC_4XN_COLS];
    const int32_t *sp[GGMLRPC_4XN_COLS];
    /* the offset form's activation sums, once per activation row as the server keeps them */
    int with_sums = ggmlrpc_get_vec_dot_4xn_sums(type) != NULL;
    for (int j = 0; j < GGMLRPC_4XN_COLS; j++) {
        random_activation((uint32_t)ggmlrpc_vec_dot_type(type), acts[j]), act[j] = acts[j], sp[j] = sums[j];
        if (with_sums && ggmlrpc_4xn_act_sums(type, acts[j], sums[j], K / 32) != 0) with_sums = 0;
    }
    float *out = malloc((size_t)rows * sizeof(float));
    for (int ncols = 1; ncols <= GGMLRPC_4XN_COLS; ncols *= 2) {
        printf("decode %-5s x%d level %d:", name, ncols, level);
        const decode_part job = {type, w, rb, 0, rows, act, with_sums ? sp : NULL, ncols, out};
        for (int nth = 1; nth <= 2; nth++)
            printf("  %d thread%s %5.1f GB/s", nth, nth > 1 ? "s" : " ", (double)rows * (double)rb / decode_best(&job, nth, rows) / 1e9);
        printf("\n");
    }
    free(out);
    free(w);
}

static void bench_prompt(uint32_t type, const char *name, int level) {
    const int64_t M = 2816, N = 64, nb = K / 32;
    size_t rb;
    char *w = random_weights(type, M, &rb);
    char act[N][K + 64];
    for (int j = 0; j < N; j++) random_activation(T_Q8_0, act[j]);
    double best = 1e9;
    if (ggmlrpc_cpanel_available(type)) {
        char *pan = aligned_alloc(64, (size_t)(N / 16) * (size_t)nb * GGMLRPC_CPANEL_BYTES);
        for (int j = 0; j < N; j++)
            ggmlrpc_cpanel_put(type, act[j], nb, pan + (size_t)(j / 16) * (size_t)nb * GGMLRPC_CPANEL_BYTES, j % 16);
        const size_t db = ggmlrpc_cpanel_row_bytes(nb);
        char *rows = aligned_alloc(64, 16 * db);
        const ggmlrpc_cpanel_dot_fn dot = ggmlrpc_get_cpanel_dot(type);
        for (int pass = 0; pass < 10; pass++) {
            float v[32];
            const double t0 = now();
            for (int64_t r0 = 0; r0 < M; r0 += 16) {
                for (int r = 0; r < 16; r++) ggmlrpc_cpanel_decode(type, w + (size_t)(r0 + r) * rb, nb, rows + r * db);
                for (int64_t g = 0; g < N / 16; g++)
                    for (int r = 0; r < 16; r += 2)
                        dot(nb, rows + r * db, rows + (r + 1) * db, pan + (size_t)g * (size_t)nb * GGMLRPC_CPANEL_BYTES, v);
            }
            const double e = now() - t0;
            if (e < best) best = e;
        }
        free(rows);
        free(pan);
    } else {
        const size_t pb = ggmlrpc_panel_bytes(type);
        char *pan = aligned_alloc(64, (size_t)(N / 8) * (size_t)nb * pb);
        for (int j = 0; j < N; j++) ggmlrpc_panel_put(type, act[j], nb, pan + (size_t)(j / 8) * (size_t)nb * pb, j % 8);
        const ggmlrpc_panel_dot_fn dot = ggmlrpc_get_panel_dot(type);
        for (int pass = 0; pass < 10; pass++) {
            float v[8];
            const double t0 = now();
            for (int64_t r0 = 0; r0 < M; r0 += 16)
                for (int64_t g = 0; g < N / 8; g++)
                    for (int64_t r = r0; r < r0 + 16; r++) dot(K, v, w + (size_t)r * rb, pan + (size_t)g * (size_t)nb * pb);
            const double e = now() - t0;
            if (e < best) best = e;
        }
        free(pan);
    }
    const double blocks = (double)M * (double)N * (double)nb;
    printf("prompt %-5s level %d: %6.2f ms, %.2f cycles per output block at 2.6 GHz\n", name, level, best * 1e3,
           best / blocks * 2.6e9);
    free(w);
}

int main(int argc, char **argv) {
    if (argc > 1 && atoi(argv[1]) > 0) decode_mb = (unsigned)atoi(argv[1]);
    const int top = ggmlrpc_quants_simd(-1);
    if (top < 1) {
        printf("this CPU has no AVX2: nothing to compare\n");
        return 0;
    }
    const struct { uint32_t type; const char *name; } types[] = {
        {T_Q8_0, "Q8_0"}, {T_Q4_0, "Q4_0"}, {T_Q5_0, "Q5_0"}, {T_Q4_K, "Q4_K"}, {T_Q6_K, "Q6_K"}};
    for (int level = 1; level <= top; level++) {
        ggmlrpc_quants_simd(level);
        for (int i = 0; i < 5; i++) bench_decode(types[i].type, types[i].name, level);
        for (int i = 0; i < 3; i++) bench_prompt(types[i].type, types[i].name, level);
    }
    return 0;
}
