"""LLM_ARCH_DOTS3NOTE (src/models/dots3note.cpp): dots3-note (288B-A19B).

Multi-head latent attention of two geometries: the full-attention layers (their own head count,
kv_lora_rank, MLA head sizes) with DeepSeek sparse attention (deepseek32's lightning indexer, NEOX
rope), the sliding-window layers (their own ones, rope.freq_base_swa) without; the shared rope key is
RMS-normed before its rope, and a head-wise sigmoid gate of the layer input scales the attention
before wo. llama_kv_cache_dsa_iswa: the DSA caches hold the full layers, a window-sized cache the
sliding ones. A leading dense layer, then sigmoid-routed experts with a selection bias beside a
shared expert. The multi-token-prediction block (the sliding geometry) is counted and skipped.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_ROPE_TYPE_NORM, LLAMA_SWA_TYPE_STANDARD, HParams
from ..gguf import BOOL, INT32, UINT32
from ..model import Model, TensorCreator, require, require_gating_func
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, TENSOR_SKIP, ModelLoader, tn
from .deepseek2 import build_ffn_dense_or_moe, build_mla_absorbed
from .deepseek32 import build_lightning_indexer, require_dsa

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.f_norm_eps = 1e-6   # the indexer's k_norm LayerNorm
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count")
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count")
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func")
    hp.n_lora_q = ml.get_u32("%s.attention.q_lora_rank")
    hp.n_lora_kv = ml.get_u32("%s.attention.kv_lora_rank")
    hp.n_embd_head_k_mla_impl = ml.get_u32("%s.attention.key_length_mla")
    hp.n_embd_head_v_mla_impl = ml.get_u32("%s.attention.value_length_mla")
    hp.n_lora_kv_swa = ml.get_u32("%s.attention.kv_lora_rank_swa")
    hp.n_embd_head_k_mla_swa = ml.get_u32("%s.attention.key_length_mla_swa")
    hp.n_embd_head_v_mla_swa = ml.get_u32("%s.attention.value_length_mla_swa")
    hp.swa_type = LLAMA_SWA_TYPE_STANDARD
    hp.n_swa = ml.get_u32("%s.attention.sliding_window")
    hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa")
    swa = ml.get_arr("%s.attention.sliding_window_pattern", (BOOL, UINT32, INT32))
    hp.is_swa_arr = tuple(il < len(swa) and swa[il] != 0 for il in range(hp.n_layer_all))
    hp.indexer_n_head = ml.get_u32("%s.attention.indexer.head_count")
    hp.indexer_head_size = ml.get_u32("%s.attention.indexer.key_length")
    hp.indexer_top_k = ml.get_u32("%s.attention.indexer.top_k")
    full = ml.get_arr("%s.attention.indexer.types", (BOOL, UINT32, INT32))
    hp.is_indexer_full_arr = tuple(il < len(full) and full[il] != 0 for il in range(hp.n_layer))
    require_gating_func(ml, hp)
    require_dsa(ml, hp)   # "DOTS3NOTE architecture requires MLA" and the graph's asserts
    require(ml, hp.n_embd_head_k_mla_swa > hp.n_rot(),
            f"key_length_mla_swa {hp.n_embd_head_k_mla_swa} must exceed the rope dimensions {hp.n_rot()}")
    for il in range(hp.n_layer):
        # the graph runs an indexer on every full-attention layer, from the weights of the full indexer layers
        require(ml, hp.is_swa(il) or hp.is_indexer_full(il),
                f"full-attention layer {il} is not a full indexer layer (attention.indexer.types): its indexer "
                "weights are not loaded and llama.cpp's graph would read null tensors")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert = hp.n_embd, hp.n_vocab, hp.n_expert
    n_embd_head_qk_rope, q_lora_rank = hp.n_rot(), hp.n_lora_q
    n_ff_exp, n_expert_shared, n_ff = hp.n_ff_exp(), hp.n_expert_shared, hp.n_ff()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    for i, layer in enumerate(model.layers + model.layers_nextn):
        is_mtp = i >= hp.n_layer
        is_swa = is_mtp or hp.is_swa(i)   # the NextN block has the sliding-window geometry
        flags = TENSOR_SKIP | TENSOR_NOT_REQUIRED if is_mtp else 0   # preserved in the file, no MTP graph
        n_head_l = hp.n_head(i)
        kv_lora_rank = hp.n_lora_kv_swa if is_swa else hp.n_lora_kv
        n_embd_head_k_mla = hp.n_embd_head_k_mla_swa if is_swa else hp.n_embd_head_k_mla()
        n_embd_head_v_mla = hp.n_embd_head_v_mla_swa if is_swa else hp.n_embd_head_v_mla()
        n_embd_head_qk_nope = n_embd_head_k_mla - n_embd_head_qk_rope
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,), flags)
        layer.attn_q_a_norm = c.create_tensor(tn("ATTN_Q_A_NORM", "weight", i), (q_lora_rank,), flags)
        layer.attn_kv_a_norm = c.create_tensor(tn("ATTN_KV_A_NORM", "weight", i), (kv_lora_rank,), flags)
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_qk_rope,), flags)
        layer.wq_a = c.create_tensor(tn("ATTN_Q_A", "weight", i), (n_embd, q_lora_rank), flags)
        layer.wq_b = c.create_tensor(tn("ATTN_Q_B", "weight", i), (q_lora_rank, n_head_l * n_embd_head_k_mla), flags)
        layer.wkv_a_mqa = c.create_tensor(tn("ATTN_KV_A_MQA", "weight", i), (n_embd, kv_lora_rank + n_embd_head_qk_rope),
                                          flags)
        layer.wk_b = c.create_tensor(tn("ATTN_K_B", "weight", i), (n_embd_head_qk_nope, kv_lora_rank, n_head_l), flags)
        layer.wv_b = c.create_tensor(tn("ATTN_V_B", "weight", i), (kv_lora_rank, n_embd_head_v_mla, n_head_l), flags)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_head_l * n_embd_head_v_mla, n_embd), flags)
        layer.wqkv_gate = c.create_tensor(tn("ATTN_GATE", "weight", i), (n_embd, n_head_l), flags)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,), flags)
        if not is_mtp and hp.is_indexer_full(i):
            isz, inh = hp.indexer_head_size, hp.indexer_n_head
            layer.indexer_k_norm = c.create_tensor(tn("INDEXER_K_NORM", "weight", i), (isz,), flags)
            layer.indexer_k_norm_b = c.create_tensor(tn("INDEXER_K_NORM", "bias", i), (isz,), flags)
            layer.indexer_proj = c.create_tensor(tn("INDEXER_PROJ", "weight", i), (n_embd, inh), flags)
            layer.indexer_attn_k = c.create_tensor(tn("INDEXER_ATTN_K", "weight", i), (n_embd, isz), flags)
            layer.indexer_attn_q_b = c.create_tensor(tn("INDEXER_ATTN_Q_B", "weight", i), (q_lora_rank, inh * isz), flags)
        if is_mtp or i < hp.n_layer_dense_lead:
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff), flags)
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd), flags)
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff), flags)
        else:
            require(c.ml, n_expert > 0 and hp.n_expert_used() > 0, "n_expert and n_expert_used must be > 0")
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert), flags)
            layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,), flags)
            layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert), flags)
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert), flags)
            layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert), flags)
            n_ff_shexp = n_ff_exp * n_expert_shared
            layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)
            layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd), flags)
            layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)
        if is_mtp:
            c.create_tensor(tn("NEXTN_EH_PROJ", "weight", i), (2 * n_embd, n_embd), flags)
            c.create_tensor(tn("NEXTN_ENORM", "weight", i), (n_embd,), flags)
            c.create_tensor(tn("NEXTN_HNORM", "weight", i), (n_embd,), flags)
            c.create_tensor(tn("NEXTN_EMBED_TOKENS", "weight", i), (n_embd, n_vocab), flags)
            c.create_tensor(tn("NEXTN_SHARED_HEAD_NORM", "weight", i), (n_embd,), flags)


def build(g: GraphContext) -> None:
    """llama_model_dots3note::graph"""
    model, hp = g.model, g.hparams
    n_tokens, n_embd_head_qk_rope = g.ubatch.n_tokens, hp.n_rot()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_k_dsa_iswa()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        is_swa = hp.is_swa(il)
        n_head_l = hp.n_head(il)
        kv_lora_rank = hp.n_lora_kv_swa if is_swa else hp.n_lora_kv
        n_embd_head_k_mla = hp.n_embd_head_k_mla_swa if is_swa else hp.n_embd_head_k_mla()
        n_embd_head_v_mla = hp.n_embd_head_v_mla_swa if is_swa else hp.n_embd_head_v_mla()
        n_embd_head_qk_nope = n_embd_head_k_mla - n_embd_head_qk_rope
        kq_scale = 1.0 / math.sqrt(n_embd_head_k_mla)

        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        attn_inp = cur
        qr = g.mul_mat_no_lora(layer.wq_a, cur)
        g.cb(qr, "qr", il)
        qr = g.build_norm(qr, layer.attn_q_a_norm, None, LLM_NORM_RMS, il)
        g.cb(qr, "qr", il)
        top_k = None
        if not is_swa:   # the lightning indexer of the full-attention layers
            top_k = build_lightning_indexer(g, inp_attn.dsa, layer, cur, qr, inp_pos, LLAMA_ROPE_TYPE_NEOX, il)

        q = g.mul_mat_no_lora(layer.wq_b, qr)
        g.cb(q, "q", il)
        row_q = ggml.row_size(q.type, n_embd_head_k_mla)
        q_nope = ggml.view(q, (n_embd_head_qk_nope, n_head_l, n_tokens), (row_q, row_q * n_head_l), 0)
        g.cb(q_nope, "q_nope", il)
        q_pe = ggml.view(q, (n_embd_head_qk_rope, n_head_l, n_tokens), (row_q, row_q * n_head_l),
                         ggml.row_size(q.type, n_embd_head_qk_nope))
        g.cb(q_pe, "q_pe", il)
        kv_cmpr_pe = g.mul_mat_no_lora(layer.wkv_a_mqa, cur)
        g.cb(kv_cmpr_pe, "kv_cmpr_pe", il)
        row = ggml.row_size(kv_cmpr_pe.type, kv_lora_rank + n_embd_head_qk_rope)
        kv_cmpr = ggml.view(kv_cmpr_pe, (kv_lora_rank, n_tokens), (row,), 0)
        g.cb(kv_cmpr, "kv_cmpr", il)
        k_pe = ggml.view(kv_cmpr_pe, (n_embd_head_qk_rope, 1, n_tokens), (row, row),
                         ggml.row_size(kv_cmpr_pe.type, kv_lora_rank))
        g.cb(k_pe, "k_pe", il)
        k_pe = g.build_norm(k_pe, layer.attn_k_norm, None, LLM_NORM_RMS, il)   # the shared rope key, before rope
        g.cb(k_pe, "k_pe", il)
        q_pe = ggml.rope_ext(q_pe, inp_pos, None, n_embd_head_qk_rope, hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q_pe, "q_pe", il)
        k_pe = ggml.rope_ext(k_pe, inp_pos, None, n_embd_head_qk_rope, hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(k_pe, "k_pe", il)
        kv_cmpr = g.build_norm(kv_cmpr, layer.attn_kv_a_norm, None, LLM_NORM_RMS, il)
        g.cb(kv_cmpr, "kv_cmpr", il)

        q_cur, k_cur, v_cur = build_mla_absorbed(g, layer, q_nope, q_pe, kv_cmpr, k_pe, il)
        # the head-wise gate goes before o_proj, so wo stays out of build_attn
        if is_swa:
            cur = g.build_attn(inp_attn.swa, None, None, q_cur, k_cur, v_cur, kq_scale, il, v_mla=layer.wv_b)
        else:
            cur = g.build_attn_k_dsa(inp_attn.dsa, None, None, q_cur, k_cur, v_cur, layer.wv_b, top_k, kq_scale, il)
        g.cb(cur, "attn_out", il)
        gate = g.build_lora_mm(layer.wqkv_gate, attn_inp)
        g.cb(gate, "attn_gate", il)
        gate = ggml.unary(gate, "SIGMOID")
        g.cb(gate, "attn_gate_sigmoid", il)
        attn_3d = ggml.reshape(cur, n_embd_head_v_mla, n_head_l, n_tokens)
        gate_3d = ggml.reshape(gate, 1, n_head_l, n_tokens)
        attn_3d = ggml.mul(attn_3d, gate_3d)
        g.cb(attn_3d, "attn_gated", il)
        cur = ggml.reshape(attn_3d, n_embd_head_v_mla * n_head_l, n_tokens)
        cur = g.build_lora_mm(layer.wo, cur, layer.wo_s)
        g.cb(cur, "attn_output", il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = build_ffn_dense_or_moe(g, layer, ffn_inp, hp.expert_weights_norm, il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l, lora=False)
