"""llm_build_rwkv7_base (src/models/rwkv7-base.cpp): the RWKV-7 "Goose" time mix (fused lerps, decay,
in-context learning rate and value-residual LoRAs, optional gate LoRA, L2-normed keys, RWKV_WKV7)
and channel mix that rwkv7 and arwkv7 build over llama_memory_recurrent; the wkv state is read
through build_rs and written back as in rwkv6-base.cpp.
"""
from __future__ import annotations

from typing import Optional

from .. import ggml
from ..ggml import Tensor
from ..graph import GraphContext
from ..model import Layer, TensorCreator
from ..model_loader import ModelLoader, tn
from .rwkv6_base import build_wkv_state_store, load_wkv_head_size


def load_rwkv7_hparams(ml: ModelLoader, hp) -> None:
    """The keys rwkv7 and arwkv7 read."""
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon", 0.0)
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon", 0.0)
    load_wkv_head_size(ml, hp)
    hp.n_lora_decay = ml.get_u32("%s.attention.decay_lora_rank")
    hp.n_lora_iclr = ml.get_u32("%s.attention.iclr_lora_rank")
    hp.n_lora_value_res_mix = ml.get_u32("%s.attention.value_residual_mix_lora_rank")
    hp.n_lora_gate = ml.get_u32("%s.attention.gate_lora_rank", 0)
    hp.token_shift_count = ml.get_u32("%s.token_shift_count", 2)
    hp.is_recr_arr = (True,) * hp.n_layer     # llm_arch_is_recurrent


def load_lora_tensors(c: TensorCreator, layer: Layer, i: int) -> None:
    """The decay, in-context learning rate and value-residual LoRAs as both loaders create them
    (layer 0's value residual, never used, is sized by the iclr rank)."""
    hp = c.hparams
    n_embd = hp.n_embd
    layer.time_mix_w0 = c.create_tensor(tn("TIME_MIX_W0", "weight", i), (n_embd,))
    layer.time_mix_w1 = c.create_tensor(tn("TIME_MIX_W1", "weight", i), (n_embd, hp.n_lora_decay))
    layer.time_mix_w2 = c.create_tensor(tn("TIME_MIX_W2", "weight", i), (hp.n_lora_decay, n_embd))
    layer.time_mix_a0 = c.create_tensor(tn("TIME_MIX_A0", "weight", i), (n_embd,))
    layer.time_mix_a1 = c.create_tensor(tn("TIME_MIX_A1", "weight", i), (n_embd, hp.n_lora_iclr))
    layer.time_mix_a2 = c.create_tensor(tn("TIME_MIX_A2", "weight", i), (hp.n_lora_iclr, n_embd))
    rank = hp.n_lora_iclr if i == 0 else hp.n_lora_value_res_mix
    layer.time_mix_v0 = c.create_tensor(tn("TIME_MIX_V0", "weight", i), (n_embd,))
    layer.time_mix_v1 = c.create_tensor(tn("TIME_MIX_V1", "weight", i), (n_embd, rank))
    layer.time_mix_v2 = c.create_tensor(tn("TIME_MIX_V2", "weight", i), (rank, n_embd))


def load_kv_tensors(c: TensorCreator, layer: Layer, i: int) -> None:
    """time_mix_k_k .. time_mix_receptance, in both loaders' order."""
    n_embd = c.hparams.n_embd
    layer.time_mix_k_k = c.create_tensor(tn("TIME_MIX_K_K", "weight", i), (n_embd,))
    layer.time_mix_k_a = c.create_tensor(tn("TIME_MIX_K_A", "weight", i), (n_embd,))
    layer.time_mix_r_k = c.create_tensor(tn("TIME_MIX_R_K", "weight", i), (n_embd,))
    layer.time_mix_key = c.create_tensor(tn("TIME_MIX_KEY", "weight", i), (n_embd, n_embd))
    layer.time_mix_value = c.create_tensor(tn("TIME_MIX_VALUE", "weight", i), (n_embd, n_embd))
    layer.time_mix_receptance = c.create_tensor(tn("TIME_MIX_RECEPTANCE", "weight", i), (n_embd, n_embd))


def build_rwkv7_channel_mix(g: GraphContext, layer: Layer, cur, x_prev):
    """llm_build_rwkv7_base::build_rwkv7_channel_mix (LLM_ARCH_RWKV7)"""
    sx = ggml.sub(x_prev, cur)
    xk = ggml.add(ggml.mul(sx, layer.channel_mix_lerp_k), cur)
    k = ggml.sqr(ggml.unary(g.build_lora_mm(layer.channel_mix_key, xk), "RELU"))
    return g.build_lora_mm(layer.channel_mix_value, k)


