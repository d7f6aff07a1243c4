"""LLM_ARCH_COHERE2MOE (src/models/cohere2moe.cpp): Cohere2 MoE (30B-A3B).

Cohere's parallel block: attention and FFN both read the one attention norm's output and are added
to the residual together. Three sliding-window layers to one full layer, the full ones without rope
except in the leading dense layers (llama_kv_cache_iswa; the pattern's dense layer first); RMS or
LayerNorm by the header's epsilons; sigmoid-routed experts (merged gate_up or not) with optional
shared experts averaged in; the logits times logit_scale. The multi-token-prediction blocks are
counted and skipped; output rows are picked after the norm (embeddings_nextn_masked is false).
"""
from __future__ import annotations

import math

from .. import ggml
from ..gguf import FLOAT32
from ..graph import (LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM, LLM_NORM_RMS,
                     GraphContext)
from ..hparams import LLAMA_ROPE_TYPE_NORM, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Layer, Model, TensorCreator, load_swa_pattern, require_gating_func, require_head_sizes_equal
from ..model_loader import TENSOR_NOT_REQUIRED, TENSOR_SKIP, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    found_norm = ml.found("%s.attention.layer_norm_epsilon", FLOAT32)
    found_norm_rms = ml.found("%s.attention.layer_norm_rms_epsilon", FLOAT32)
    if not found_norm and not found_norm_rms:
        ml.fail("missing Cohere2 MoE norm epsilon (attention.layer_norm_epsilon or layer_norm_rms_epsilon)")
    if found_norm:
        hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon")
    # without the RMS epsilon the graph normalizes with LayerNorm (f_norm_rms_eps 0)
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon") if found_norm_rms else 0.0
    hp.n_swa = ml.get_u32("%s.attention.sliding_window")
    hp.f_logit_scale = ml.get_f32("%s.logit_scale")
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count")
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_ff_shexp = ml.get_u32("%s.expert_shared_feed_forward_length", 0)
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count", 0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func", 0) or LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
    hp.swa_type = LLAMA_SWA_TYPE_STANDARD
    load_swa_pattern(ml, hp, 4, dense_first=True)
    hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train)
    require_gating_func(ml, hp)
    require_head_sizes_equal(ml, hp)   # the graph's GGML_ASSERTs


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert = hp.n_embd, hp.n_vocab, hp.n_expert
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    if n_expert == 0:
        c.ml.fail("n_expert must be > 0 for Cohere2Moe")
    if hp.n_expert_used() == 0:
        c.ml.fail("n_expert_used must be > 0 for Cohere2Moe")
    # a --mtp file has no trunk (its tensors are then optional), a trunk-only file no NextN blocks
    trunk_flags = TENSOR_NOT_REQUIRED if c.mtp_only() else 0
    mtp_flags = (TENSOR_NOT_REQUIRED if c.trunk_only() else 0) | TENSOR_SKIP   # load_mtp is off
    for i, layer in enumerate(model.layers):
        load_block(c, layer, i, i < hp.n_layer_dense_lead, trunk_flags)
    for i, layer in enumerate(model.layers_nextn, start=hp.n_layer):
        # a full-attention MoE decoder block, then the NextN tensors that define it
        load_block(c, layer, i, False, mtp_flags)
        c.create_tensor(tn("NEXTN_EH_PROJ", "weight", i), (2 * n_embd, n_embd), mtp_flags)
        c.create_tensor(tn("NEXTN_ENORM", "weight", i), (n_embd,), mtp_flags)
        c.create_tensor(tn("NEXTN_HNORM", "weight", i), (n_embd,), mtp_flags)
        # not skipped: loaded like a trunk weight when the file has them
        c.create_tensor(tn("NEXTN_EMBED_TOKENS", "weight", i), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
        c.create_tensor(tn("NEXTN_SHARED_HEAD_HEAD", "weight", i), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
        c.create_tensor(tn("NEXTN_SHARED_HEAD_NORM", "weight", i), (n_embd,), TENSOR_NOT_REQUIRED)


def load_block(c: TensorCreator, layer: Layer, i: int, dense: bool, flags: int) -> None:
    """load_block_trunk (a dense FFN on the leading layers, else experts) and load_block_mtp's
    decoder block; the sizes are LLAMA_LOAD_LOCALS', layer 0's."""
    hp = c.hparams
    n_embd, n_expert, n_ff = hp.n_embd, hp.n_expert, hp.n_ff()
    n_embd_q, n_embd_gqa = hp.n_embd_head_k() * hp.n_head(), hp.n_embd_v_gqa()
    layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,), flags)
    c.create_tensor_qkv(layer, i, n_embd, n_embd_q, n_embd_gqa, n_embd_gqa, flags)
    layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_q, n_embd), flags)
    if dense:
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff), flags)
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd), flags)
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff), flags)
        return
    n_ff_exp = hp.n_ff_exp() or n_ff
    layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert), flags)
    layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert), flags)
    c.create_tensor_gate_up_exps(layer, i, n_embd, n_ff_exp, n_expert, flags)
    if hp.n_expert_shared > 0:
        n_ff_shexp = hp.n_ff_shexp or n_ff_exp * hp.n_expert_shared
        layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)
        layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd), flags)
        layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)


def build(g: GraphContext) -> None:
    """llama_model_cohere2moe::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    norm_type = LLM_NORM if hp.f_norm_rms_eps == 0.0 else LLM_NORM_RMS
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv_iswa()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        cur = g.build_norm(inp_l, layer.attn_norm, None, norm_type, il)
        g.cb(cur, "attn_norm", il)
        ffn_inp = cur
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        # the sliding-window layers rope, and the full ones of the dense prefix
        if hp.is_swa(il) or il < hp.n_layer_dense_lead:
            rope_factors = model.get_rope_factors(g.cparams.n_ctx_seq, il)
            q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)
        attn_out = cur

        if layer.ffn_gate_inp is None:
            cur = g.build_ffn(ffn_inp, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                              LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(cur, "ffn_out", il)
        else:
            cur = g.build_moe_ffn(ffn_inp, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                  layer.ffn_down_exps, None, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU,
                                  hp.expert_weights_norm, hp.expert_weights_scale, hp.expert_gating_func, il,
                                  gate_up_exps=layer.ffn_gate_up_exps)
            g.cb(cur, "ffn_moe_out", il)
            if layer.ffn_up_shexp is not None:   # the shared experts averaged with the routed ones
                ffn_shexp = g.build_ffn(ffn_inp, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None,
                                        layer.ffn_down_shexp, None, LLM_FFN_SILU, LLM_FFN_PAR, il)
                g.cb(ffn_shexp, "ffn_shexp", il)
                cur = ggml.scale(ggml.add(cur, ffn_shexp), 0.5)
                g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, inp_l)
        cur = ggml.add(cur, attn_out)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    cur = g.build_norm(inp_l, model.output_norm, None, norm_type, -1)
    g.cb(cur, "h_nextn", -1)
    g.t_h_nextn = cur
    cur = ggml.get_rows(cur, inp_out_ids)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    if hp.f_logit_scale != 0.0:
        cur = ggml.scale(cur, hp.f_logit_scale)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
