"""LLM_ARCH_OLMOE (src/models/olmoe.cpp): OLMoE-1B-7B.

A llama-shaped block whose QK norms span all heads (applied to the 2-D projections before the
reshape), NEOX rope, and routed experts with softmax gating and unnormalised weights.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require, require_head_sizes_equal
from ..model_loader import ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    require_head_sizes_equal(ml, hp)
    require(ml, hp.n_embd_head_k() == hp.n_rot(),
            f"the {ml.arch} graph needs rope over the whole head (head {hp.n_embd_head_k()}, n_rot {hp.n_rot()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_embd_gqa, n_expert, n_ff = hp.n_embd, hp.n_vocab, hp.n_embd_v_gqa(), hp.n_expert, hp.n_ff()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd, n_embd_gqa, n_embd_gqa)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd,))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd,))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
        require(c.ml, n_expert > 0, "n_expert must be > 0")
        require(c.ml, hp.n_expert_used() > 0, "n_expert_used must be > 0")
        layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff, n_expert))
        layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff, n_embd, n_expert))
        layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff, n_expert))


def build(g: GraphContext) -> None:
    """llama_model_olmoe::graph"""
    model, hp = g.model, g.hparams
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        cur = build_attn_qk_norm_flat(g, layer, cur, inp_pos, inp_attn, il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                              None, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU, False, hp.expert_weights_scale,
                              LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il)
        g.cb(cur, "ffn_moe_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)


def build_attn_qk_norm_flat(g: GraphContext, layer, cur, inp_pos, inp_attn, il: int):
    """The attention olmoe, olmo2 and minimax-m2 share: 2-D Q, K, V (build_qkv, reshape false), RMS-normed
    over all heads, then reshaped and roped, attention at 1/sqrt(head size)."""
    hp = g.hparams
    n_embd_head, n_tokens = hp.n_embd_head_v(), g.ubatch.n_tokens
    n_head, n_head_kv = hp.n_head(il), hp.n_head_kv(il)
    q, k, v = g.build_qkv_flat(layer, cur, n_embd_head * n_head, n_embd_head * n_head_kv,
                               n_embd_head * n_head_kv, il)
    g.cb(q, "Qcur", il)
    g.cb(k, "Kcur", il)
    g.cb(v, "Vcur", il)
    q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
    g.cb(q, "Qcur_normed", il)
    k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
    g.cb(k, "Kcur_normed", il)
    q = ggml.reshape(q, n_embd_head, n_head, n_tokens)
    k = ggml.reshape(k, n_embd_head, n_head_kv, n_tokens)
    v = ggml.reshape(v, n_embd_head, n_head_kv, n_tokens)
    q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
    k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
    g.cb(q, "Qcur", il)
    g.cb(k, "Kcur", il)
    g.cb(v, "Vcur", il)
    return g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)
