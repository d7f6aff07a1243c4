"""LoRA adapters as src/llama-adapter.cpp loads them (llama_adapter_lora_init_impl): the adapter's
GGUF header is read and checked against the base model, each lora_a/lora_b pair is duplicated into
a ggml context per buffer type (the base weight's buffer type; the CPU's where the base weight sits
in a CPU extra buffer type such as CPU_REPACK), and each context gets one buffer
(ggml_backend_alloc_ctx_tensors_from_buft). The graph reads them in build_lora_mm (planner/graph.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from . import ggml
from .gallocr import alloc_ctx_tensors
from .ggml import Buffer, Tensor
from .gguf import ARRAY, FLOAT32, STRING, UINT32, GGUFError, read_header
from .hparams import UnsupportedModel
from .model import Model

if TYPE_CHECKING:
    from ..backends.types import BufferType


class AdapterRefused(UnsupportedModel):
    """An adapter llama_adapter_lora_init refuses (it throws; llama-server then fails to load)."""


@dataclass
class LoraWeight:
    """llama_adapter_lora_weight: the adapter's two tensors for one base weight."""
    a: Tensor
    b: Tensor

    def get_scale(self, alpha: float, adapter_scale: float) -> float:
        rank = float(self.b.ne[0])
        return adapter_scale * alpha / rank if alpha else adapter_scale


@dataclass(eq=False)
class LoraAdapter:
    """llama_adapter_lora: the pairs by base weight name (ab_map), their buffers, alpha."""
    path: str
    alpha: float
    ab_map: dict[str, LoraWeight] = field(default_factory=dict)
    bufs: list[Buffer] = field(default_factory=list)

    def get_weight(self, w: Tensor):
        """llama_adapter_lora::get_weight: by the weight's name."""
        return self.ab_map.get(w.name)

    def buffers(self) -> dict[str, int]:
        """Per buffer type name, the bytes of this adapter's buffers."""
        out: dict[str, int] = {}
        for b in self.bufs:
            out[b.buft.name] = out.get(b.buft.name, 0) + b.size
        return out


def alloc_buffer(buft: "BufferType", tensors: list[Tensor]) -> Buffer:
    """ggml_backend_alloc_ctx_tensors_from_buft: the tensors padded to the buffer type's alignment, in
    one buffer of what the buffer type makes of that size (Vulkan_Host adds 32 bytes)."""
    buf = alloc_ctx_tensors(buft, tensors, usage="any")
    buf.size = buft.buffer_size(buf.size)
    return buf


