/* Sizes computed from client numbers (shapes, counts, op params): every product and
 * sum goes through these. They saturate at GR_SIZE_OVER (SIZE_MAX), a size that no
 * allocation and no memory limit admits, so an overflow ends in a refused plan,
 * never in a short buffer that a kernel then writes past. Once saturated a size
 * stays saturated through further sums, products (by nonzero factors) and
 * roundings. */
#ifndef GGMLRPC_CHECKED_H
#define GGMLRPC_CHECKED_H

#include <stddef.h>
#include <stdint.h>

#define GR_SIZE_OVER SIZE_MAX

/* a count as a size; a negative count (never valid) saturates */
static inline size_t gr_sz(int64_t v) { return v < 0 ? GR_SIZE_OVER : (size_t)v; }

static inline size_t gr_sz_mul(size_t a, size_t b) {
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? GR_SIZE_OVER : r;
}

static inline size_t gr_sz_add(size_t a, size_t b) {
    size_t r;
    return __builtin_add_overflow(a, b, &r) ? GR_SIZE_OVER : r;
}

static inline size_t gr_sz_mul3(size_t a, size_t b, size_t c) { return gr_sz_mul(gr_sz_mul(a, b), c); }

/* x rounded up to a multiple of m (a power of two) */
static inline size_t gr_sz_round(size_t x, size_t m) {
    return x > GR_SIZE_OVER - (m - 1) ? GR_SIZE_OVER : (x + m - 1) & ~(m - 1);
}

#endif
