/* Preloaded into a ggml program (test-backend-ops, test-llama-archs) to add RPC servers
 * as devices.
 *
 * GGMLRPC_SERVERS="host:port[,host:port...]": each endpoint is handed to
 * ggml_backend_rpc_add_server() and its registry added to ggml's list before main()
 * runs, so the program sees the servers as backends RPC0, RPC1, ... Built at test
 * time against the reference build's shared libraries (libggml, libggml-rpc).
 *
 * A program that logs through llama.cpp's common library (test-llama-archs) queues its
 * lines for a thread that is never joined: at exit the last lines, the summary among
 * them, may be lost. When that library is loaded, its log is flushed at exit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* from ggml-backend.h / ggml-rpc.h; declared here so that only the libraries are needed */
typedef struct ggml_backend_reg * ggml_backend_reg_t;
ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint);
void ggml_backend_register(ggml_backend_reg_t reg);

/* common_log_main() and common_log_pause() of libllama-common (C++ names), weak:
 * absent from programs without it */
struct common_log;
extern struct common_log * common_log_main(void) __asm__("_Z15common_log_mainv") __attribute__((weak));
extern void common_log_pause(struct common_log * log) __asm__("_Z16common_log_pauseP10common_log")
    __attribute__((weak));

__attribute__((destructor)) static void ggmlrpc_flush_log(void) {
    if (common_log_main != NULL && common_log_pause != NULL) {
        common_log_pause(common_log_main());
    }
}

__attribute__((constructor)) static void ggmlrpc_register_servers(void) {
    const char * list = getenv("GGMLRPC_SERVERS");
    if (list == NULL) {
        return;
    }
    while (*list) {
        const char * end = strchr(list, ',');
        size_t n = end ? (size_t)(end - list) : strlen(list);
        if (n > 0) {
            char endpoint[256];
            if (n >= sizeof endpoint) {
                fprintf(stderr, "rpc_register: endpoint too long\n");
                exit(2);
            }
            memcpy(endpoint, list, n);
            endpoint[n] = '\0';
            ggml_backend_reg_t reg = ggml_backend_rpc_add_server(endpoint);
            if (reg == NULL) {
                fprintf(stderr, "rpc_register: cannot add %s\n", endpoint);
                exit(2);
            }
            ggml_backend_register(reg);
        }
        list += n + (end != NULL);
    }
}
