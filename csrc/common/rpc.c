/* Wire checks, hashing and socket loops for ggmlrpc. */
#define _GNU_SOURCE
#include "common/rpc.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define GR_CMD(NAME, id, request, response) [id] = {#NAME, request, response},
const gr_command gr_commands[RPC_CMD_COUNT] = {
#include "common/commands.def"
};
#undef GR_CMD

/* (block size, bytes per block) per ggml_type id; zeros mark removed ids. */
static const struct { uint16_t blck; uint16_t size; } gr_types[GR_TYPE_COUNT] = {
    [0] = {1, 4},      /* F32 */
    [1] = {1, 2},      /* F16 */
    [2] = {32, 18},    /* Q4_0 */
    [3] = {32, 20},    /* Q4_1 */
    [6] = {32, 22},    /* Q5_0 */
    [7] = {32, 24},    /* Q5_1 */
    [8] = {32, 34},    /* Q8_0 */
    [9] = {32, 36},    /* Q8_1 */
    [10] = {256, 84},  /* Q2_K */
    [11] = {256, 110}, /* Q3_K */
    [12] = {256, 144}, /* Q4_K */
    [13] = {256, 176}, /* Q5_K */
    [14] = {256, 210}, /* Q6_K */
    [15] = {256, 292}, /* Q8_K */
    [16] = {256, 66},  /* IQ2_XXS */
    [17] = {256, 74},  /* IQ2_XS */
    [18] = {256, 98},  /* IQ3_XXS */
    [19] = {256, 50},  /* IQ1_S */
    [20] = {32, 18},   /* IQ4_NL */
    [21] = {256, 110}, /* IQ3_S */
    [22] = {256, 82},  /* IQ2_S */
    [23] = {256, 136}, /* IQ4_XS */
    [24] = {1, 1},     /* I8 */
    [25] = {1, 2},     /* I16 */
    [26] = {1, 4},     /* I32 */
    [27] = {1, 8},     /* I64 */
    [28] = {1, 8},     /* F64 */
    [29] = {256, 56},  /* IQ1_M */
    [30] = {1, 2},     /* BF16 */
    [34] = {256, 54},  /* TQ1_0 */
    [35] = {256, 66},  /* TQ2_0 */
    [39] = {32, 17},   /* MXFP4 */
    [40] = {64, 36},   /* NVFP4 */
    [41] = {128, 18},  /* Q1_0 */
    [42] = {64, 18},   /* Q2_0 */
};

int64_t ggmlrpc_blck_size(uint32_t type) {
    return type < GR_TYPE_COUNT ? gr_types[type].blck : 0;
}

size_t ggmlrpc_type_size(uint32_t type) {
    return type < GR_TYPE_COUNT ? gr_types[type].size : 0;
}

size_t ggmlrpc_row_size(uint32_t type, int64_t n) {
    const int64_t blck = ggmlrpc_blck_size(type);
    return blck > 0 ? (size_t)(n / blck) * ggmlrpc_type_size(type) : 0;
}

/* ggml_nbytes of a tensor described by type/ne/nb, computed in 64 bits.
 * Returns 0 when any ne is 0; sets *overflow when the arithmetic would overflow. */
static uint64_t ggmlrpc_nbytes(uint32_t type, const uint32_t ne[4], const uint32_t nb[4], int *overflow) {
    uint64_t blck = (uint64_t)ggmlrpc_blck_size(type);
    uint64_t tsize = ggmlrpc_type_size(type);
    *overflow = 0;
    for (int i = 0; i < 4; i++) {
        if (ne[i] == 0) return 0;
    }
    uint64_t n;
    if (blck == 1) {
        n = tsize;
    } else {
        /* ne[0] * nb[0] / blck: both factors < 2^32, so the product fits in 64 bits */
        n = (uint64_t)ne[0] * nb[0] / blck;
    }
    for (int i = (blck == 1 ? 0 : 1); i < 4; i++) {
        uint64_t term = (uint64_t)(ne[i] - 1) * nb[i]; /* < 2^64: both < 2^32 */
        if (n + term < n) { *overflow = 1; return 0; }
        n += term;
    }
    return n;
}

int ggmlrpc_tensor_check_shape(const rpc_tensor *t, uint64_t *nbytes) {
    int64_t blck = ggmlrpc_blck_size(t->type);
    if (blck == 0) return GR_ERR_TYPE;
    if (t->ne[0] % (uint64_t)blck != 0) return GR_ERR_BLOCK;
    /* element count: product of four u32 values must fit in int64 as ggml counts it */
    unsigned __int128 elems = 1;
    for (int i = 0; i < 4; i++) elems *= t->ne[i];
    if (elems > (unsigned __int128)INT64_MAX) return GR_ERR_OVERFLOW;
    int ovf = 0;
    uint64_t n = ggmlrpc_nbytes(t->type, t->ne, t->nb, &ovf);
    if (ovf) return GR_ERR_OVERFLOW;
    *nbytes = n;
    return GR_OK;
}

int ggmlrpc_range_inside(uint64_t data, uint64_t nbytes, uint64_t base, uint64_t size) {
    if (data < base) return 0;
    uint64_t off = data - base;
    if (off > size) return 0;
    return nbytes <= size - off;
}

