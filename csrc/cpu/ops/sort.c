/* Sorting: ARGSORT and TOP_K.
 * Same conventions as every ops file: the planner (ggmlrpc/compute/) checked types
 * and shapes, a kernel only walks each tensor inside its own ne/nb, rows are split
 * between threads with gr_range(), and arithmetic follows ggml's CPU backend
 * (ops.cpp, vec.h): the same rounding points and the same fused multiply-adds
 * where ggml's x86 build fuses.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/job.h"
#include "cpu/kernels.h"

/* ---- sorting ----------------------------------------------------------------------- */

/* stable merge sort of indices by value (desc != 0: largest first) */
static void sort_idx(int32_t *idx, int32_t *tmp, int64_t n, const float *v, int desc) {
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            const int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi) {
                const float x = v[idx[a]], y = v[idx[b]];
                const int take_b = desc ? y > x : y < x;
                tmp[k++] = take_b ? idx[b++] : idx[a++];
            }
            while (a < mid) tmp[k++] = idx[a++];
            while (b < hi) tmp[k++] = idx[b++];
        }
        memcpy(idx, tmp, (size_t)n * 4);
    }
}

/* ARGSORT (sub 0: whole rows, order op_params[0]) and TOP_K (sub 1: the dst.ne0
 * largest, in decreasing order with the first two swapped, as ggml returns them) */
void gr_k_argsort(gr_job *job, int phase) {
    (void)phase;
    GR_NODE_LOCALS(job);
    const int64_t ne00 = s->ne[0];
    int32_t *idx = (int32_t *)gr_thread_f32(job, 2 * ne00 + 16);
    int32_t *tmp = idx + ne00 + 8;
    const int top_k = n->sub != GR_V_ARGSORT_ARGSORT;
    const int desc = top_k ? 1 : n->op_params[0] == 1;
    int64_t r0, r1;
    gr_range(gr_nrows(s), job->ith, job->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        const float *x = (const float *)gr_row(s, ir);
        for (int64_t j = 0; j < ne00; j++) idx[j] = (int32_t)j;
        sort_idx(idx, tmp, ne00, x, desc);
        const int64_t k = d->ne[0];
        if (top_k && k > 1) {
            const int32_t t = idx[0];
            idx[0] = idx[1];
            idx[1] = t;
        }
        memcpy(gr_row(d, ir), idx, (size_t)k * 4);
    }
}
