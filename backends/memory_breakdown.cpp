// A C shim over llama.cpp's C++-only API (src/llama-ext.h, commit 0c1e57098), so that Python can
// read exact byte counts through ctypes. No llama header is needed: the few types used are
// declared here with the same layout and the same names (hence the same C++ mangled symbols).
//
// Built on first use by schedplan.backends.llama_cpp_run, linked against the libllama.so.0 of the
// installed llama_cpp package (the copy the Python bindings already loaded: same soname).

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

struct ggml_backend_buffer_type;
struct ggml_backend_device;
struct llama_context;

// src/llama-model.h: only the exported const member functions used below are declared.
struct llama_model {
    uint32_t n_gpu_layers() const;   // params.n_gpu_layers >= 0 ? it : n_layer_all + 1
};

// src/llama-ext.h
struct llama_memory_breakdown_data {
    size_t model   = 0;  // memory allocated for the model
    size_t context = 0;  // memory allocated for the context (llama_memory: the KV cache)
    size_t compute = 0;  // memory allocated for temporary compute buffers
};

using llama_memory_breakdown = std::map<ggml_backend_buffer_type *, llama_memory_breakdown_data>;

llama_memory_breakdown llama_get_memory_breakdown(const llama_context * ctx);
int32_t                llama_model_n_devices(const llama_model * model);
ggml_backend_device *  llama_model_get_device(const llama_model * model, int i);

// src/llama-adapter.h: struct llama_adapter_lora's leading members, laid out alike (the map's value,
// llama_adapter_lora_weight, is two tensor pointers; ggml_context_ptr and ggml_backend_buffer_ptr are
// unique_ptrs with empty deleters, one pointer each)
struct sp_adapter_lora {
    void * model;
    std::unordered_map<std::string, std::pair<void *, void *>> ab_map;
    std::vector<void *> ctxs;
    std::vector<void *> bufs;
    float alpha;
};

extern "C" {

// Fills up to `cap` entries; returns the number of buffer types in the breakdown (may exceed cap).
int sp_memory_breakdown(const llama_context * ctx, int cap, void ** bufts, size_t * model, size_t * context,
                        size_t * compute) {
    const llama_memory_breakdown mb = llama_get_memory_breakdown(ctx);
    int i = 0;
    for (const auto & [buft, data] : mb) {
        if (i < cap) {
            bufts[i]   = buft;
            model[i]   = data.model;
            context[i] = data.context;
            compute[i] = data.compute;
        }
        i++;
    }
    return i;
}

// The model's devices (llama_model::devices), in llama.cpp's order; returns their number.
int sp_model_devices(const llama_model * model, int cap, void ** devs) {
    const int n = llama_model_n_devices(model);
    for (int i = 0; i < n && i < cap; i++) {
        devs[i] = llama_model_get_device(model, i);
    }
    return n;
}

uint32_t sp_model_n_gpu_layers(const llama_model * model) {
    return model->n_gpu_layers();
}

// A LoRA adapter's buffers (llama_adapter_lora::bufs, one per buffer type), its number of lora_a/lora_b
// pairs and alpha; returns the number of buffers.
int sp_lora_buffers(const void * adapter, int cap, void ** bufs, size_t * n_pairs, float * alpha) {
    const auto * a = static_cast<const sp_adapter_lora *>(adapter);
    const int n = (int) a->bufs.size();
    for (int i = 0; i < n && i < cap; i++) {
        bufs[i] = a->bufs[i];
    }
    *n_pairs = a->ab_map.size();
    *alpha = a->alpha;
    return n;
}

}  // extern "C"
