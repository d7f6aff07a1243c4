"""LLM_ARCH_HY_V3 (src/models/hy-v3.cpp): Tencent Hy3 (295B-A21B).

GQA with per-head Q/K RMS norms before the NEOX rope, leading dense layers, then sigmoid-routed
experts with a selection bias (blk.N.exp_probs_b, no suffix) beside an ungated shared expert; the
output norm comes before the output rows are picked. The multi-token-prediction blocks are counted;
those of their tensors llama.cpp creates as merely optional (the FFNs and experts, the shared head)
are loaded even without MTP, the others skipped.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Layer, Model, TensorCreator, require_gating_func, require_head_sizes_equal
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_ff_shexp = ml.get_u32("%s.expert_shared_feed_forward_length", 0)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func", 0) or LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    require_gating_func(ml, hp)
    require_head_sizes_equal(ml, hp)   # the graph's GGML_ASSERTs


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    trunk_flags = TENSOR_NOT_REQUIRED if c.mtp_only() else 0
    # the MTP blocks: optional in a file without them, skipped unless load_mtp; their FFNs, experts
    # and optional NextN tensors are created without these flags, so loaded whenever present
    mtp_flags = (TENSOR_NOT_REQUIRED if c.trunk_only() else 0) | c.mtp_flags()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for il, layer in enumerate(model.layers):
        load_block(c, layer, il, trunk_flags)
    for il, layer in enumerate(model.layers_nextn, hp.n_layer):
        load_block(c, layer, il, mtp_flags)
        c.create_tensor(tn("NEXTN_EH_PROJ", "weight", il), (2 * n_embd, n_embd), mtp_flags)
        c.create_tensor(tn("NEXTN_ENORM", "weight", il), (n_embd,), mtp_flags)
        c.create_tensor(tn("NEXTN_HNORM", "weight", il), (n_embd,), mtp_flags)
        c.create_tensor(tn("NEXTN_EMBED_TOKENS", "weight", il), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
        c.create_tensor(tn("NEXTN_SHARED_HEAD_HEAD", "weight", il), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
        c.create_tensor(tn("NEXTN_SHARED_HEAD_NORM", "weight", il), (n_embd,), TENSOR_NOT_REQUIRED)


def load_block(c: TensorCreator, layer: Layer, il: int, flags: int) -> None:
    """load_block: what `flags` governs, the FFNs optional (loaded when present)."""
    hp = c.hparams
    n_embd, n_head, n_embd_head_k, n_expert, n_ff = hp.n_embd, hp.n_head(), hp.n_embd_head_k(), hp.n_expert, hp.n_ff()
    n_ff_exp = hp.n_ff_exp() or n_ff // (hp.n_expert_used() or 1)
    n_ff_shexp = hp.n_ff_shexp or n_ff_exp
    optional = TENSOR_NOT_REQUIRED
    layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", il), (n_embd,), flags)
    c.create_tensor_qkv(layer, il, n_embd, n_embd_head_k * n_head, hp.n_embd_k_gqa(), hp.n_embd_v_gqa(), flags)
    layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", il), (n_embd_head_k * n_head, n_embd), flags)
    layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", il), (n_embd_head_k,), flags)
    layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", il), (n_embd_head_k,), flags)
    layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", il), (n_embd,), flags)
    layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", il), (n_embd, n_ff), optional)
    layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", il), (n_ff, n_embd), optional)
    layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", il), (n_embd, n_ff), optional)
    layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", il), (n_embd, n_expert), optional)
    layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", None, il), (n_expert,), optional)
    layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", il), (n_ff_exp, n_embd, n_expert), optional)
    c.create_tensor_gate_up_exps(layer, il, n_embd, n_ff_exp, n_expert, optional)
    layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", il), (n_embd, n_ff_shexp), optional)
    layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", il), (n_embd, n_ff_shexp), optional)
    layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", il), (n_ff_shexp, n_embd), optional)


def build(g: GraphContext) -> None:
    """llama_model_hy_v3::graph (embeddings_nextn_masked is false: the rows are picked after the
    output norm)"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()
    kq_scale = 1.0 / math.sqrt(n_embd_head)

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        rope_factors = model.get_rope_factors(g.cparams.n_ctx_seq, il)
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
        q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, kq_scale, il)
        g.cb(cur, "attn_out", il)

        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        if layer.ffn_gate_inp is None:   # a leading dense layer
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, LLM_FFN_SILU,
                              LLM_FFN_PAR, il)
            g.cb(cur, "ffn_dense_out", il)
        else:
            moe_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                      layer.ffn_down_exps, layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(),
                                      LLM_FFN_SILU, hp.expert_weights_norm, hp.expert_weights_scale,
                                      hp.expert_gating_func, il, gate_up_exps=layer.ffn_gate_up_exps)
            g.cb(moe_out, "ffn_moe_out", il)
            sh_out = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp,
                                 None, LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(sh_out, "ffn_shared_out", il)
            cur = ggml.add(moe_out, sh_out)
            g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "h_nextn", -1)
    g.t_h_nextn = cur
    cur = ggml.get_rows(cur, inp_out_ids)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
