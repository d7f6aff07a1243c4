"""LLM_ARCH_PHI3 (src/models/phi3.cpp): Phi-3, Phi-3.5, Phi-4-mini.

Fused attn_qkv (or separate Q/K/V), gate and up fused in ffn_up (SwiGLU over its two halves),
partial rope with longrope factors picked by context size; sliding window disabled in llama.cpp.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_SEQ, LLM_FFN_SILU, LLM_FFN_SWIGLU, LLM_NORM_RMS,
                     GraphContext)
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_NONE, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    if ml.get_u32("%s.attention.sliding_window", 0) > 0:
        # "Phi SWA is currently disabled" (llama.cpp PR 13676): every layer is dense
        hp.swa_type, hp.n_swa = LLAMA_SWA_TYPE_NONE, 0
        hp.set_swa_pattern(1)
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the phi3 graph needs equal K and V head sizes ({hp.n_embd_head_k()}, {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_embd_gqa, n_rot = hp.n_embd, hp.n_vocab, hp.n_embd_v_gqa(), hp.n_rot()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        n_ff = hp.n_ff(i)
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd, n_embd_gqa, n_embd_gqa, TENSOR_NOT_REQUIRED)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, 2 * n_ff))
        flags = TENSOR_NOT_REQUIRED | (TENSOR_DUPLICATED if i != 0 else 0)
        layer.rope_long = c.create_tensor(tn("ROPE_FACTORS_LONG", "weight", i), (n_rot // 2,), flags)
        layer.rope_short = c.create_tensor(tn("ROPE_FACTORS_SHORT", "weight", i), (n_rot // 2,), flags)


def build(g: GraphContext) -> None:
    """llama_model_phi3::graph<false> (the iswa form is unreachable while Phi SWA is disabled, and
    phimoe sets no window); phimoe's norm biases, experts and lm_head bias run through it too."""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        residual = inp_l
        rope_factors = model.get_rope_factors(g.cparams.n_ctx_seq, il)
        attn_norm_output = g.build_norm(inp_l, layer.attn_norm, layer.attn_norm_b, LLM_NORM_RMS, il)
        g.cb(attn_norm_output, "attn_norm", il)

        q, k, v = g.build_qkv(layer, attn_norm_output, n_embd_head, hp.n_head(il), hp.n_head_kv(il), il)
        q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        q = ggml.scale(q, 1.0 / math.sqrt(n_embd_head))
        g.cb(q, "Qcur", il)
        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, 1.0, il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            residual = ggml.get_rows(residual, inp_out_ids)
        cur = ggml.add(cur, residual)
        residual = cur

        cur = g.build_norm(cur, layer.ffn_norm, layer.ffn_norm_b, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        if layer.ffn_gate_inp is None:
            cur = g.build_ffn(cur, layer.ffn_up, None, None, None, layer.ffn_down, None, LLM_FFN_SWIGLU,
                              LLM_FFN_SEQ, il)
            g.cb(cur, "ffn_out", il)
        else:
            cur = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                  layer.ffn_down_exps, None, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU, True,
                                  hp.expert_weights_scale, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il)
            g.cb(cur, "ffn_moe_out", il)
        cur = ggml.add(residual, cur)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l, name_no_bias=True)