def build_rwkv7_time_mix(g: GraphContext, inp, cur, x_prev, first_layer_value: Optional[Tensor], il: int):
    """llm_build_rwkv7_base::build_rwkv7_time_mix; returns the output and the first layer's value
    (first_layer_value is set by the first layer and mixed into the others' values)."""
    hp, layer, ub = g.hparams, g.model.layers[il], g.ubatch
    n_tokens, n_seqs = ub.n_tokens, ub.n_seqs
    n_seq_tokens = n_tokens // n_seqs
    n_embd, head_size = hp.n_embd, hp.wkv_head_size
    head_count = n_embd // head_size
    has_gating = layer.time_mix_g1 is not None and layer.time_mix_g2 is not None
    f32 = ggml.type_size(ggml.T.F32)

    sx = ggml.sub(x_prev, cur)
    dummy = ggml.new_tensor(ggml.T.F32, n_embd, n_seq_tokens, n_seqs, 6 if has_gating else 5)
    sx = ggml.repeat(sx, dummy)
    xxx = ggml.add(ggml.mul(sx, layer.time_mix_lerp_fused), cur)
    xr, xw, xk, xv, xa = (ggml.view(xxx, (n_embd, n_tokens), (xxx.nb[1],), n_embd * n_tokens * i * f32)
                          for i in range(5))
    xg = ggml.view(xxx, (n_embd, n_tokens), (xxx.nb[1],), n_embd * n_tokens * 5 * f32) if has_gating else None

    r = g.build_lora_mm(layer.time_mix_receptance, xr)
    w = ggml.add(g.mul_mat_no_lora(layer.time_mix_w2, ggml.unary(g.mul_mat_no_lora(layer.time_mix_w1, xw), "TANH")),
                 layer.time_mix_w0)
    w = ggml.unary(ggml.scale(ggml.unary(w, "SIGMOID"), -0.606531), "EXP")
    k = g.build_lora_mm(layer.time_mix_key, xk)
    v = g.build_lora_mm(layer.time_mix_value, xv)
    if first_layer_value is None:
        first_layer_value = v
    else:   # the first layer's value as a residual
        mix = ggml.unary(ggml.add(g.mul_mat_no_lora(layer.time_mix_v2, g.mul_mat_no_lora(layer.time_mix_v1, xv)),
                                  layer.time_mix_v0), "SIGMOID")
        v = ggml.add(v, ggml.mul(ggml.sub(first_layer_value, v), mix))
    gate = None
    if has_gating:
        gate = g.mul_mat_no_lora(layer.time_mix_g2, ggml.unary(g.mul_mat_no_lora(layer.time_mix_g1, xg), "SIGMOID"))
    a = ggml.unary(ggml.add(g.mul_mat_no_lora(layer.time_mix_a2, g.mul_mat_no_lora(layer.time_mix_a1, xa)),
                            layer.time_mix_a0), "SIGMOID")
    kk = ggml.reshape(ggml.mul(k, layer.time_mix_k_k), head_size, head_count, n_tokens)
    kk = ggml.l2_norm(kk, 1e-12)
    ka = ggml.mul(k, layer.time_mix_k_a)
    k = ggml.add(k, ggml.sub(ggml.mul(a, ka), ka))
    r, w, k, v, a = (ggml.reshape(t, head_size, head_count, n_tokens) for t in (r, w, k, v, a))

    wkv_state = g.build_rs(inp, g.kv.s_l[il], hp.n_embd_s(), n_seqs)
    wkv_output = ggml.rwkv_wkv7(r, w, k, v, ggml.unary(kk, "NEG"), ggml.mul(kk, a), wkv_state)
    cur = ggml.view(wkv_output, (n_embd * n_tokens,), (), 0)   # before the store names wkv_output
    build_wkv_state_store(g, wkv_output, il)
    if layer.time_mix_ln is not None and layer.time_mix_ln_b is not None:   # group norm with head_count groups
        cur = ggml.reshape(cur, n_embd // head_count, head_count, n_tokens)
        cur = ggml.norm(cur, 64e-5)
        cur = ggml.reshape(cur, n_embd, n_tokens)
        cur = ggml.add(ggml.mul(cur, layer.time_mix_ln), layer.time_mix_ln_b)
    else:
        cur = ggml.reshape(cur, n_embd, n_tokens)
    rk = ggml.sum_rows(ggml.mul(ggml.mul(k, r), ggml.reshape(layer.time_mix_r_k, head_size, head_count)))
    cur = ggml.add(cur, ggml.reshape(ggml.mul(v, rk), n_embd, n_tokens))
    if has_gating:
        cur = ggml.mul(cur, gate)
    cur = g.build_lora_mm(layer.time_mix_output, cur)
    return ggml.reshape(cur, n_embd, n_seq_tokens, n_seqs), first_layer_value
