/* PEER_GATHER (ggmlrpc/peers.py's OP_GATHER): the ranks of a group each hold rows
 * [bound[r], bound[r+1]) of every column of an F32 tensor; each sends its piece to
 * every other rank and receives theirs, so that every rank ends with the whole.
 * op_params: n, rank, bound[n + 1]; iparams[0]: the group's gr_peers; src[0]: this
 * rank's piece (rows one after the other), dst: the whole (contiguous). Thread 0 does
 * it all (the others wait at the node's barrier). The sockets are written and read
 * without blocking, both ways at once (two ranks sending megabytes to each other
 * never wait on each other), polling for spin_us before it sleeps in poll(). A message
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

typedef struct {
    int fd;
    piece_head out_head, in_head;
    size_t out_done, out_len;      /* head + data sent */
    size_t in_done, in_len;        /* head + data received */
    char *in_data;
} link_state;

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

/* moves what it can without blocking; -1 on a closed or failed link */
static int step_send(link_state *l, const char *data, int *moved) {
    while (l->out_done < l->out_len) {
        const size_t h = sizeof l->out_head;
        const char *p = l->out_done < h ? (const char *)&l->out_head + l->out_done : data + (l->out_done - h);
        const size_t left = l->out_done < h ? h - l->out_done : l->out_len - l->out_done;
        const ssize_t k = send(l->fd, p, left, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        l->out_done += (size_t)k;
        *moved = 1;
    }
    return 0;
}

static int step_recv(link_state *l, int *moved) {
    while (l->in_done < l->in_len) {
        const size_t h = sizeof l->in_head;
        char *p = l->in_done < h ? (char *)&l->in_head + l->in_done : l->in_data + (l->in_done - h);
        const size_t left = l->in_done < h ? h - l->in_done : l->in_len - l->in_done;
        const ssize_t k = recv(l->fd, p, left, MSG_DONTWAIT);
        if (k == 0) return -1;
        if (k < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        l->in_done += (size_t)k;
        *moved = 1;
    }
    return 0;
}

void gr_k_peer_gather(gr_job *job, int phase) {
    (void)phase;
    if (job->ith != 0) return;
    const gr_node *nd = job->node;
    gr_peers *g = (gr_peers *)(intptr_t)nd->iparams[0];
    const int n = nd->op_params[0], rank = nd->op_params[1];
    const int32_t *bound = &nd->op_params[2];
    const int64_t cols = nd->dst.ne[1];
    if (g->failed) {
        gr_fail(job, GR_EXEC_EPEER, "the peer group failed earlier");
        return;
    }
    const int64_t t0 = gr_now_ns();
    const size_t own = (size_t)(bound[rank + 1] - bound[rank]) * 4;
    for (int64_t c = 0; c < cols; c++)
        memcpy(nd->dst.data + c * nd->dst.nb[1] + (size_t)bound[rank] * 4, nd->src[0].data + c * nd->src[0].nb[1], own);
    const uint32_t tag = g->tag++;
    link_state links[GR_PEERS_MAX];
    int nl = 0;
    char *scratch = job->wdata;
    for (int r = 0; r < n; r++) {
        if (r == rank) continue;
        link_state *l = &links[nl++];
        memset(l, 0, sizeof *l);
        l->fd = g->fds[r];
        l->out_head = (piece_head){ tag, (uint32_t)rank, own * (uint64_t)cols };
        l->out_len = sizeof l->out_head + own * (size_t)cols;
        l->in_len = sizeof l->in_head + piece_bytes(nd, r);
        l->in_data = scratch;
        scratch += piece_bytes(nd, r);
    }
    const int64_t spin_until = gr_now_ns() + (int64_t)g->spin_us * 1000;
    int64_t idle_since = gr_now_ns();
    for (;;) {
        int moved = 0, done = 1;
        for (int i = 0; i < nl; i++) {
            link_state *l = &links[i];
            if (step_send(l, nd->src[0].data, &moved) < 0 || step_recv(l, &moved) < 0) {
                g->failed = 1;
                gr_fail(job, GR_EXEC_EPEER, "the link to a peer closed or failed (errno %d)", errno);
                return;
            }
            if (l->in_done >= sizeof l->in_head) {
                const int r = i < rank ? i : i + 1;
                if (l->in_head.tag != tag || l->in_head.rank != (uint32_t)r ||
                    l->in_head.nbytes != l->in_len - sizeof l->in_head) {
                    g->failed = 1;
                    gr_fail(job, GR_EXEC_EPEER, "rank %d sent piece %u of rank %u (%llu bytes), expected "
                            "piece %u (%llu bytes): the ranks' graphs differ", r, l->in_head.tag,
                            l->in_head.rank, (unsigned long long)l->in_head.nbytes, tag,
                            (unsigned long long)(l->in_len - sizeof l->in_head));
                    return;
                }
            }
            done &= l->out_done == l->out_len && l->in_done == l->in_len;
        }
        if (done) break;
        const int64_t now = gr_now_ns();
        if (moved) idle_since = now;
        if (gr_canceled(job)) return;
        if (now - idle_since > (int64_t)g->timeout_ms * 1000000) {
            g->failed = 1;
            gr_fail(job, GR_EXEC_EPEER, "no piece from a peer for %d ms", g->timeout_ms);
            return;
        }
        if (moved || now < spin_until) continue;
        struct pollfd pf[GR_PEERS_MAX];
        for (int i = 0; i < nl; i++) {
            pf[i].fd = links[i].fd;
            pf[i].events = (short)((links[i].out_done < links[i].out_len ? POLLOUT : 0) |
                                   (links[i].in_done < links[i].in_len ? POLLIN : 0));
            pf[i].revents = 0;
        }
        poll(pf, (nfds_t)nl, 50);   /* wakes to see a cancel request */
    }
    scratch = job->wdata;
    for (int r = 0; r < n; r++) {
        if (r == rank) continue;
        const size_t w = (size_t)(bound[r + 1] - bound[r]) * 4;
        for (int64_t c = 0; c < cols; c++)
            memcpy(nd->dst.data + c * nd->dst.nb[1] + (size_t)bound[r] * 4, scratch + c * w, w);
        scratch += w * (size_t)cols;
    }
    g->ns += gr_now_ns() - t0;
}
