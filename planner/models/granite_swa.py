"""LLM_ARCH_GRANITE_SWA (src/models/granite-swa.cpp): IBM's forthcoming Granite with interleaved
sliding-window attention and attention sinks (GraniteSWAForCausalLM, GraniteMoeSWAForCausalLM).

Granite's block, scales and deepstack mapping with a per-layer window pattern (required; iSWA cache),
per-head attention sinks on every layer, rope per layer by attention.rope_pattern (default on),
and optional softmax-routed experts (merged gate_up or gate and up) beside a shared expert whose
gate and up stay fused (SwiGLU over ffn_up_shexp).
"""
from __future__ import annotations

from .. import ggml
from ..gguf import BOOL, INT32, UINT32
from ..graph import (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_PAR, LLM_FFN_SEQ, LLM_FFN_SILU, LLM_FFN_SWIGLU,
                     LLM_NORM_RMS, GraphContext, kq_scale_for)
from ..hparams import LLAMA_ROPE_TYPE_NORM, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator, require_head_sizes_equal
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn
from .granite import add_deepstack, load_deepstack_mapping
from .llama import create_rope_factors

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.f_logit_scale = ml.get_f32("%s.logit_scale")
    hp.f_residual_scale = ml.get_f32("%s.residual_scale", 0.0)
    hp.f_embedding_scale = ml.get_f32("%s.embedding_scale", 0.0)
    hp.f_attention_scale = ml.get_f32("%s.attention.scale", 0.0)
    # the window pattern is a required array (get_arr into is_swa_impl)
    if not ml.is_array("%s.attention.sliding_window_pattern"):
        ml.fail(f"array key not found in model: {ml.key('%s.attention.sliding_window_pattern')}")
    flags = ml.get_arr("%s.attention.sliding_window_pattern", (BOOL, UINT32, INT32))
    hp.is_swa_arr = tuple(il < len(flags) and bool(flags[il]) for il in range(hp.n_layer_all))
    hp.n_swa = ml.get_u32("%s.attention.sliding_window")
    hp.swa_type = LLAMA_SWA_TYPE_STANDARD
    load_deepstack_mapping(ml, hp)
    if ml.is_array("%s.attention.rope_pattern"):   # per-layer rope (1) or NoPE (0); past the array: rope
        pattern = ml.get_arr("%s.attention.rope_pattern", (BOOL, UINT32, INT32))
        hp.rope_pattern = tuple(il >= len(pattern) or bool(pattern[il]) for il in range(hp.n_layer_all))
    hp.n_ff_shexp = ml.get_u32("%s.expert_shared_feed_forward_length", 0)
    # the graph asserts n_embd_head == n_embd_head_k and n_embd_head == n_rot
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_expert = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_expert
    n_q = hp.n_embd_head_k() * hp.n_head()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_q, hp.n_embd_k_gqa(), hp.n_embd_v_gqa())
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_q, n_embd))
        layer.bo = c.create_tensor(tn("ATTN_OUT", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.attn_sinks = c.create_tensor(tn("ATTN_SINKS", "weight", i), (hp.n_head(),))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        create_rope_factors(c, layer, i, hp, hp.n_rot())
        if n_expert == 0:
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
            layer.ffn_gate_b = c.create_tensor(tn("FFN_GATE", "bias", i), (n_ff,), TENSOR_NOT_REQUIRED)
            layer.ffn_down_b = c.create_tensor(tn("FFN_DOWN", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
            layer.ffn_up_b = c.create_tensor(tn("FFN_UP", "bias", i), (n_ff,), TENSOR_NOT_REQUIRED)
        else:
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff, n_embd, n_expert))
            c.create_tensor_gate_up_exps(layer, i, n_embd, n_ff, n_expert)
            if hp.n_ff_shexp > 0:   # gate and up kept fused in ffn_up_shexp
                layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, 2 * hp.n_ff_shexp))
                layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (hp.n_ff_shexp, n_embd))


def build(g: GraphContext) -> None:
    """llama_model_granite_swa::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv_iswa()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_l = add_deepstack(g, inp_l, il)
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        cur = build_attention_layer(g, cur, inp_pos, inp_attn, n_embd_head, il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        inp_l = build_layer_ffn(g, cur, inp_sa, il)

    g.build_output(inp_l, logit_scale=hp.f_logit_scale)


def build_attention_layer(g: GraphContext, cur, inp_pos, inp_attn, n_embd_head: int, il: int):
    """llama_model_granite_swa::graph::build_attention_layer: the layer's sinks join the softmax."""
    hp, layer = g.hparams, g.model.layers[il]
    q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(il), hp.n_head_kv(il), il)
    if hp.has_rope(il):
        rope_factors = g.model.get_rope_factors(g.cparams.n_ctx_seq, il)
        q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
    g.cb(q, "Qcur", il)
    g.cb(k, "Kcur", il)
    g.cb(v, "Vcur", il)
    cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, kq_scale_for(hp, n_embd_head), il,
                       sinks=layer.attn_sinks)
    g.cb(cur, "attn_out", il)
    return cur


def build_layer_ffn(g: GraphContext, cur, inp_sa, il: int):
    """llama_model_granite_swa::graph::build_layer_ffn"""
    hp, layer = g.hparams, g.model.layers[il]
    if hp.f_residual_scale:
        cur = ggml.scale(cur, hp.f_residual_scale)
    ffn_inp = ggml.add(cur, inp_sa)
    g.cb(ffn_inp, "ffn_inp", il)
    cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
    g.cb(cur, "ffn_norm", il)
    if layer.ffn_gate_inp is None:
        cur = g.build_ffn(cur, layer.ffn_up, layer.ffn_up_b, layer.ffn_gate, layer.ffn_gate_b, layer.ffn_down,
                          layer.ffn_down_b, LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
    else:
        moe_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                                  None, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU, True, hp.expert_weights_scale,
                                  LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il, gate_up_exps=layer.ffn_gate_up_exps)
        g.cb(moe_out, "ffn_moe_out", il)
        if hp.n_ff_shexp > 0:
            shexp = g.build_ffn(cur, layer.ffn_up_shexp, None, None, None, layer.ffn_down_shexp, None,
                                LLM_FFN_SWIGLU, LLM_FFN_SEQ, il)
            g.cb(shexp, "ffn_shexp", il)
            cur = ggml.add(moe_out, shexp)
            g.cb(cur, "ffn_out", il)
        else:
            cur = moe_out
    if hp.f_residual_scale:
        cur = ggml.scale(cur, hp.f_residual_scale)
    cur = ggml.add(cur, ffn_inp)
    g.cb(cur, "ffn_out", il)
    cur = g.build_cvec(cur, il)
    g.cb(cur, "l_out", il)
    return cur
