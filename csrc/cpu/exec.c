/* Thread pool, barrier and the node loop of the CPU executor (see exec.h): the top
 * of csrc/cpu/, which dispatches every node through the kernel table (kernels.def)
 * and is called by nothing below it. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cpu/job.h"
#include "cpu/kernels.h"
#include "cpu/matmul/matmul.h"
#include "cpu/simd.h"

#if GR_X86
#define GR_PAUSE() _mm_pause()
#else
#define GR_PAUSE() ((void)0)
#endif

/* ---- kernel table ------------------------------------------------------ */

/* Every kernel runs `phases` passes over the node with a barrier after each
 * pass (a matmul converts src1 in pass 0 and multiplies in pass 1); `wsize` says
 * how much scratch the node needs. One row of kernels.def each. */
typedef struct {
    gr_kernel_fn fn;
    int phases;
    size_t (*wsize)(const gr_node *n, int nth);
} gr_kernel_entry;

static const gr_kernel_entry KERNELS[GR_K_COUNT] = {
#define GR_KERNEL(NAME, fn, phases, wsize) [GR_K_##NAME] = { fn, phases, wsize },
#include "cpu/kernels.def"
};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int simd_wanted = 1;   /* SIMD kernels unless set_simd(0) */
static int simd_enabled;      /* ... and the CPU has them for the family */
static int family;            /* the ggml build whose orders the primitives follow */
static int zen;               /* ... tuned for AMD Zen (unfused multiply-add chains) */

/* the one SIMD switch (simd.h): every table the family decides */
int gr_simd_select(int fam, int zen_tuned, int use_simd) {
    const int simd = gr_vec_init(fam, use_simd);
    gr_vec.fma_chains = !zen_tuned;
    ggmlrpc_quants_set_fma_chains(!zen_tuned);
    gr_tiled_init(simd, fam);
    return simd;
}

static void select_kernels(void) {
    simd_enabled = gr_simd_select(family, zen, simd_wanted);
}

static void exec_init(void) {
    family = gr_cpu_native_family();
    zen = gr_cpu_native_zen();
    select_kernels();
}

int ggmlrpc_exec_simd_level(void) {
    pthread_once(&init_once, exec_init);
    return simd_enabled;
}

int ggmlrpc_exec_set_simd(int enable) {
    pthread_once(&init_once, exec_init);
    const int old = simd_enabled;
    simd_wanted = enable;
    select_kernels();
    return old;
}

int ggmlrpc_exec_family(void) {
    pthread_once(&init_once, exec_init);
    return family;
}

int ggmlrpc_exec_set_family(int f) {
    pthread_once(&init_once, exec_init);
    const int old = family;
    family = f ? f : gr_cpu_native_family();
    select_kernels();
    return old;
}

int ggmlrpc_exec_zen(void) {
    pthread_once(&init_once, exec_init);
    return zen;
}

int ggmlrpc_exec_set_zen(int z) {
    pthread_once(&init_once, exec_init);
    const int old = zen;
    zen = z < 0 ? gr_cpu_native_zen() : z != 0;
    select_kernels();
    return old;
}

int ggmlrpc_exec_vec_lanes(void) {
    pthread_once(&init_once, exec_init);
    return gr_vec.lanes;
}

size_t ggmlrpc_exec_wsize(const gr_node *node, int nth) {
    pthread_once(&init_once, exec_init);
    if (node->kernel < 0 || node->kernel >= GR_K_COUNT) return 0;
    return KERNELS[node->kernel].wsize(node, nth);
}

/* ---- barrier ------------------------------------------------------------ */

/* Threads spin briefly (between nodes the wait is usually microseconds), then
 * yield the core while they keep watching, then sleep on a condition variable so
 * that an oversubscribed host is not burned. The spin is bounded in time, not in
 * PAUSEs (one PAUSE takes from a few cycles to ~40 ns depending on the CPU and
 * hypervisor). 10 us of PAUSEs cover the usual wait between nodes of a decode
 * graph on a busy host, where spinning longer only burns a core that another
 * thread (often our own late partner) needs: on a busy 2-core host 160 us of PAUSE
 * spinning made decode-sized graphs ~1.6x slower. Yielding instead hands that core
 * over, and on a quiet host it wakes far sooner than a futex: a decode token on a
 * 12-layer model waits at some 300 barriers. */
#define GR_SPIN_NS 10000
#define GR_YIELD_NS 200000

