/* The prototypes of every kernel and scratch rule of kernels.def. Internal to
 * csrc/cpu/: exec.c dispatches through them, each ops file defines its own. */
#ifndef GGMLRPC_CPU_KERNELS_H
#define GGMLRPC_CPU_KERNELS_H

#include <stddef.h>

#include "cpu/job.h"

#define GR_KERNEL(NAME, fn, phases, wsize) \
    void fn(gr_job *job, int phase);       \
    size_t wsize(const gr_node *n, int nth);
#include "cpu/kernels.def"

#endif
