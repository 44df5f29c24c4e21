/* What every CPU kernel includes: the job a thread runs, error reporting, work
 * chunks, row splitting and rows as floats (with the vector primitives of vec.h).
 * The lowest layer of csrc/cpu/: it calls nothing above it (job.c implements it,
 * exec.c runs the jobs). Internal to csrc/: not part of the exported API.
 */
#ifndef GGMLRPC_CPU_JOB_H
#define GGMLRPC_CPU_JOB_H

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "cpu/exec.h"
#include "common/fp16.h"
#include "cpu/quants/quants.h"
#include "cpu/vec.h"

/* ggml_type ids that quants.h leaves out */
enum { GR_T_I8 = 24, GR_T_I16 = 25, GR_T_I32 = 26, GR_T_I64 = 27, GR_T_F64 = 28 };

/* A run of a node array (exec.c) as its jobs see it. A failure stops the run at
 * the barrier that ends the failing phase, and only there: `failed` holds that
 * barrier's number + 1, so a slow thread still checking after an earlier barrier
 * carries on to it (stopping on sight would leave the others waiting at a barrier
 * it never reaches). */
typedef struct gr_run {
    const gr_node *nodes;
    int n_nodes;
    char *wdata;
    size_t wsize;
    atomic_int failed;          /* 0, or 1 + the barrier number where every thread stops */
    gr_exec_status *status;
    const volatile int *cancel; /* GR_STOP_* bits (exec.h; may be NULL) */
    int start, start_phase, start_mid;   /* where this run starts (a copy of *at, read by
                                 * every thread as it joins: never written during the run) */
    gr_resume *at;              /* written by the one thread whose yield wins */
    int64_t t0;                 /* when the run began (its slice) */
    atomic_int paused;          /* a thread yielded inside the phase in progress */
    _Alignas(64) atomic_llong chunk;   /* next work chunk of the current node (own cache line; 64-bit:
                                        * experts x row chunks of a MUL_MAT_ID can pass 2^31) */
} gr_run;

/* One thread's view of one node. */
typedef struct gr_job {
    const gr_node *node;
    int ith, nth;        /* this thread, number of threads */
    char *wdata;         /* scratch shared by all threads of the node */
    size_t wsize;
    gr_run *run;
    int epoch;           /* barriers this thread has passed (where a failure stops) */
    int phase;
    int resumed;         /* this phase was paused mid-way and goes on from *run->at */
    int64_t from;        /* where this thread's own rows went on from (gr_rows_from) */
} gr_job;

typedef void (*gr_kernel_fn)(gr_job *job, int phase);

