"""LLM_ARCH_OPENAI_MOE, "gpt-oss" (src/models/openai-moe.cpp): gpt-oss-20b and gpt-oss-120b.

Sliding-window (128) and global layers alternating (llama_kv_cache_iswa), attention sinks, biases
on the attention output and on every expert (ADD_ID), the clamped SwiGLU of gpt-oss, softmax over
the selected experts' logits; the output rows are picked after the last layer.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT, LLM_FFN_SWIGLU_OAI_MOE, LLM_NORM_RMS,
                     GraphContext)
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator, load_swa_pattern
from ..model_loader import ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_swa = ml.get_u32("%s.attention.sliding_window")
    hp.swa_type = LLAMA_SWA_TYPE_STANDARD
    load_swa_pattern(ml, hp, 2)
    hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_rot, n_expert, n_ff_exp = hp.n_embd, hp.n_vocab, hp.n_rot(), hp.n_expert, hp.n_ff_exp()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    for i, layer in enumerate(model.layers):
        n_head, n_head_kv = hp.n_head(i), hp.n_head_kv(i)
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_post_norm = c.create_tensor(tn("ATTN_POST_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_head * n_rot, n_head_kv * n_rot, n_head_kv * n_rot)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_head * n_rot, n_embd))
        layer.attn_sinks = c.create_tensor(tn("ATTN_SINKS", "weight", i), (n_head,))
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
        layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
        layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert))
        layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
        layer.bo = c.create_tensor(tn("ATTN_OUT", "bias", i), (n_embd,))
        layer.ffn_gate_inp_b = c.create_tensor(tn("FFN_GATE_INP", "bias", i), (n_expert,))
        layer.ffn_gate_exps_b = c.create_tensor(tn("FFN_GATE_EXPS", "bias", i), (n_ff_exp, n_expert))
        layer.ffn_down_exps_b = c.create_tensor(tn("FFN_DOWN_EXPS", "bias", i), (n_embd, n_expert))
        layer.ffn_up_exps_b = c.create_tensor(tn("FFN_UP_EXPS", "bias", i), (n_ff_exp, n_expert))


def build(g: GraphContext) -> None:
    """llama_model_openai_moe::graph (embeddings_nextn_masked is false: rows picked after the loop)"""
    model, hp = g.model, g.hparams
    n_rot = hp.n_rot()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv_iswa()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        g.t_layer_inp[il] = inp_l
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        q, k, v = g.build_qkv(layer, cur, n_rot, hp.n_head(il), hp.n_head_kv(il), il)
        q = ggml.rope_ext(q, inp_pos, None, n_rot, hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, n_rot, hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, 1.0 / math.sqrt(n_rot), il, sinks=layer.attn_sinks)
        g.cb(cur, "attn_out", il)

        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.attn_post_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_post_norm", il)
        cur = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                              None, hp.n_expert, hp.n_expert_used(), LLM_FFN_SWIGLU_OAI_MOE, False,
                              hp.expert_weights_scale, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT, il,
                              gate_inp_b=layer.ffn_gate_inp_b, up_exps_b=layer.ffn_up_exps_b,
                              gate_exps_b=layer.ffn_gate_exps_b, down_exps_b=layer.ffn_down_exps_b)
        g.cb(cur, "ffn_moe_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.t_h_nextn = inp_l
    g.build_output(ggml.get_rows(inp_l, inp_out_ids))
