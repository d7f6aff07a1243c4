"""LLM_ARCH_MIMO2 (src/models/mimo2.cpp): MiMo-V2-Flash, MiMo-V2.5 (310B-A15B).

Sliding-window and full-attention layers by a per-layer pattern (llama_kv_cache_iswa) with their own
KV head counts, K heads wider than V heads (a fused attn_qkv viewed as Q, K and V, or separate
projections), rope over part of the head, attention sinks where the file has them, the attention
output scaled by attention.value_scale; a leading dense layer, then sigmoid-routed experts with a
selection bias. The multi-token-prediction blocks are counted but skipped (every tensor of theirs).
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..gguf import BOOL, INT32, UINT32
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator
from ..model_loader import TENSOR_NOT_REQUIRED, TENSOR_SKIP, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.swa_type = LLAMA_SWA_TYPE_STANDARD
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_swa = ml.get_u32("%s.attention.sliding_window")
    hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train)
    key = "%s.attention.sliding_window_pattern"
    if not ml.is_array(key):
        ml.fail(f"array key not found in model: {ml.key(key)}")
    flags = ml.get_arr(key, (BOOL, UINT32, INT32))
    hp.is_swa_arr = tuple(il < len(flags) and bool(flags[il]) for il in range(hp.n_layer_all))
    value_scale = ml.get_f32("%s.attention.value_scale", 0.0)
    if value_scale != 1.0:   # 1 leaves it unset (0: no scaling)
        hp.f_attn_value_scale = value_scale


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_expert = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_expert
    n_embd_head_k, n_embd_head_v, n_ff_exp = hp.n_embd_head_k(), hp.n_embd_head_v(), hp.n_ff_exp()
    trunk_flags = TENSOR_NOT_REQUIRED if c.mtp_only() else 0
    # the MTP blocks: skipped without MTP (load_mtp off), optional in a file without them
    mtp_flags = (TENSOR_NOT_REQUIRED if c.trunk_only() else 0) | TENSOR_SKIP
    optional = TENSOR_NOT_REQUIRED
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    for i, layer in enumerate(model.layers + model.layers_nextn):
        is_nextn = i >= hp.n_layer
        flags = mtp_flags if is_nextn else trunk_flags
        n_head = hp.n_head(i)
        c.create_tensor_qkv(layer, i, n_embd, n_embd_head_k * n_head, hp.n_embd_k_gqa(i), hp.n_embd_v_gqa(i), flags)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_head_v * n_head, n_embd), flags)
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,), flags)
        layer.attn_sinks = c.create_tensor(tn("ATTN_SINKS", "weight", i), (n_head,), optional | flags)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,), flags)
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff), optional | flags)
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd), optional | flags)
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff), optional | flags)
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert), optional | flags)
        layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert),
                                              optional | flags)
        layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert),
                                              optional | flags)
        layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert),
                                            optional | flags)
        layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,), optional | flags)
        if is_nextn:
            c.create_tensor(tn("NEXTN_EH_PROJ", "weight", i), (2 * n_embd, n_embd), flags)
            c.create_tensor(tn("NEXTN_ENORM", "weight", i), (n_embd,), flags)
            c.create_tensor(tn("NEXTN_HNORM", "weight", i), (n_embd,), flags)
            c.create_tensor(tn("NEXTN_EMBED_TOKENS", "weight", i), (n_embd, n_vocab), optional | flags)
            c.create_tensor(tn("NEXTN_SHARED_HEAD_HEAD", "weight", i), (n_embd, n_vocab), optional | flags)
            c.create_tensor(tn("NEXTN_SHARED_HEAD_NORM", "weight", i), (n_embd,), optional | flags)
            c.create_tensor(tn("LAYER_OUT_NORM", "weight", i), (n_embd,), optional | flags)


def build(g: GraphContext) -> None:
    """llama_model_mimo2::graph (embeddings_nextn off and no layer inputs extracted: the last layer's
    rows are picked before its FFN)"""
    model, hp = g.model, g.hparams
    n_embd_head_k, n_embd_head_v, n_tokens = hp.n_embd_head_k(), hp.n_embd_head_v(), g.ubatch.n_tokens
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv_iswa()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        n_head, n_head_kv = hp.n_head(il), hp.n_head_kv(il)
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        if layer.wqkv is not None:   # Q and K share the K head size, V has its own
            qkv = g.build_lora_mm(layer.wqkv, cur)
            g.cb(qkv, "wqkv", il)
            row_k, row_v = ggml.row_size(qkv.type, n_embd_head_k), ggml.row_size(qkv.type, n_embd_head_v)
            k_off = row_k * n_head
            q = ggml.view(qkv, (n_embd_head_k, n_head, n_tokens), (row_k, qkv.nb[1]), 0)
            k = ggml.view(qkv, (n_embd_head_k, n_head_kv, n_tokens), (row_k, qkv.nb[1]), k_off)
            v = ggml.view(qkv, (n_embd_head_v, n_head_kv, n_tokens), (row_v, qkv.nb[1]), k_off + row_k * n_head_kv)
        else:
            q = g.build_lora_mm(layer.wq, cur)
            g.cb(q, "Qcur", il)
            k = g.build_lora_mm(layer.wk, cur)
            g.cb(k, "Kcur", il)
            v = g.build_lora_mm(layer.wv, cur)
            g.cb(v, "Vcur", il)
            q = ggml.reshape(q, n_embd_head_k, n_head, n_tokens)
            k = ggml.reshape(k, n_embd_head_k, n_head_kv, n_tokens)
            v = ggml.reshape(v, n_embd_head_v, n_head_kv, n_tokens)
        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head_k), il,
                           sinks=layer.attn_sinks)
        g.cb(cur, "attn_out", il)
        if hp.f_attn_value_scale:
            cur = ggml.scale(cur, hp.f_attn_value_scale)
            g.cb(cur, "attn_out_scaled", il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)

        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        if layer.ffn_gate_inp is None:
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, LLM_FFN_SILU,
                              LLM_FFN_PAR, il)
            g.cb(cur, "ffn_out", il)
        else:
            cur = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                  layer.ffn_down_exps, layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(),
                                  LLM_FFN_SILU, True, hp.expert_weights_scale, LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID,
                                  il)
            g.cb(cur, "ffn_moe_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
