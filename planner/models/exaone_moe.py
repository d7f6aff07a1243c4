"""LLM_ARCH_EXAONE_MOE (src/models/exaone-moe.cpp): K-EXAONE-236B-A23B.

Three sliding-window layers (roped, window 128 unless the header says otherwise) to one full layer
without rope (llama_kv_cache_iswa), per-head RMS-normed Q and K, optional rope_freqs, leading dense
layers, then routed experts (the header's gating, optional selection bias) beside a shared expert.
The multi-token-prediction blocks (dense FFN) are counted and skipped.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator, load_swa_pattern, require_gating_func, require_head_sizes_equal
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, TENSOR_SKIP, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.swa_type = LLAMA_SWA_TYPE_STANDARD
    load_swa_pattern(ml, hp, 4)
    hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train)
    hp.n_swa = ml.get_u32("%s.attention.sliding_window")   # required: the 128 set before it is overwritten
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count", 0)
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_ff_shexp = ml.get_u32("%s.expert_shared_feed_forward_length", 0)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func")
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count", 0)
    require_gating_func(ml, hp)
    require_head_sizes_equal(ml, hp)   # the graph's GGML_ASSERTs


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert, n_ff = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_ff()
    n_ff_exp = hp.n_ff_exp()
    n_ff_shexp = hp.n_ff_shexp if hp.n_ff_shexp > 0 else n_ff_exp
    head_dim = hp.n_embd_head_k()
    n_qo_dim, n_kv_dim = hp.n_head() * head_dim, hp.n_head_kv() * head_dim
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))   # required: no tied fallback
    for i, layer in enumerate(model.layers + model.layers_nextn):
        is_nextn = i >= hp.n_layer
        flags = TENSOR_SKIP if is_nextn else 0   # the NextN layers' tensors are all skipped
        c.create_tensor_qkv(layer, i, n_embd, n_qo_dim, n_kv_dim, n_kv_dim, flags)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_qo_dim, n_embd), flags)
        layer.rope_freqs = c.create_tensor(tn("ROPE_FREQS", "weight", i), (hp.n_rot() // 2,),
                                           TENSOR_NOT_REQUIRED | (TENSOR_DUPLICATED if i != 0 else 0) | flags)
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,), flags)
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (head_dim,), flags)
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (head_dim,), flags)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,), flags)
        if i < hp.n_layer_dense_lead or is_nextn:
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff), flags)
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd), flags)
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff), flags)
        else:
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert), flags)
            layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,),
                                                    TENSOR_NOT_REQUIRED | flags)
            if n_expert == 0:
                c.ml.fail("n_expert must be > 0")
            if hp.n_expert_used() == 0:
                c.ml.fail("n_expert_used must be > 0")
            layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert), flags)
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert), flags)
            layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert), flags)
            layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)
            layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd), flags)
            layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)
        if is_nextn:
            c.create_nextn(i, flags)


def build(g: GraphContext) -> None:
    """llama_model_exaone_moe::graph"""
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
        rope_factors = model.get_rope_factors(g.cparams.n_ctx_seq, il)
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
        g.cb(q, "Qcur_normed", il)
        g.cb(k, "Kcur_normed", il)
        if hp.is_swa(il):   # rope on the sliding-window layers only
            q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
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
        if layer.ffn_gate_inp is None:
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                              LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(cur, "ffn_out", il)
        else:
            moe_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                      layer.ffn_down_exps, layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(),
                                      LLM_FFN_SILU, hp.expert_weights_norm, hp.expert_weights_scale,
                                      hp.expert_gating_func, il)
            g.cb(moe_out, "ffn_moe_out", il)
            ffn_shexp = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp,
                                    None, LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(ffn_shexp, "ffn_shexp", il)
            cur = ggml.add(moe_out, ffn_shexp)
            g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
