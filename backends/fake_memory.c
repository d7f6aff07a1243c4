// LD_PRELOAD into a ggml RPC server: ggml_backend_dev_memory (ggml/src/ggml-backend.cpp) reports
// SCHEDPLAN_DEV_FREE and SCHEDPLAN_DEV_TOTAL bytes, so a CPU-only machine can serve a device of any
// budget to llama.cpp's --fit (the server answers RPC_CMD_GET_DEVICE_MEMORY with this function).
#include <stddef.h>
#include <stdlib.h>

void ggml_backend_dev_memory(void * device, size_t * free, size_t * total) {
    (void) device;
    *free  = strtoull(getenv("SCHEDPLAN_DEV_FREE"), NULL, 10);
    *total = strtoull(getenv("SCHEDPLAN_DEV_TOTAL"), NULL, 10);
}