/* Report a run error; the first one wins (returns 1) and the run stops at the next barrier. */
int gr_fail(gr_job *job, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A counter shared by the threads of a run, for work handed out in chunks: one
 * thread sets it before a barrier, every thread takes chunks after it (relaxed:
 * the barrier orders the set before the takes). */
void gr_chunk_set(gr_job *job, int64_t value);
int64_t gr_chunk_next(gr_job *job);   /* returns the counter, then adds 1; past every
                                       * chunk once the run is canceled or yields (it
                                       * stops at the node's barrier) */
/* A thread's first chunk of a phase: its own index, or the counter where a paused
 * phase goes on (taken without a yield check, so every turn makes progress). */
int64_t gr_chunk_first(gr_job *job);
/* whether a thread stopped the counter to yield inside the phase */
int gr_chunk_stopped(const gr_run *run);

/* A thread's own rows [r0, r1) with pauses between blocks of them: start at
 * gr_rows_from(job, r0), and before each block (and once at r1) ask
 * gr_rows_pause(job, i): 1 means stop now (the run yields and goes on from i, or
 * it was canceled). */
int64_t gr_rows_from(gr_job *job, int64_t r0);
int gr_rows_pause(gr_job *job, int64_t i);

/* One thread's wait inside a node (thread 0 of a node the others only wait for):
 * 1 when another run is waiting for the pool and this one has had its slice; the
 * run then yields, and the node is entered again with job->resumed set. */
int gr_wait_pause(gr_job *job);

static inline int64_t gr_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Whether the run was canceled: a long loop without chunks checks it between its
 * blocks of work and leaves early (the run then stops at the node's barrier). */
int gr_canceled(gr_job *job);

/* The locals a kernel starts from (as ggml's GGML_TENSOR_UNARY_OP_LOCALS): its
 * node n, n's first source s and its result d. */
#define GR_NODE_LOCALS(job)             \
    const gr_node *n = (job)->node;     \
    const gr_tensor *s = &n->src[0], *d = &n->dst

/* Rows [*r0, *r1) of n for thread ith of nth: contiguous, nearly equal shares. */
static inline void gr_range(int64_t n, int ith, int nth, int64_t *r0, int64_t *r1) {
    const int64_t dr = (n + nth - 1) / nth;
    int64_t a = dr * ith;
    if (a > n) a = n;
    int64_t b = a + dr;
    if (b > n) b = n;
    *r0 = a;
    *r1 = b;
}

static inline int64_t gr_nrows(const gr_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }
static inline int64_t gr_nelements(const gr_tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

/* The indices (i1, i2, i3) of row ir (flattened over dims 1..3) of t. */
static inline void gr_row_index(const gr_tensor *t, int64_t ir, int64_t *i1, int64_t *i2, int64_t *i3) {
    *i1 = ir % t->ne[1];
    *i2 = (ir / t->ne[1]) % t->ne[2];
    *i3 = ir / (t->ne[1] * t->ne[2]);
}

/* Address of row ir (flattened over dims 1..3) of t. */
static inline char *gr_row(const gr_tensor *t, int64_t ir) {
    const int64_t i1 = ir % t->ne[1];
    const int64_t i2 = (ir / t->ne[1]) % t->ne[2];
    const int64_t i3 = ir / (t->ne[1] * t->ne[2]);
    return t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

static inline char *gr_at(const gr_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return t->data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

/* Per-thread float scratch of n floats (plus a cache line of slack) at wdata. */
static inline float *gr_thread_f32(const gr_job *job, int64_t n) {
    return (float *)job->wdata + (size_t)job->ith * (size_t)(n + 16);
}

/* ---- rows as floats --------------------------------------------------- */

/* Read n elements (stride `stride` bytes) of a float-like type as floats. */
static inline void gr_load_f32(int32_t type, const char *src, int64_t stride, float *dst, int64_t n);
/* Write n floats as `type` (F32, F16, BF16, I32) with element stride `stride`. */
static inline void gr_store_f32(int32_t type, char *dst, int64_t stride, const float *src, int64_t n);

/* op_params[i] as the float ggml stores there */
static inline float gr_param_f32(const gr_node *n, int i) {
    float f;
    memcpy(&f, &n->op_params[i], 4);
    return f;
}

/* Scratch rules shared by several kernels (kernels.def names one per kernel):
 * per-thread rows of floats, the widest row among dst and the sources, three of
 * them (gr_ws_rows); one row of src0 as floats per thread (gr_ws_row). */
size_t gr_ws_rows(const gr_node *n, int nth);
size_t gr_ws_row(const gr_node *n, int nth);


/* ---- inline definitions ----------------------------------------------- */

static inline void gr_load_f32(int32_t type, const char *src, int64_t stride, float *dst, int64_t n) {
    switch (type) {
    case GR_TYPE_F32:
        if (stride == 4) { memcpy(dst, src, (size_t)n * 4); return; }
        for (int64_t i = 0; i < n; i++) memcpy(&dst[i], src + i * stride, 4);
        return;
    case GR_TYPE_F16:
        if (stride == 2) { gr_vec.fp16_to_fp32(n, (const uint16_t *)src, dst); return; }
        for (int64_t i = 0; i < n; i++) {
            uint16_t h; memcpy(&h, src + i * stride, 2); dst[i] = gr_fp16_to_fp32(h);
        }
        return;
    case GR_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h; memcpy(&h, src + i * stride, 2); dst[i] = gr_bf16_to_fp32(h);
        }
        return;
    case GR_T_I32:
        for (int64_t i = 0; i < n; i++) {
            int32_t v; memcpy(&v, src + i * stride, 4); dst[i] = (float)v;
        }
        return;
    default:
        for (int64_t i = 0; i < n; i++) dst[i] = 0.0f;
    }
}

static inline void gr_store_f32(int32_t type, char *dst, int64_t stride, const float *src, int64_t n) {
    switch (type) {
    case GR_TYPE_F32:
        if (stride == 4) { memmove(dst, src, (size_t)n * 4); return; }
        for (int64_t i = 0; i < n; i++) memcpy(dst + i * stride, &src[i], 4);
        return;
    case GR_TYPE_F16:
        if (stride == 2) { gr_vec.fp32_to_fp16(n, src, (uint16_t *)dst); return; }
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = gr_fp32_to_fp16(src[i]); memcpy(dst + i * stride, &h, 2);
        }
        return;
    case GR_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = gr_fp32_to_bf16(src[i]); memcpy(dst + i * stride, &h, 2);
        }
        return;
    case GR_T_I32:
        for (int64_t i = 0; i < n; i++) {
            int32_t v = (int32_t)src[i]; memcpy(dst + i * stride, &v, 4);
        }
        return;
    default:
        return;
    }
}

#endif