typedef struct {
    atomic_int count;
    atomic_int gen;
    atomic_int sleepers;
    int n;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} gr_barrier;

static void barrier_init(gr_barrier *b, int n) {
    atomic_init(&b->count, 0);
    atomic_init(&b->gen, 0);
    atomic_init(&b->sleepers, 0);
    b->n = n;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
}

static void barrier_destroy(gr_barrier *b) {
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
}

static void barrier_wait(gr_barrier *b) {
    if (b->n == 1) return;
    const int gen = atomic_load(&b->gen);
    if (atomic_fetch_add(&b->count, 1) == b->n - 1) {
        atomic_store(&b->count, 0);
        atomic_fetch_add(&b->gen, 1);
        if (atomic_load(&b->sleepers)) {
            pthread_mutex_lock(&b->mu);
            pthread_cond_broadcast(&b->cv);
            pthread_mutex_unlock(&b->mu);
        }
        return;
    }
    const int64_t t0 = gr_now_ns();
    for (int i = 1;; i++) {
        if (atomic_load_explicit(&b->gen, memory_order_acquire) != gen) return;
        GR_PAUSE();
        if ((i & 15) == 0 && gr_now_ns() - t0 > GR_SPIN_NS) break;
    }
    while (gr_now_ns() - t0 < GR_YIELD_NS) {
        if (atomic_load_explicit(&b->gen, memory_order_acquire) != gen) return;
        sched_yield();
    }
    pthread_mutex_lock(&b->mu);
    atomic_fetch_add(&b->sleepers, 1);
    while (atomic_load(&b->gen) == gen) pthread_cond_wait(&b->cv, &b->mu);
    atomic_fetch_sub(&b->sleepers, 1);
    pthread_mutex_unlock(&b->mu);
}

/* ---- runs --------------------------------------------------------------- */

/* thread 0, before a barrier: a cancel request becomes a failure at that barrier,
 * a yield request (once the run has had its slice) one at the barrier that ends
 * node i (one thread decides, so every thread stops at the same one), unless a
 * thread already stopped the node's chunks to yield inside it */
static void check_stop(gr_job *job, int node_done, int i) {
    gr_run *run = job->run;
    if (job->ith != 0 || !run->cancel) return;
    const int c = *run->cancel;
    if (c & GR_STOP_CANCEL) {
        gr_fail(job, GR_EXEC_ECANCELED, "canceled");
    } else if ((c & GR_STOP_YIELD) && node_done && i + 1 < run->n_nodes && !gr_chunk_stopped(run)
               && (!run->at->slice_ns || gr_now_ns() - run->t0 >= run->at->slice_ns)
               && gr_fail(job, GR_EXEC_EYIELD, "yielded")) {
        run->at->node = i + 1;
        run->at->phase = 0;
        run->at->mid = 0;
    }
}

struct gr_pool {
    int n_threads;
    pthread_t *threads;
    gr_barrier barrier;
    pthread_mutex_t run_mu;      /* one run at a time */
    pthread_mutex_t mu;          /* guards start_gen / stop */
    pthread_cond_t cv;
    pthread_cond_t done_cv;
    int start_gen;
    int stop;
    int active;                  /* workers still inside the current run */
    gr_run *run;
};

typedef struct { gr_pool *pool; int ith; } gr_worker_arg;

static void run_nodes(gr_pool *pool, gr_run *run, int ith) {
    const int nth = pool->n_threads;
    int epoch = 0;   /* barriers passed */
    for (int i = run->start; i < run->n_nodes; i++) {
        const gr_node *node = &run->nodes[i];
        const gr_kernel_entry *k = &KERNELS[node->kernel];
        gr_job job = { node, ith, nth, run->wdata, run->wsize, run, 0, 0, 0, 0 };
        const int first = i == run->start ? run->start_phase : 0;
        for (int phase = first; phase < k->phases; phase++) {
            job.epoch = epoch;
            job.phase = phase;
            job.resumed = i == run->start && phase == first && run->start_mid;
            k->fn(&job, phase);
            check_stop(&job, phase + 1 == k->phases, i);
            barrier_wait(&pool->barrier);
            epoch++;
            const int f = atomic_load(&run->failed);
            if (f && f <= epoch) return;
        }
    }
}

