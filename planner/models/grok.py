"""LLM_ARCH_GROK (src/models/grok.cpp): Grok-1 (314B, 8 experts of 32768, 2 used), Grok-2.

RMS norms before and after attention and after the FFN (attn_output_norm, post_ffw_norm or
layer_output_norm), NEOX rope, KQ capped by 30 * tanh(output_scale * kq / 30) in build_attn_mha
(flash attention is forced off for Grok), GELU experts with normalised weights on every layer,
Grok-2's dense FFN beside them (summed and scaled by sqrt(2)/2), the embedding scale and the
logit scale, Grok-2's final logit softcapping.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_GELU, LLM_FFN_PAR, LLM_NORM_RMS, GraphContext,
                     c_reciprocal)
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require, require_head_sizes_equal
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    # the defaults of old GGUFs (grok-1)
    hp.f_logit_scale = ml.get_f32("%s.logit_scale", 0.5773502691896257)
    hp.f_embedding_scale = ml.get_f32("%s.embedding_scale", 78.38367176906169)
    hp.f_attn_out_scale = ml.get_f32("%s.attention.output_scale", 0.08838834764831845)
    hp.f_attn_logit_softcapping = ml.get_f32("%s.attn_logit_softcapping", 30.0)
    hp.f_final_logit_softcapping = ml.get_f32("%s.final_logit_softcapping", 0.0)   # none in grok-1
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all, 0)   # grok-2's
    require_head_sizes_equal(ml, hp)
    # Q and attn_output are n_embd wide: the heads fill them only where n_embd = heads * head size
    require(ml, all(hp.n_embd == hp.n_head(il) * hp.n_embd_head_k() for il in range(hp.n_layer)),
            f"the grok graph needs {ml.key('%s.embedding_length')} ({hp.n_embd}) = heads * head size")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert, n_ff = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_ff()
    if n_expert == 0:
        c.ml.fail("grok model cannot have zero experts")
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    n_ff_exp = hp.n_ff_exp() or n_ff   # grok-1: the experts are feed_forward_length wide
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd, hp.n_embd_v_gqa(i), hp.n_embd_v_gqa(i))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.attn_out_norm = c.create_tensor(tn("ATTN_OUT_NORM", "weight", i), (n_embd,))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff), TENSOR_NOT_REQUIRED)
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd), TENSOR_NOT_REQUIRED)
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff), TENSOR_NOT_REQUIRED)
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
        layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert),
                                              TENSOR_NOT_REQUIRED)
        layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert))
        layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
        layer.ffn_post_norm = c.create_tensor(tn("LAYER_OUT_NORM", "weight", i), (n_embd,), TENSOR_NOT_REQUIRED)
        if layer.ffn_post_norm is None:
            layer.ffn_post_norm = c.create_tensor(tn("FFN_POST_NORM", "weight", i), (n_embd,))


def build(g: GraphContext) -> None:
    """llama_model_grok::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)   # scaled by embedding_scale
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(il), hp.n_head_kv(il), il)
        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, 1.0, il)   # the tanh cap is in build_attn_mha

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        cur = g.build_norm(cur, layer.attn_out_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_out_norm", il)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        moe_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                                  None, hp.n_expert, hp.n_expert_used(), LLM_FFN_GELU, True, hp.expert_weights_scale,
                                  LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il)
        g.cb(moe_out, "ffn_moe_out", il)
        if layer.ffn_up is not None:   # grok-2's dense FFN beside the experts
            ffn_out = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                                  LLM_FFN_GELU, LLM_FFN_PAR, il)
            g.cb(ffn_out, "ffn_out", il)
            cur = ggml.scale(ggml.add(ffn_out, moe_out), math.sqrt(2) / 2)
            g.cb(cur, "ffn_out", il)
        else:
            cur = moe_out
        cur = g.build_norm(cur, layer.ffn_post_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_post_norm", il)
        cur = ggml.add(cur, ffn_inp)
        g.cb(cur, "ffn_out", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    # the output head: the logit scale multiplies (build_output's Granite scale divides), then the softcap
    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    cur = ggml.scale(cur, hp.f_logit_scale)
    if hp.f_final_logit_softcapping:
        cur = ggml.scale(cur, c_reciprocal(hp.f_final_logit_softcapping))
        cur = ggml.unary(cur, "TANH")
        cur = ggml.scale(cur, hp.f_final_logit_softcapping)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
