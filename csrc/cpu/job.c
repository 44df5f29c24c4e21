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

/* a yield request whose run has had its slice */
static int yield_due(const gr_job *job) {
    const volatile int *c = job->run->cancel;
    if (!c || !(*c & GR_STOP_YIELD)) return 0;
    return !job->run->at->slice_ns || gr_now_ns() - job->run->t0 >= job->run->at->slice_ns;
}

/* the run yields inside the phase in progress (if nothing stopped it first) */
static int pause_here(gr_job *job, int64_t chunk) {
    if (!gr_fail(job, GR_EXEC_EYIELD, "yielded")) return 0;
    gr_resume *at = job->run->at;
    at->node = (int)(job->node - job->run->nodes);
    at->phase = job->phase;
    at->mid = 1;
    at->chunk = chunk;
    atomic_store(&job->run->paused, 1);
    return 1;
}

/* a stopped counter: every take is past every chunk, and its low bits say where
 * the phase goes on */
#define GR_CHUNK_STOP ((int64_t)1 << 60)

int64_t gr_chunk_next(gr_job *job) {
    if (gr_canceled(job)) return INT64_MAX / 2;
    if (yield_due(job)) {
        int64_t v = atomic_load(&job->run->chunk);
        while (!(v & GR_CHUNK_STOP) && !atomic_compare_exchange_weak(&job->run->chunk, &v, v | GR_CHUNK_STOP)) {}
        if (!(v & GR_CHUNK_STOP)) pause_here(job, v);
        return INT64_MAX / 2;
    }
    return atomic_fetch_add_explicit(&job->run->chunk, 1, memory_order_relaxed);
}

int64_t gr_chunk_first(gr_job *job) {
    if (!job->resumed) return job->ith;
    return atomic_fetch_add_explicit(&job->run->chunk, 1, memory_order_relaxed);
}

int gr_chunk_stopped(const gr_run *run) {
    return (atomic_load(&run->chunk) & GR_CHUNK_STOP) != 0;
}

int64_t gr_rows_from(gr_job *job, int64_t r0) {
    job->from = job->resumed ? job->run->at->cursor[job->ith] : r0;
    return job->from;
}

int gr_rows_pause(gr_job *job, int64_t i) {
    job->run->at->cursor[job->ith] = i;   /* this thread's own slot */
    if (gr_canceled(job)) return 1;   /* the run stops at the node's barrier */
    if (i == job->from || !yield_due(job)) return 0;
    /* the first to yield decides; the others stop too once they see it was a pause
     * (one that cannot tell goes on to the end of its rows, which is as correct) */
    return pause_here(job, 0) || atomic_load(&job->run->paused);
}

int gr_wait_pause(gr_job *job) {
    return yield_due(job) && pause_here(job, 0);
}

int gr_fail(gr_job *job, int code, const char *fmt, ...) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&job->run->failed, &expected, job->epoch + 1)) return 0;
    gr_exec_status *st = job->run->status;
    st->code = code;
    st->node = job->node->index;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
    return 1;
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
