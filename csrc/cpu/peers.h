/* Links between the servers of one -sm row group (ggmlrpc/peers.py): the sockets a
 * PEER_GATHER node swaps its pieces over. Python makes one per group and points the
 * nodes at it (gr_node.iparams[0]); it outlives every plan that points at it. */
#ifndef GGMLRPC_PEERS_H
#define GGMLRPC_PEERS_H

#include <stdint.h>

#define GR_PEERS_MAX 16

typedef struct gr_peers {
    int32_t fds[GR_PEERS_MAX];   /* the link to each rank (-1 for this one) */
    uint32_t tag;                /* the group's exchanges so far */
    int32_t failed;              /* set by the first failed exchange: the rest fail at once */
    int32_t timeout_ms;          /* the most one exchange waits without a byte */
    int32_t spin_us;             /* how long it polls without sleeping first */
    int64_t ns;                  /* time spent in exchanges (copies, sends, waits) */
    /* the exchange in progress, kept while its run yields the pool to another */
    int32_t active;
    uint32_t active_tag;
    int64_t idle_since;          /* when a byte last moved */
    uint64_t out_done[GR_PEERS_MAX], in_done[GR_PEERS_MAX];
    unsigned char in_head[GR_PEERS_MAX][16];
} gr_peers;

#endif
