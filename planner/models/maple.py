"""LLM_ARCH_MAPLE (src/models/maple.cpp): deepgrove Maple (20B).

Sliding-window layers by the header's required pattern array (llama_kv_cache_iswa) roped, the
full ones without rope, per-head QK RMS norms, softmax-routed experts on every layer (weights
normalized) whose SwiGLU is the fused, clamped GGML_GLU_OP_SWIGLU_CLAMP at swiglu_clamp_exp
(required).
"""
from __future__ import annotations

import math

from .. import ggml
from ..gguf import BOOL, INT32, UINT32
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.swa_type = LLAMA_SWA_TYPE_STANDARD
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_swa = ml.get_u32("%s.attention.sliding_window")   # required
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)   # required
    flags = ml.get_arr("%s.attention.sliding_window_pattern", (BOOL, UINT32, INT32))   # required
    hp.is_swa_arr = tuple(il < len(flags) and bool(flags[il]) for il in range(hp.n_layer_all))
    hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train)
    hp.swiglu_clamp_exp = ml.get_key_or_arr_f32("%s.swiglu_clamp_exp", hp.n_layer_all)   # required
    # the graph's GGML_ASSERT
    require(ml, hp.n_embd_head_k() == hp.n_embd_head_v(),
            f"the maple graph needs equal head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert = hp.n_embd, hp.n_vocab, hp.n_expert
    n_ff_exp, head_dim = hp.n_ff_exp(), hp.n_embd_head_k()
    n_head, n_head_kv = hp.n_head(), hp.n_head_kv()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))   # required: no tied fallback
    if n_expert == 0:
        c.ml.fail("n_expert must be > 0 for Maple")
    if hp.n_expert_used() == 0:
        c.ml.fail("n_expert_used must be > 0 for Maple")
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_head * head_dim, n_head_kv * head_dim, n_head_kv * head_dim)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_head * head_dim, n_embd))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (head_dim,))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (head_dim,))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
        layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
        layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert))
        layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))


def build(g: GraphContext) -> None:
    """llama_model_maple::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_k()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv_iswa()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
        g.cb(q, "Qcur_normed", il)
        g.cb(k, "Kcur_normed", il)
        if hp.is_swa(il):   # rope on the sliding-window layers only
            q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
            k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)
        g.cb(cur, "attn_out", il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                              None, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU, True, 1.0,
                              LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il)
        g.cb(cur, "ffn_moe_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
