// LD_PRELOAD: every backend buffer a llama.cpp process allocates and frees over its life, in order,
// written to the file SCHEDPLAN_BUFFER_LOG names (appended, one line per event, tab-separated):
//   seq  event  scope  buft  size  buffer  stack
// - alloc: ggml_backend_buft_alloc_buffer (ggml/src/ggml-backend.cpp): model weights, KV caches,
//   output buffers, every compute buffer chunk of ggml-alloc (ggml_vbuffer_alloc), tensors allocated
//   from a context (ggml_backend_alloc_ctx_tensors_from_buft goes through it). size: the buffer's own
//   (ggml_backend_buffer_get_size), after the backend's padding.
// - map: ggml_backend_dev_buffer_from_host_ptr (mmap'd weights).
// - free: ggml_backend_buffer_free, with the size and buffer type of the buffer freed.
// - begin/end: the llama API calls that allocate, so each buffer is attributed to its owner: scope
//   "model" (llama_model_load_from_file/_splits), "ctxN" (llama_init_from_model: N counts the
//   contexts created), "ctxN.decode" (llama_process/llama_decode/llama_encode on that context),
//   "free.ctxN" (llama_free); "-" outside them (a projector's buffers: mtmd_init_from_file).
// stack: up to 12 callers' dynamic symbols (dladdr; "?" where a frame has none), innermost first,
// comma-separated: which function inside the owner allocated (llama_context::output_reserve,
// llama_context::sched_reserve, llama_kv_cache::llama_kv_cache, ...).
// Calls inside libggml-base go through its PLT (the build does not bind them locally), so the wrappers
// see ggml-alloc's allocations too.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// the llama API's parameter structs are passed by value: their layout comes from llama.h (include/ of
// the llama.cpp source the library is built against; ggml/include/ for ggml-backend.h)
#include "llama.h"

typedef ggml_backend_buffer_type_t buft_t;
typedef ggml_backend_buffer_t buffer_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static FILE * out;
static unsigned long seq;
static __thread char scope[64] = "-";

#define MAX_CTX 64
static void * contexts[MAX_CTX];
static int n_contexts;

static void * next(const char * name) {
    return dlsym(RTLD_NEXT, name);
}

static void stack(char * buf, size_t cap) {
    void * frames[14];
    int n = backtrace(frames, 14);
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 2; i < n && len + 2 < cap; i++) {      // 0: stack(), 1: the wrapper
        Dl_info info;
        const char * name = dladdr(frames[i], &info) && info.dli_sname ? info.dli_sname : "?";
        len += snprintf(buf + len, cap - len, "%s%s", len ? "," : "", name);
    }
}

static void emit(const char * event, const char * buft, size_t size, const void * buffer, int with_stack) {
    char frames[2048] = "-";
    if (with_stack) {
        stack(frames, sizeof(frames));
    }
    pthread_mutex_lock(&lock);
    if (!out) {
        const char * path = getenv("SCHEDPLAN_BUFFER_LOG");
        out = fopen(path ? path : "/dev/null", "a");
    }
    if (out) {
        fprintf(out, "%lu\t%s\t%s\t%s\t%zu\t%p\t%s\n", seq++, event, scope, buft ? buft : "-", size, buffer, frames);
        fflush(out);
    }
    pthread_mutex_unlock(&lock);
}

static int context_id(const void * ctx) {
    pthread_mutex_lock(&lock);
    int id = -1;
    for (int i = 0; i < n_contexts; i++) {
        if (contexts[i] == ctx) {
            id = i;
        }
    }
    pthread_mutex_unlock(&lock);
    return id;
}

// scope helpers: set for the call, restored after (calls nest: a context created while loading)
#define SCOPED(label, call)                                         \
    char saved[sizeof(scope)];                                      \
    memcpy(saved, scope, sizeof(scope));                            \
    snprintf(scope, sizeof(scope), "%s", label);                    \
    emit("begin", NULL, 0, NULL, 0);                                \
    call;                                                           \
    emit("end", NULL, 0, NULL, 0);                                  \
    memcpy(scope, saved, sizeof(scope));

buffer_t ggml_backend_buft_alloc_buffer(buft_t buft, size_t size) {
    static buffer_t (*real)(buft_t, size_t);
    if (!real) real = (buffer_t (*)(buft_t, size_t)) next("ggml_backend_buft_alloc_buffer");
    buffer_t buffer = real(buft, size);
    emit("alloc", ggml_backend_buft_name(buft), buffer ? ggml_backend_buffer_get_size(buffer) : 0, buffer, 1);
    return buffer;
}

