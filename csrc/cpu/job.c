/* The job side of a run (job.h): error reporting, work chunks and the scratch
 * rules several kernels share. Below the kernels and the run loop: it calls
 * neither. */
#include "common/checked.h"
#include <stdarg.h>
#include <stdio.h>

#include "cpu/job.h"
#include "cpu/kernels.h"

void gr_chunk_set(gr_job *job, int64_t value) {
    atomic_store_explicit(&job->run->chunk, value, memory_order_relaxed);
}

int gr_canceled(gr_job *job) {
    const volatile int *c = job->run->cancel;
    if (!c || !(*c & GR_STOP_CANCEL)) return 0;
    gr_fail(job, GR_EXEC_ECANCELED, "canceled");
    return 1;
}

int64_t gr_chunk_next(gr_job *job) {
    if (gr_canceled(job)) return INT64_MAX / 2;
    return atomic_fetch_add_explicit(&job->run->chunk, 1, memory_order_relaxed);
}

void gr_fail(gr_job *job, int code, const char *fmt, ...) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&job->run->failed, &expected, job->epoch + 1)) return;
    gr_exec_status *st = job->run->status;
    st->code = code;
    st->node = job->node->index;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
}

/* ---- the rows of kernels.def without a kernel or without scratch ------------ */

void gr_k_nop(gr_job *job, int phase) {
    (void)job;
    (void)phase;
}

size_t gr_ws_none(const gr_node *n, int nth) {
    (void)n;
    (void)nth;
    return 0;
}

/* ---- scratch rules shared by several kernels ------------------------------ */

size_t gr_ws_rows(const gr_node *n, int nth) {
    int64_t w = n->dst.ne[0] > n->src[0].ne[0] ? n->dst.ne[0] : n->src[0].ne[0];
    for (int i = 1; i < n->n_src; i++)
        if (n->src[i].ne[0] > w) w = n->src[i].ne[0];
    return gr_sz_mul3(gr_sz(nth), gr_sz_add(gr_sz_mul(3, gr_sz(w)), 48), sizeof(float));
}

size_t gr_ws_row(const gr_node *n, int nth) {
    return gr_sz_mul3(gr_sz(nth), gr_sz_add(gr_sz(n->src[0].ne[0]), 16), sizeof(float));
}
