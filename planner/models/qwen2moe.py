"""LLM_ARCH_QWEN2MOE (src/models/qwen2moe.cpp): Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B.

The qwen2 attention block (Q/K/V biases) with routed experts (softmax, weights not normalised)
and a shared expert whose output is gated per token by a sigmoid (silu(x)/x).
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require, require_head_sizes_equal
from ..model_loader import ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all, 0)
    hp.n_ff_shexp = ml.get_u32("%s.expert_shared_feed_forward_length", 0)
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    require(ml, hp.n_expert > 0, "n_expert must be > 0 for QWEN2MOE")
    require(ml, hp.n_expert_used() > 0, "n_expert_used must be > 0 for QWEN2MOE")
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_embd_gqa, n_expert = hp.n_embd, hp.n_vocab, hp.n_embd_v_gqa(), hp.n_expert
    n_ff_exp = hp.n_ff_exp() or hp.n_ff() // hp.n_expert_used()
    n_ff_shexp = hp.n_ff_shexp or hp.n_ff()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd, n_embd_gqa, n_embd_gqa)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
        layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
        layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert))
        layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
        layer.ffn_gate_inp_shexp = c.create_tensor(tn("FFN_GATE_INP_SHEXP", "weight", i), (n_embd,))
        layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp))
        layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd))
        layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp))


def build(g: GraphContext) -> None:
    """llama_model_qwen2moe::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
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
        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, 1.0 / math.sqrt(n_embd_head), il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        moe_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                                  None, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU, False, hp.expert_weights_scale,
                                  LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il)
        g.cb(moe_out, "ffn_moe_out", il)

        cur_gate_inp = g.build_lora_mm(layer.ffn_gate_inp_shexp, cur)
        g.cb(cur_gate_inp, "ffn_shexp_gate_inp", il)
        cur_gate = ggml.div(ggml.unary(cur_gate_inp, "SILU"), cur_gate_inp)   # the sigmoid, as silu(x)/x
        g.cb(cur_gate, "ffn_shexp_gate", il)
        cur_ffn = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp, None,
                              LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur_ffn, "ffn_shexp", il)
        ffn_shexp_out = ggml.mul(cur_ffn, cur_gate)
        g.cb(ffn_shexp_out, "ffn_shexp_out", il)
        cur = ggml.add(moe_out, ffn_shexp_out)
        g.cb(cur, "ffn_out", il)

        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