buffer_t ggml_backend_dev_buffer_from_host_ptr(ggml_backend_dev_t device, void * ptr, size_t size, size_t max_tensor_size) {
    static buffer_t (*real)(ggml_backend_dev_t, void *, size_t, size_t);
    if (!real) real = (buffer_t (*)(ggml_backend_dev_t, void *, size_t, size_t)) next("ggml_backend_dev_buffer_from_host_ptr");
    buffer_t buffer = real(device, ptr, size, max_tensor_size);
    emit("map", buffer ? ggml_backend_buft_name(ggml_backend_buffer_get_type(buffer)) : "-",
         buffer ? ggml_backend_buffer_get_size(buffer) : 0, buffer, 1);
    return buffer;
}

void ggml_backend_buffer_free(buffer_t buffer) {
    static void (*real)(buffer_t);
    if (!real) real = (void (*)(buffer_t)) next("ggml_backend_buffer_free");
    if (buffer) {
        emit("free", ggml_backend_buft_name(ggml_backend_buffer_get_type(buffer)), ggml_backend_buffer_get_size(buffer),
             buffer, 0);
    }
    real(buffer);
}

struct llama_model * llama_model_load_from_file(const char * path, struct llama_model_params params) {
    static struct llama_model * (*real)(const char *, struct llama_model_params);
    if (!real) real = (struct llama_model * (*)(const char *, struct llama_model_params)) next("llama_model_load_from_file");
    struct llama_model * model;
    SCOPED("model", model = real(path, params));
    return model;
}

struct llama_model * llama_model_load_from_splits(const char ** paths, size_t n_paths, struct llama_model_params params) {
    static struct llama_model * (*real)(const char **, size_t, struct llama_model_params);
    if (!real) real = (struct llama_model * (*)(const char **, size_t, struct llama_model_params)) next("llama_model_load_from_splits");
    struct llama_model * model;
    SCOPED("model", model = real(paths, n_paths, params));
    return model;
}

struct llama_context * llama_init_from_model(struct llama_model * model, struct llama_context_params params) {
    static struct llama_context * (*real)(struct llama_model *, struct llama_context_params);
    if (!real) real = (struct llama_context * (*)(struct llama_model *, struct llama_context_params)) next("llama_init_from_model");
    char label[32];
    pthread_mutex_lock(&lock);
    int id = n_contexts < MAX_CTX ? n_contexts++ : MAX_CTX - 1;
    pthread_mutex_unlock(&lock);
    snprintf(label, sizeof(label), "ctx%d", id);
    struct llama_context * ctx;
    SCOPED(label, ctx = real(model, params));
    contexts[id] = ctx;
    return ctx;
}

void llama_free(struct llama_context * ctx) {
    static void (*real)(struct llama_context *);
    if (!real) real = (void (*)(struct llama_context *)) next("llama_free");
    char label[32];
    snprintf(label, sizeof(label), "free.ctx%d", context_id(ctx));
    SCOPED(label, real(ctx));
}

int32_t llama_process(struct llama_context * ctx, enum llama_process_type type, struct llama_batch_ext * batch) {
    static int32_t (*real)(struct llama_context *, enum llama_process_type, struct llama_batch_ext *);
    if (!real) real = (int32_t (*)(struct llama_context *, enum llama_process_type, struct llama_batch_ext *)) next("llama_process");
    char label[32];
    snprintf(label, sizeof(label), "ctx%d.%s", context_id(ctx), type == LLAMA_PROCESS_TYPE_ENCODE ? "encode" : "decode");
    int32_t ret;
    SCOPED(label, ret = real(ctx, type, batch));
    return ret;
}

int32_t llama_decode(struct llama_context * ctx, struct llama_batch batch) {
    static int32_t (*real)(struct llama_context *, struct llama_batch);
    if (!real) real = (int32_t (*)(struct llama_context *, struct llama_batch)) next("llama_decode");
    char label[32];
    snprintf(label, sizeof(label), "ctx%d.decode", context_id(ctx));
    int32_t ret;
    SCOPED(label, ret = real(ctx, batch));
    return ret;
}

int32_t llama_encode(struct llama_context * ctx, struct llama_batch batch) {
    static int32_t (*real)(struct llama_context *, struct llama_batch);
    if (!real) real = (int32_t (*)(struct llama_context *, struct llama_batch)) next("llama_encode");
    char label[32];
    snprintf(label, sizeof(label), "ctx%d.encode", context_id(ctx));
    int32_t ret;
    SCOPED(label, ret = real(ctx, batch));
    return ret;
}