def llama_adapter_lora_init(model: Model, path: str, cpu_buft) -> LoraAdapter:
    """llama_adapter_lora_init_impl. cpu_buft: the CPU device's buffer type, where the adapter of a
    weight held in a CPU extra buffer type goes ("lora for '...' cannot use buft '...', fallback to CPU")."""
    def refuse(what: str):
        # llama_adapter_lora_init_from_file_ptr logs "failed to apply lora adapter: <what>" and returns
        # NULL; common_init_result then fails ("failed to load lora adapter '<path>'")
        raise AdapterRefused(f"{path}: llama.cpp refuses the LoRA adapter: {what}")

    try:
        hdr = read_header(path)
    except GGUFError as e:
        refuse(f"failed to load lora adapter from file ({e})")
    md = hdr.metadata

    def kv_str(key: str) -> str:
        v = md.get(key)
        if v is not None and hdr.kv_types[key][0] != STRING:   # gguf_get_val_str asserts the type
            raise ggml.GGMLAbort(f"llama.cpp would abort loading the LoRA adapter {path} (gguf.cpp GGML_ASSERT: "
                                 f"{key} is not a string)")
        return v or ""

    general_type = kv_str("general.type")
    if general_type != "adapter":
        refuse(f"expect general.type to be 'adapter', but got: {general_type}")
    if kv_str("general.architecture") != model.hparams.arch:
        refuse("model arch and LoRA arch mismatch")
    adapter_type = kv_str("adapter.type")
    if adapter_type != "lora":
        refuse(f"expect adapter.type to be 'lora', but got: {adapter_type}")
    alpha = md.get("adapter.lora.alpha", 0.0)
    if "adapter.lora.alpha" in md and hdr.kv_types["adapter.lora.alpha"][0] != FLOAT32:   # gguf_get_val_f32 asserts
        raise ggml.GGMLAbort(f"llama.cpp would abort loading the LoRA adapter {path} (gguf.cpp GGML_ASSERT: "
                             f"adapter.lora.alpha is not a float32)")
    key = "adapter.alora.invocation_tokens"
    if key in hdr.kv_types:
        kv_type, arr_type = hdr.kv_types[key]
        if kv_type != ARRAY:
            refuse(f"invalid gguf type for {key}")
        if arr_type != UINT32:
            refuse(f"invalid gguf element type for {key}")

    # bundle lora_a and lora_b into pairs (a std::map: by name)
    pairs: dict[str, list] = {}
    for info in hdr.tensors:
        name = info.name
        if name.endswith(".lora_a"):
            pairs.setdefault(name.replace(".lora_a", ""), [None, None])[0] = info
        elif name.endswith(".lora_b"):
            pairs.setdefault(name.replace(".lora_b", ""), [None, None])[1] = info
        elif name.endswith("_norm.weight"):
            continue      # "TODO: add support for norm vector"
        else:
            refuse(f"LoRA tensor '{name}' has unexpected suffix")

    adapter = LoraAdapter(path, alpha)
    ctx_map: dict[int, tuple] = {}     # buft -> (buft, tensors)
    for name in sorted(pairs):
        a, b = pairs[name]
        if a is None or b is None:
            refuse(f"LoRA tensor pair for '{name}' is missing one component")
        model_tensor = model.tensors_by_name.get(name)
        if model_tensor is None:
            refuse(f"LoRA tensor '{name}' does not exist in base model (hint: maybe wrong base model?)")
        buft = model_tensor.buffer.buft
        if buft.is_extra:     # do not load loras to extra buffer types (i.e. bufts for repacking)
            buft = cpu_buft
        a_ne, b_ne = a.ne + (1,) * (4 - len(a.ne)), b.ne + (1,) * (4 - len(b.ne))
        if name.endswith("token_embd.weight"):
            # B non-transposed, A and B flipped (llm_build_inp_embd)
            if model_tensor.ne[0] != b_ne[1] or model_tensor.ne[1] != a_ne[1]:
                refuse(f"tensor '{name}' has incorrect shape (hint: maybe wrong base model?)")
        else:
            if model_tensor.ne[0] != a_ne[0] or model_tensor.ne[1] != b_ne[1]:
                refuse(f"tensor '{name}' has incorrect shape (hint: maybe wrong base model?)")
            if a_ne[1] != b_ne[0]:
                refuse("lora_a tensor is not transposed (hint: adapter from \"finetune\" example is no longer "
                       "supported)")
        ta, tb = ggml.new_tensor(a.type, *a_ne), ggml.new_tensor(b.type, *b_ne)
        ta.name, tb.name = a.name, b.name
        ctx_map.setdefault(id(buft), (buft, []))[1].extend((ta, tb))
        adapter.ab_map[name] = LoraWeight(ta, tb)

    adapter.bufs = [alloc_buffer(buft, tensors) for buft, tensors in ctx_map.values()]
    # set tensor data: each tensor's bytes must lie within the file
    for name in adapter.ab_map:
        for info in pairs[name]:
            offs = hdr.data_offset + info.offset
            if offs + info.nbytes > hdr.file_size:
                refuse(f"LoRA tensor '{info.name}' data is not within the file bounds, file is corrupted or "
                       f"incomplete")
    return adapter


# --- control vectors -------------------------------------------------------------------------------

