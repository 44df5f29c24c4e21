/* PEER_GATHER (ggmlrpc/peers.py's OP_GATHER): the ranks of a group each hold rows
 * [bound[r], bound[r+1]) of every column of an F32 tensor; each sends its piece to
 * every other rank and receives theirs, so that every rank ends with the whole.
 * op_params: n, rank, bound[n + 1]; iparams[0]: the group's gr_peers; src[0]: this
 * rank's piece (rows one after the other), dst: the whole (contiguous). Thread 0 does
 * it all (the others wait at the node's barrier). The sockets are written and read
 * without blocking, both ways at once (two ranks sending megabytes to each other
 * never wait on each other), polling for spin_us before it sleeps in poll(); while it
 * waits, another run that wants the device's pool gets it (the run yields, and the
 * exchange goes on where it was when the run resumes: its progress is kept in the
 * gr_peers). A message
 * is | tag u32 | rank u32 | nbytes u64 | data |; any mismatch, a closed link or
 * timeout_ms without progress fails the node and marks the group failed. */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "cpu/job.h"
#include "cpu/kernels.h"
#include "cpu/peers.h"

typedef struct {
    uint32_t tag, rank;
    uint64_t nbytes;
} piece_head;

_Static_assert(sizeof(piece_head) == 16, "a piece's header is 16 bytes");

static size_t piece_bytes(const gr_node *n, int r) {
    return (size_t)(n->op_params[2 + r + 1] - n->op_params[2 + r]) * 4 * (size_t)n->dst.ne[1];
}

size_t gr_ws_peer_gather(const gr_node *n, int nth) {
    (void)nth;
    size_t total = 0;
    for (int r = 0; r < n->op_params[0]; r++)
        if (r != n->op_params[1]) total += piece_bytes(n, r);
    return total;
}

static int again(void) {
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

/* sends what it can of | head | data | without blocking; -1 on a failed link */
static int step_send(int fd, const piece_head *head, const char *data, uint64_t len, uint64_t *done, int *moved) {
    while (*done < len) {
        const size_t h = sizeof *head;
        const char *p = *done < h ? (const char *)head + *done : data + (*done - h);
        const size_t left = *done < h ? h - *done : len - *done;
        const ssize_t k = send(fd, p, left, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k < 0) return again() ? 0 : -1;
        *done += (uint64_t)k;
        *moved = 1;
    }
    return 0;
}

/* receives what it can of | head | data |; -1 on a closed or failed link */
static int step_recv(int fd, unsigned char *head, char *data, uint64_t len, uint64_t *done, int *moved) {
    while (*done < len) {
        const size_t h = sizeof(piece_head);
        char *p = *done < h ? (char *)head + *done : data + (*done - h);
        const size_t left = *done < h ? h - *done : len - *done;
        const ssize_t k = recv(fd, p, left, MSG_DONTWAIT);
        if (k == 0) return -1;
        if (k < 0) return again() ? 0 : -1;
        *done += (uint64_t)k;
        *moved = 1;
    }
    return 0;
}

/* a failed exchange ends the group: every later one fails at once */
static void end_group(gr_peers *g) {
    g->failed = 1;
    g->active = 0;
}

void gr_k_peer_gather(gr_job *job, int phase) {
    (void)phase;
    if (job->ith != 0) return;
    const gr_node *nd = job->node;
    gr_peers *g = (gr_peers *)(intptr_t)nd->iparams[0];
    const int n = nd->op_params[0], rank = nd->op_params[1];
    const int32_t *bound = &nd->op_params[2];
    const int64_t cols = nd->dst.ne[1];
    const size_t own = (size_t)(bound[rank + 1] - bound[rank]) * 4;
    const int64_t t0 = gr_now_ns();
    if (g->failed) {
        gr_fail(job, GR_EXEC_EPEER, "the peer group failed earlier");
        return;
    }
    if (!(job->resumed && g->active)) {       /* a new exchange (else: the one a yield left) */
        for (int64_t c = 0; c < cols; c++)
            memcpy(nd->dst.data + c * nd->dst.nb[1] + (size_t)bound[rank] * 4,
                   nd->src[0].data + c * nd->src[0].nb[1], own);
        g->active = 1;
        g->active_tag = g->tag++;
        g->idle_since = t0;
        memset(g->out_done, 0, sizeof g->out_done);
        memset(g->in_done, 0, sizeof g->in_done);
    }
    const uint32_t tag = g->active_tag;
    const piece_head out = { tag, (uint32_t)rank, own * (uint64_t)cols };
    const uint64_t out_len = sizeof out + out.nbytes;
    const int64_t spin_until = t0 + (int64_t)g->spin_us * 1000;
    for (;;) {
        int moved = 0, done = 1;
        char *scratch = job->wdata;
        for (int r = 0; r < n; r++) {
            if (r == rank) continue;
            const uint64_t want = piece_bytes(nd, r), in_len = sizeof(piece_head) + want;
            if (step_send(g->fds[r], &out, nd->src[0].data, out_len, &g->out_done[r], &moved) < 0 ||
                step_recv(g->fds[r], g->in_head[r], scratch, in_len, &g->in_done[r], &moved) < 0) {
                end_group(g);
                gr_fail(job, GR_EXEC_EPEER, "the link to rank %d closed or failed", r);
                return;
            }
            if (g->in_done[r] >= sizeof(piece_head)) {
                piece_head in;
                memcpy(&in, g->in_head[r], sizeof in);
                if (in.tag != tag || in.rank != (uint32_t)r || in.nbytes != want) {
                    end_group(g);
                    gr_fail(job, GR_EXEC_EPEER, "rank %d sent a piece the graph does not expect: "
                            "the ranks' graphs differ", r);
                    return;
                }
            }
            done &= g->out_done[r] == out_len && g->in_done[r] == in_len;
            scratch += want;
        }
        if (done) break;
        const int64_t now = gr_now_ns();
        if (moved) g->idle_since = now;
        if (gr_canceled(job)) {
            g->active = 0;
            return;
        }
        if (now - g->idle_since > (int64_t)g->timeout_ms * 1000000) {
            end_group(g);
            gr_fail(job, GR_EXEC_EPEER, "no piece from a peer in %d ms", g->timeout_ms);
            return;
        }
        if (moved || now < spin_until) continue;
        if (gr_wait_pause(job)) {      /* another run waits for the pool: it goes first */
            g->ns += gr_now_ns() - t0;
            return;
        }
        struct pollfd pf[GR_PEERS_MAX];
        int np = 0;
        for (int r = 0; r < n; r++) {
            if (r == rank) continue;
            pf[np].fd = g->fds[r];
            pf[np].events = (short)((g->out_done[r] < out_len ? POLLOUT : 0) |
                                    (g->in_done[r] < sizeof(piece_head) + piece_bytes(nd, r) ? POLLIN : 0));
            pf[np++].revents = 0;
        }
        poll(pf, (nfds_t)np, 10);   /* wakes to see a cancel or a yield request */
    }
    g->active = 0;
    char *scratch = job->wdata;
    for (int r = 0; r < n; r++) {
        if (r == rank) continue;
        const size_t w = (size_t)(bound[r + 1] - bound[r]) * 4;
        for (int64_t c = 0; c < cols; c++)
            memcpy(nd->dst.data + c * nd->dst.nb[1] + (size_t)bound[r] * 4, scratch + c * w, w);
        scratch += w * (size_t)cols;
    }
    g->ns += gr_now_ns() - t0;
}