uint64_t ggmlrpc_fnv1a(const uint8_t *data, size_t len, uint64_t hash) {
    const uint64_t prime = 0x100000001b3ULL;
    size_t i = 0;
    /* the byte-serial dependency chain is the cost; unrolling trims loop overhead */
    for (; i + 8 <= len; i += 8) {
        hash = (hash ^ data[i + 0]) * prime;
        hash = (hash ^ data[i + 1]) * prime;
        hash = (hash ^ data[i + 2]) * prime;
        hash = (hash ^ data[i + 3]) * prime;
        hash = (hash ^ data[i + 4]) * prime;
        hash = (hash ^ data[i + 5]) * prime;
        hash = (hash ^ data[i + 6]) * prime;
        hash = (hash ^ data[i + 7]) * prime;
    }
    for (; i < len; i++) hash = (hash ^ data[i]) * prime;
    return hash;
}

/* Wait until fd is ready for `events`; 0 ready, -3 timeout, -1 error. */
static int gr_wait(int fd, short events, int timeout_ms) {
    if (timeout_ms < 0) return 0; /* blocking socket: the call itself waits */
    struct pollfd p = {fd, events, 0};
    for (;;) {
        int r = poll(&p, 1, timeout_ms);
        if (r > 0) return 0;
        if (r == 0) return -3;
        if (errno != EINTR) return -1;
    }
}

int ggmlrpc_recv_all(int fd, void *dst, size_t n, int timeout_ms) {
    uint8_t *p = (uint8_t *)dst;
    while (n > 0) {
        int w = gr_wait(fd, POLLIN, timeout_ms);
        if (w) return w;
        ssize_t r = recv(fd, p, n, timeout_ms < 0 ? MSG_WAITALL : MSG_DONTWAIT);
        if (r > 0) { p += r; n -= (size_t)r; continue; }
        if (r == 0) return -2;
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        return -1;
    }
    return 0;
}

int ggmlrpc_send_all(int fd, const void *src, size_t n, int timeout_ms) {
    return ggmlrpc_send2(fd, src, n, NULL, 0, timeout_ms);
}

int ggmlrpc_send2(int fd, const void *a, size_t na, const void *b, size_t nb, int timeout_ms) {
    const void *bufs[2] = {a, b};
    size_t lens[2] = {na, nb};
    return ggmlrpc_sendv(fd, bufs, lens, 2, timeout_ms);
}

int ggmlrpc_sendv(int fd, const void *const *bufs, const size_t *lens, int n, int timeout_ms) {
    struct iovec iov[GR_SENDV_MAX];
    if (n < 0 || n > GR_SENDV_MAX) { errno = EINVAL; return -1; }
    for (int i = 0; i < n; i++) { iov[i].iov_base = (void *)bufs[i]; iov[i].iov_len = lens[i]; }
    int idx = 0;
    while (idx < n) {
        if (iov[idx].iov_len == 0) { idx++; continue; }
        int w = gr_wait(fd, POLLOUT, timeout_ms);
        if (w) return w;
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = &iov[idx];
        msg.msg_iovlen = (size_t)(n - idx);
        ssize_t r = sendmsg(fd, &msg, MSG_NOSIGNAL | (timeout_ms < 0 ? 0 : MSG_DONTWAIT));
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return -1;
        }
        size_t left = (size_t)r;
        while (idx < n && left >= iov[idx].iov_len) { left -= iov[idx].iov_len; iov[idx].iov_len = 0; idx++; }
        if (idx < n) {
            iov[idx].iov_base = (uint8_t *)iov[idx].iov_base + left;
            iov[idx].iov_len -= left;
        }
    }
    return 0;
}

int ggmlrpc_recv_some(int fd, void *dst, size_t cap, size_t min, int timeout_ms, size_t *got) {
    uint8_t *p = (uint8_t *)dst;
    size_t have = 0;
    while (have < min) {
        int w = gr_wait(fd, POLLIN, timeout_ms);
        if (w) return w;
        ssize_t r = recv(fd, p + have, cap - have, timeout_ms < 0 ? 0 : MSG_DONTWAIT);
        if (r > 0) { have += (size_t)r; continue; }
        if (r == 0) return -2;
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        return -1;
    }
    *got = have;
    return 0;
}

int ggmlrpc_discard(int fd, uint64_t n, int timeout_ms) {
    uint8_t scratch[65536];
    while (n > 0) {
        size_t k = n < sizeof scratch ? (size_t)n : sizeof scratch;
        int r = ggmlrpc_recv_all(fd, scratch, k, timeout_ms);
        if (r) return r;
        n -= k;
    }
    return 0;
}

void *ggmlrpc_host_alloc(size_t size) {
    if (size == 0) return NULL;
    if (size <= GGMLRPC_HOST_SMALL) {
        /* from the heap: below malloc's mapping threshold, so thousands of small
         * buffers cost no mapping each (the kernel caps mappings per process) */
        size_t padded = (size + 63) & ~(size_t)63;
        void *q = aligned_alloc(64, padded);
        if (q) memset(q, 0, padded);
        return q;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    if (size >= (2u << 20)) madvise(p, size, MADV_HUGEPAGE);
#endif
    return p;
}

void ggmlrpc_host_free(void *ptr, size_t size) {
    if (!ptr || !size) return;
    if (size <= GGMLRPC_HOST_SMALL)
        free(ptr);
    else
        munmap(ptr, size);
}