@dataclass(eq=False)
class ControlVector:
    """llama_adapter_cvec: one n_embd f32 tensor per layer 1..n_layer-1 (none for layer 0), in the
    buffer type llama_model::select_buft(il) picks for the layer, one buffer per buffer type; the
    graphs add a layer's tensor to its output for layer_start <= il <= layer_end (tensor_for)."""
    tensors: list[Optional[Tensor]]
    layer_start: int
    layer_end: int
    bufs: list[Buffer] = field(default_factory=list)

    def tensor_for(self, il: int) -> Optional[Tensor]:
        if il < 0 or il < self.layer_start or il > self.layer_end or il >= len(self.tensors):
            return None
        return self.tensors[il]

    def buffers(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self.bufs:
            out[b.buft.name] = out.get(b.buft.name, 0) + b.size
        return out


def common_control_vector_load(infos: tuple[tuple[str, float], ...]) -> tuple[int, int, list[str]]:
    """common/common.cpp common_control_vector_load over --control-vector(-scaled) files: (n_embd,
    the number of floats of the summed data, llama.cpp's error lines); n_embd -1 when a file is
    invalid ("no valid control vector files passed"). Only the shapes matter here: the data are
    summed per layer, layer i (>= 1) at [n_embd * (i - 1)]."""
    n_embd, n_data = -1, 0
    for path, _ in infos:
        try:
            hdr = read_header(path)
        except GGUFError:
            hdr = None
        # gguf_init_from_file with no_alloc false reads the tensors' data too: a file cut short fails
        if hdr is None or hdr.file_size < hdr.data_offset + hdr.data_size:
            return -1, 0, [f"failed to load control vector file from {path}", "no valid control vector files passed"]
        cur_embd, cur_data, why = -1, 0, None
        for t in hdr.tensors:
            head, dot, rest = t.name.partition(".")
            m = _STOI.match(rest) if dot and head == "direction" else None
            layer_idx = int(m.group(0)) if m else -1
            if layer_idx < 0:
                why = f"invalid/unparsable direction tensor layer index in {path}"
            elif layer_idx == 0:
                why = f"invalid (zero) direction tensor layer index in {path}"
            elif t.type != ggml.T.F32:
                why = f"invalid (non-F32) direction tensor type in {path}"
            elif any(d != 1 for d in t.ne[1:]):      # ggml_n_dims(tensor) != 1
                why = f"invalid (non-1D) direction tensor shape in {path}"
            elif cur_embd != -1 and t.n_elements != cur_embd:
                why = f"direction tensor in {path} does not match previous dimensions"
            if why:
                return -1, 0, [why, f"skipping {path} due to invalid direction tensors",
                               "no valid control vector files passed"]
            cur_embd = t.n_elements if cur_embd == -1 else cur_embd
            cur_data = max(cur_data, cur_embd * layer_idx)
        if cur_embd == -1:     # a file without tensors: n_embd stays -1, which fails the whole load
            return -1, 0, [f"no direction tensors found in {path}", f"skipping {path} due to invalid direction "
                           f"tensors", "no valid control vector files passed"]
        if n_embd != -1 and cur_embd != n_embd:
            return -1, 0, [f"control vectors in {path} does not match previous dimensions",
                           "no valid control vector files passed"]
        n_embd, n_data = cur_embd, max(n_data, cur_data)
    return n_embd, n_data, []


_STOI = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+")


def llama_adapter_cvec_init(model: Model, select_buft: Callable[[int], "BufferType"], layer_start: int,
                            layer_end: int) -> ControlVector:
    """llama_adapter_cvec::init and apply's layer range: tensors for layers 1..n_layer-1 in the
    buffer type select_buft(il) gives, one context and buffer per buffer type."""
    n_layer = model.hparams.n_layer
    cvec = ControlVector([None], layer_start, layer_end)
    ctx_map: dict[int, tuple] = {}
    for il in range(1, n_layer):
        buft = select_buft(il)
        t = ggml.new_tensor(ggml.T.F32, model.hparams.n_embd)
        ctx_map.setdefault(id(buft), (buft, []))[1].append(t)
        cvec.tensors.append(t)
    cvec.bufs = [alloc_buffer(buft, tensors) for buft, tensors in ctx_map.values()]
    return cvec
