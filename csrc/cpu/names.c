/* ggmlrpc_exec_names (exec.h): every integer the Python planner shares with the
 * kernels, by name, straight from the tables. */
#include <stddef.h>

#include "cpu/exec.h"

const gr_named_int ggmlrpc_exec_names[] = {
#define GR_KERNEL(NAME, fn, phases, wsize) { "KERNEL", NULL, #NAME, GR_K_##NAME },
#define GR_VARIANT(KERNEL, NAME, value) { "VARIANT", #KERNEL, #NAME, value },
#include "cpu/kernels.def"
#define GR_BINOP(NAME, value) { "BINOP", NULL, #NAME, value },
#define GR_UNOP(NAME, value) { "UNOP", NULL, #NAME, value },
#define GR_FAMILY(NAME, value, py) { "FAMILY", NULL, py, value },
#define GR_EXEC_ERROR(NAME, value) { "EXEC_ERROR", NULL, #NAME, value },
#define GR_CONST(GROUP, NAME, cname, value) { "CONST", #GROUP, #NAME, value },
#include "cpu/names.def"
    { NULL, NULL, NULL, 0 },
};