static void *worker_main(void *p) {
    gr_worker_arg *arg = p;
    gr_pool *pool = arg->pool;
    const int ith = arg->ith;
    free(arg);
    int seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool->mu);
        while (pool->start_gen == seen && !pool->stop) pthread_cond_wait(&pool->cv, &pool->mu);
        if (pool->stop) {
            pthread_mutex_unlock(&pool->mu);
            return NULL;
        }
        seen = pool->start_gen;
        gr_run *run = pool->run;
        pthread_mutex_unlock(&pool->mu);
        run_nodes(pool, run, ith);
        /* the run lives on the caller's stack: say we are done with it */
        pthread_mutex_lock(&pool->mu);
        if (--pool->active == 0) pthread_cond_signal(&pool->done_cv);
        pthread_mutex_unlock(&pool->mu);
    }
}

gr_pool *ggmlrpc_pool_new(int n_threads) {
    pthread_once(&init_once, exec_init);
    if (n_threads < 1) n_threads = 1;
    if (n_threads > GR_EXEC_MAX_THREADS) n_threads = GR_EXEC_MAX_THREADS;
    gr_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->n_threads = n_threads;
    barrier_init(&pool->barrier, n_threads);
    pthread_mutex_init(&pool->run_mu, NULL);
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    pthread_cond_init(&pool->done_cv, NULL);
    pool->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!pool->threads) {
        ggmlrpc_pool_free(pool);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        gr_worker_arg *arg = malloc(sizeof *arg);
        if (arg) {
            arg->pool = pool;
            arg->ith = i;
        }
        if (!arg || pthread_create(&pool->threads[i], NULL, worker_main, arg) != 0) {
            free(arg);
            pool->n_threads = i;   /* join the ones that started */
            ggmlrpc_pool_free(pool);
            return NULL;
        }
    }
    return pool;
}

void ggmlrpc_pool_free(gr_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    if (pool->threads)
        for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->threads[i], NULL);
    free(pool->threads);
    barrier_destroy(&pool->barrier);
    pthread_mutex_destroy(&pool->run_mu);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
    pthread_cond_destroy(&pool->done_cv);
    free(pool);
}

int ggmlrpc_pool_threads(const gr_pool *pool) { return pool->n_threads; }

int ggmlrpc_exec_run(gr_pool *pool, const gr_node *nodes, int n_nodes,
                     void *wdata, size_t wsize, gr_exec_status *status, const volatile int *cancel,
                     gr_resume *at) {
    status->code = 0;
    status->node = -1;
    status->msg[0] = 0;
    for (int i = 0; i < n_nodes; i++) {
        const int k = nodes[i].kernel;
        if (k < 0 || k >= GR_K_COUNT || (k != GR_K_NOP && KERNELS[k].fn == NULL)) {
            status->code = GR_EXEC_EINTERNAL;
            status->node = nodes[i].index;
            snprintf(status->msg, sizeof status->msg, "no kernel %d", k);
            return status->code;
        }
        if (nodes[i].wsize > wsize) {
            status->code = GR_EXEC_ENOMEM;
            status->node = nodes[i].index;
            snprintf(status->msg, sizeof status->msg, "scratch of %zu bytes, node needs %zu",
                     wsize, nodes[i].wsize);
            return status->code;
        }
    }
    if (at->node < 0 || at->node >= n_nodes) at->node = n_nodes;
    const int kp = at->node < n_nodes ? KERNELS[nodes[at->node].kernel].phases : 0;
    if (at->phase < 0 || at->phase >= kp) at->phase = 0, at->mid = 0;
    gr_run run = { nodes, n_nodes, wdata, wsize, 0, status, cancel, at->node, at->phase, at->mid != 0,
                   at, gr_now_ns(), 0, 0 };
    atomic_init(&run.failed, 0);
    atomic_init(&run.paused, 0);
    atomic_init(&run.chunk, at->mid ? at->chunk : 0);
    pthread_mutex_lock(&pool->run_mu);
    pthread_mutex_lock(&pool->mu);
    pool->run = &run;
    pool->active = pool->n_threads - 1;
    pool->start_gen++;
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    run_nodes(pool, &run, 0);
    /* a failed run leaves early on every thread after the same barrier; wait
     * until no worker looks at `run` any more */
    pthread_mutex_lock(&pool->mu);
    while (pool->active > 0) pthread_cond_wait(&pool->done_cv, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
    pthread_mutex_unlock(&pool->run_mu);
    if (!atomic_load(&run.failed)) at->node = n_nodes;
    return atomic_load(&run.failed) ? status->code : 0;   /* status was written before the barrier */
}
