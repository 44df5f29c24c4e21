/* Flash attention's decode loop alone (no server, no graph): one query row of 16
 * heads of 64 over F16 keys and values laid out as the KV cache holds them (each
 * key's row of every head side by side), the way the executor ran it before (a
 * head at a time, fa_keys_f16) against every head at once (fa_heads_f16), in ns
 * per key and head, best of 15 passes. 2,800 cells: one sequence's run (the cache
 * with each sequence in a region of its own) or, one cell in four, one of four
 * sequences' interleaved (the unified cache of four sequences decoding together); `bufs`
 * caches of that size in turn: 2 stay in the last level cache, 24 come from memory
 * (as in a decode step, where the weights have pushed the cache out between
 * layers). AVX-512 families only (the kernels compared are theirs).
 *
 * Build and run from the repository root:
 *   cc -O3 -ffp-contract=off -Icsrc bench/attention.c csrc/cpu/vec.c csrc/cpu/x86/vec_x86.c \
 *      csrc/cpu/simd.c -lm -lpthread -o /tmp/attention && /tmp/attention
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/exec.h"
#include "cpu/vec.h"

enum { H = 16, D = 64 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint16_t f16(float f) {
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

static uint16_t rnd(void) { return f16((float)(rand() % 2001 - 1000) / 1000.0f); }

/* ns per key and head; *chk a checksum of the results (the same in both ways) */
static double run(int keys, int nseq, int bufs, int heads_at_once, double *chk) {
    const int cells = keys * nseq;
    const size_t row = (size_t)H * D * 2, bytes = row * (size_t)cells;
    char **k = malloc(sizeof *k * (size_t)bufs), **v = malloc(sizeof *v * (size_t)bufs);
    srand(1);
    for (int b = 0; b < bufs; b++) {
        k[b] = aligned_alloc(4096, bytes);
        v[b] = aligned_alloc(4096, bytes);
        for (size_t i = 0; i < bytes / 2; i++) ((uint16_t *)k[b])[i] = rnd(), ((uint16_t *)v[b])[i] = rnd();
    }
    uint16_t *mask = malloc((size_t)cells * 2), q[H * D], vkq[H * D];
    for (int c = 0; c < cells; c++) mask[c] = c % nseq == 0 ? 0 : GR_F16_NEG_INF;
    for (int i = 0; i < H * D; i++) q[i] = rnd();
    float M[H], S[H];
    double best = 1e30;
    *chk = 0;
    for (int pass = 0; pass < 15; pass++) {
        const double t0 = now();
        for (int b = 0; b < bufs; b++) {
            for (int h = 0; h < H; h++) M[h] = -INFINITY, S[h] = 0.0f;
            memset(vkq, 0, sizeof vkq);
            if (heads_at_once) {
                const gr_fa_heads a = {.k = k[b], .v = v[b], .k_stride = row, .v_stride = row, .k_head = D * 2,
                                       .v_head = D * 2, .h0 = 0, .H = H, .rk = 1, .rv = 1, .mask = mask, .q = q,
                                       .DK = D, .DV = D, .ic0 = 0, .ic1 = cells, .scale = 0.125f};
                gr_vec.fa_heads_f16(&a, M, S, vkq);
            } else {
                for (int h = 0; h < H; h++) {
                    const gr_fa_keys a = {.k = k[b] + h * D * 2, .v = v[b] + h * D * 2, .k_stride = row,
                                          .v_stride = row, .mask = mask, .q = q + h * D,
                                          .k_next = h + 1 < H ? k[b] + (h + 1) * D * 2 : NULL,
                                          .v_next = h + 1 < H ? v[b] + (h + 1) * D * 2 : NULL, .DK = D, .DV = D,
                                          .ic0 = 0, .ic1 = cells, .slope = 1.0f, .scale = 0.125f};
                    gr_vec.fa_keys_f16(&a, M + h, S + h, vkq + h * D);
                }
            }
            if (pass == 0) for (int h = 0; h < H; h++) *chk += S[h] + vkq[h * D + 3];
        }
        const double e = now() - t0;
        if (e < best) best = e;
    }
    for (int b = 0; b < bufs; b++) free(k[b]), free(v[b]);
    free(k), free(v), free(mask);
    return best * 1e9 / ((double)bufs * keys * H);
}

int main(void) {
    if (!gr_vec_init(GR_FAMILY_AVX512, 1) || !gr_vec.fa_heads_f16) {
        printf("this CPU has no AVX-512 family: nothing to compare\n");
        return 0;
    }
    printf("%-38s %12s %14s\n", "16 heads, 2,800 cells (ns a key, head)", "head at a time", "heads at once");
    const struct { int nseq, bufs; const char *name; } cases[] = {
        {1, 2, "one sequence's run, in cache"}, {1, 24, "one sequence's run, from memory"},
        {4, 2, "four interleaved, in cache"}, {4, 24, "four interleaved, from memory"}};
    for (int i = 0; i < 4; i++) {
        const int keys = cases[i].nseq == 1 ? 2800 : 700;
        double c0, c1;
        const double a = run(keys, cases[i].nseq, cases[i].bufs, 0, &c0), b = run(keys, cases[i].nseq, cases[i].bufs, 1, &c1);
        printf("%-38s %9.1f ns %11.1f ns%s\n", cases[i].name, a, b, c0 == c1 ? "" : "  (results differ!)");
    }
    return 0;
}
