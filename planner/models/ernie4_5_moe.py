"""LLM_ARCH_ERNIE4_5_MOE (src/models/ernie4-5-moe.cpp, loaded by src/models/ernie4-5.cpp, ernie4_5.py):
ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B.

Llama-style attention (norm rope, no QK norm), leading dense layers, then softmax-routed experts
(with the optional selection bias of moe_statics) every interleave_moe_layer_step layers beside
an optional shared expert.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NORM, HParams
from ..model import require
from ..model_loader import ModelLoader
from . import ernie4_5
from .ernie4_5 import load_arch_tensors  # noqa: F401  (models.h: the loader is llama_model_ernie4_5's)

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    """llama_model_ernie4_5::load_arch_hparams (shared), then the MoE graph's assert, checked at load"""
    ernie4_5.load_arch_hparams(ml, hp)
    require(ml, hp.n_moe_layer_step > 0, "Ernie 4.5 MoE requires n_moe_layer_step > 0")


def build(g: GraphContext) -> None:
    """llama_model_ernie4_5_moe::graph"""
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
        # the output bias is loaded but not added (build_attn gets NULL)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)
        g.cb(cur, "attn_out", il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        if il >= hp.n_layer_dense_lead and (il + 1) % hp.n_moe_layer_step == 0:
            moe_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                      layer.ffn_down_exps, layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(),
                                      LLM_FFN_SILU, True, hp.expert_weights_scale,
                                      LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il)
            g.cb(moe_out, "ffn_moe_out", il)
            if hp.n_ff_shexp > 0:
                ffn_shexp = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None,
                                        layer.ffn_down_shexp, None, LLM_FFN_SILU, LLM_FFN_PAR, il)
                g.cb(ffn_shexp, "ffn_shexp", il)
                cur = ggml.add(moe_out, ffn_shexp)
            else:
                cur = moe_out
        else:   # a layer the loader gave experts runs this FFN without weights: silu alone
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                              LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        g.cb(cur, "ffn_out", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
