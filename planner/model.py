"""Model weights as llama.cpp loads them: one tensor per GGUF tensor, placed in a buffer type.

Mirrors llama_model::load_tensors (src/llama-model.cpp) and create_tensor (src/llama-model-loader.cpp):
TENSOR_DUPLICATED tensors (a tied output, rope_freqs for layers > 0) are separate tensor objects
unless the original already sits in the same buffer type's context.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from schedplan.backends.types import BufferType
from schedplan.planner import ggml
from schedplan.planner.ggml import Buffer, Tensor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schedplan.planner.gguf import GGUFHeader
from schedplan.planner.hparams import HParams, UnsupportedModel
from schedplan.planner.gallocr import alloc_ctx_tensors


@dataclass
class Layer:
    attn_norm: Tensor
    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    ffn_norm: Tensor
    ffn_gate: Tensor
    ffn_up: Tensor
    ffn_down: Tensor
    wq_b: Optional[Tensor] = None
    wk_b: Optional[Tensor] = None
    wv_b: Optional[Tensor] = None
    wo_b: Optional[Tensor] = None
    ffn_gate_b: Optional[Tensor] = None
    ffn_up_b: Optional[Tensor] = None
    ffn_down_b: Optional[Tensor] = None
    rope_freqs: Optional[Tensor] = None


@dataclass
class Model:
    hparams: HParams
    tok_embd: Tensor
    output_norm: Tensor
    output: Tensor
    layers: list[Layer]
    buffers: list[Buffer] = field(default_factory=list)   # in creation order


# Placement: the buffer type for a weight (tensor, name, layer: -1 input, n_layer output).
Placement = Callable[[Tensor, str, int], BufferType]


@dataclass
class _Loader:
    header: GGUFHeader
    place: Placement
    by_name: dict = field(default_factory=dict)
    ctx: dict = field(default_factory=dict)        # buft name -> (buft, [tensors]) in creation order

    def create(self, name: str, il: int, required: bool = True, duplicated: bool = False) -> Optional[Tensor]:
        info = self.by_name.get(name)
        if info is None:
            if required:
                raise UnsupportedModel(f"{self.header.path}: missing tensor '{name}'")
            return None
        t = ggml.new_tensor(info.type, *info.ne)
        t.name = name
        buft = self.place(t, name, il)
        tensors = self.ctx.setdefault(buft.name, (buft, []))[1]
        if duplicated:
            for original in tensors:
                if original.name == name:
                    return original
        tensors.append(t)
        return t


def load_model(header: GGUFHeader, hp: HParams, place: Placement) -> Model:
    """llama_model_llama::load_arch_tensors, then one buffer per buffer-type context."""
    ld = _Loader(header, place, {t.name: t for t in header.tensors})
    tok_embd = ld.create("token_embd.weight", -1)
    output_norm = ld.create("output_norm.weight", hp.n_layer)
    output = ld.create("output.weight", hp.n_layer, required=False)
    if output is None:
        output = ld.create("token_embd.weight", hp.n_layer, duplicated=True)
    layers = []
    for il in range(hp.n_layer):
        blk = f"blk.{il}."
        attn_norm = ld.create(blk + "attn_norm.weight", il)
        wq = ld.create(blk + "attn_q.weight", il)
        wk = ld.create(blk + "attn_k.weight", il)
        wv = ld.create(blk + "attn_v.weight", il)
        wq_b = ld.create(blk + "attn_q.bias", il, required=False)
        wk_b = ld.create(blk + "attn_k.bias", il, required=False)
        wv_b = ld.create(blk + "attn_v.bias", il, required=False)
        wo = ld.create(blk + "attn_output.weight", il)
        wo_b = ld.create(blk + "attn_output.bias", il, required=False)
        ffn_norm = ld.create(blk + "ffn_norm.weight", il)
        rope_freqs = ld.create("rope_freqs.weight", il, required=False, duplicated=il != 0)
        ffn_gate = ld.create(blk + "ffn_gate.weight", il)
        ffn_down = ld.create(blk + "ffn_down.weight", il)
        ffn_up = ld.create(blk + "ffn_up.weight", il)
        layers.append(Layer(
            attn_norm=attn_norm, wq=wq, wk=wk, wv=wv, wo=wo, ffn_norm=ffn_norm, ffn_gate=ffn_gate, ffn_up=ffn_up,
            ffn_down=ffn_down, wq_b=wq_b, wk_b=wk_b, wv_b=wv_b, wo_b=wo_b, rope_freqs=rope_freqs,
            ffn_gate_b=ld.create(blk + "ffn_gate.bias", il, required=False),
            ffn_down_b=ld.create(blk + "ffn_down.bias", il, required=False),
            ffn_up_b=ld.create(blk + "ffn_up.bias", il, required=False),
        ))
    model = Model(hp, tok_embd, output_norm, output, layers)
    model.buffers = [_alloc_weights(header, ld.by_name, buft, tensors) for buft, tensors in ld.ctx.values()]
    return model


def _alloc_weights(header: GGUFHeader, infos: dict, buft: BufferType, tensors: list[Tensor]) -> Buffer:
    """Mapped buffer types cover the file range of their tensors (get_mapping_range); others are
    allocated like ggml_backend_alloc_ctx_tensors_from_buft."""
    if buft.name.endswith("_Mapped"):
        buf = Buffer(buft, "weights")
        offs = {t.name: header.data_offset + infos[t.name].offset for t in tensors}
        first = min(offs[t.name] for t in tensors)
        last = max(offs[t.name] + t.nbytes for t in tensors)
        for t in tensors:
            t.buffer, t.offset = buf, offs[t.name] - first
        buf.size = last - first
        return buf
    return alloc_ctx_tensors(buft, tensors, usage="weights")
