"""LLM_ARCH_DEEPSEEK32 (src/models/deepseek32.cpp): DeepSeek-V3.2 / V3.2-Exp.

DeepSeek-V3's MLA and experts (deepseek2) with DeepSeek sparse attention: per layer a lightning
indexer scores every cached key against the query (its own key cache, llama_kv_cache_dsa, keys
Hadamard-rotated) and the attention's mask keeps the top-k keys only. The appended NextN block is
loaded (skipped, load_mtp off) as deepseek2 does.
"""
from __future__ import annotations

import math
from typing import Callable

from .. import ggml
from ..ggml import Tensor
from ..graph import LLM_NORM, LLM_NORM_RMS, AttnInputKDSA, GraphContext, c_reciprocal
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Layer, Model, TensorCreator, require, require_gating_func
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, TENSOR_SKIP, ModelLoader, tn
from .deepseek2 import build_ffn_dense_or_moe, build_mla_absorbed

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.f_norm_eps = 1e-6
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count")
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count", 0)
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    hp.n_lora_q = ml.get_u32("%s.attention.q_lora_rank")
    hp.n_lora_kv = ml.get_u32("%s.attention.kv_lora_rank")
    hp.n_embd_head_k_mla_impl = ml.get_u32("%s.attention.key_length_mla", 0)
    hp.n_embd_head_v_mla_impl = ml.get_u32("%s.attention.value_length_mla", 0)
    hp.indexer_n_head = ml.get_u32("%s.attention.indexer.head_count")
    hp.indexer_head_size = ml.get_u32("%s.attention.indexer.key_length")
    hp.indexer_top_k = ml.get_u32("%s.attention.indexer.top_k")
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func")
    require_gating_func(ml, hp)
    require_dsa(ml, hp)


def require_dsa(ml: ModelLoader, hp: HParams) -> None:
    """load_arch_tensors' throw, and the graph's GGML_ASSERTs (deepseek32.cpp, glm-dsa.cpp)."""
    require(ml, hp.is_mla(), f"the {ml.arch} architecture requires MLA (key_length_mla and value_length_mla)")
    require(ml, hp.n_embd_head_k_mla() > hp.n_rot(),
            f"key_length_mla {hp.n_embd_head_k_mla()} must exceed the rope dimensions {hp.n_rot()}")
    require(ml, hp.n_rot() <= hp.indexer_head_size,
            f"the rope dimensions {hp.n_rot()} exceed the indexer key length {hp.indexer_head_size}")
    # the indexer's Hadamard rotation is the largest power of two >= 64 dividing its key length
    # (llama_kv_cache::build_input_k_rot); ggml_mul_mat asserts that it is the key length itself
    require(ml, hp.indexer_head_size >= 64 and hp.indexer_head_size & (hp.indexer_head_size - 1) == 0,
            f"the indexer key length {hp.indexer_head_size} is not a power of two >= 64 (its Hadamard rotation "
            f"would not fit it: ggml_mul_mat's GGML_ASSERT)")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    load_dsa_tensors(c, model, 0)


def load_dsa_tensors(c: TensorCreator, model: Model, indexer_flags: int) -> None:
    """llama_model_deepseek32::load_arch_tensors; glm-dsa's is the same with the indexer's tensors
    optional (indexer_flags TENSOR_NOT_REQUIRED: its shared layers have none)."""
    hp = model.hparams
    n_embd, n_vocab, n_expert = hp.n_embd, hp.n_vocab, hp.n_expert
    n_embd_head_k_mla, n_embd_head_v_mla = hp.n_embd_head_k_mla(), hp.n_embd_head_v_mla()
    n_embd_head_qk_rope = hp.n_rot()
    n_embd_head_qk_nope = n_embd_head_k_mla - n_embd_head_qk_rope
    q_lora_rank, kv_lora_rank = hp.n_lora_q, hp.n_lora_kv
    n_ff_exp, n_expert_shared = hp.n_ff_exp(), hp.n_expert_shared
    indexer_n_head, indexer_head_size = hp.indexer_n_head, hp.indexer_head_size
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    trunk_flags = TENSOR_NOT_REQUIRED if c.mtp_only() else 0
    mtp_flags = (TENSOR_NOT_REQUIRED if c.trunk_only() else 0) | TENSOR_SKIP    # load_mtp is off
    n_head = hp.n_head()    # layer 0's for every layer, as LLAMA_LOAD_LOCALS and the graph read it
    for i, layer in enumerate(model.layers + model.layers_nextn):
        flags = trunk_flags if i < hp.n_layer else mtp_flags
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,), flags)
        layer.attn_q_a_norm = c.create_tensor(tn("ATTN_Q_A_NORM", "weight", i), (q_lora_rank,), flags)
        layer.attn_kv_a_norm = c.create_tensor(tn("ATTN_KV_A_NORM", "weight", i), (kv_lora_rank,), flags)
        layer.wq_a = c.create_tensor(tn("ATTN_Q_A", "weight", i), (n_embd, q_lora_rank), flags)
        layer.wq_b = c.create_tensor(tn("ATTN_Q_B", "weight", i), (q_lora_rank, n_head * n_embd_head_k_mla), flags)
        layer.wkv_a_mqa = c.create_tensor(tn("ATTN_KV_A_MQA", "weight", i), (n_embd, kv_lora_rank + n_embd_head_qk_rope),
                                          flags)
        layer.wk_b = c.create_tensor(tn("ATTN_K_B", "weight", i), (n_embd_head_qk_nope, kv_lora_rank, n_head), flags)
        layer.wv_b = c.create_tensor(tn("ATTN_V_B", "weight", i), (kv_lora_rank, n_embd_head_v_mla, n_head), flags)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_head * n_embd_head_v_mla, n_embd), flags)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,), flags)
        i_flags = flags | indexer_flags
        layer.indexer_k_norm = c.create_tensor(tn("INDEXER_K_NORM", "weight", i), (indexer_head_size,), i_flags)
        layer.indexer_k_norm_b = c.create_tensor(tn("INDEXER_K_NORM", "bias", i), (indexer_head_size,), i_flags)
        layer.indexer_proj = c.create_tensor(tn("INDEXER_PROJ", "weight", i), (n_embd, indexer_n_head), i_flags)
        layer.indexer_attn_k = c.create_tensor(tn("INDEXER_ATTN_K", "weight", i), (n_embd, indexer_head_size), i_flags)
        layer.indexer_attn_q_b = c.create_tensor(tn("INDEXER_ATTN_Q_B", "weight", i),
                                                 (q_lora_rank, indexer_n_head * indexer_head_size), i_flags)
        if i < hp.n_layer_dense_lead:
            n_ff = hp.n_ff(i)
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff), flags)
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd), flags)
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff), flags)
        else:
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert), flags)
            layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,), TENSOR_NOT_REQUIRED)
            require(c.ml, n_expert > 0 and hp.n_expert_used() > 0, "n_expert and n_expert_used must be > 0")
            layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert), flags)
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert), flags)
            layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert), flags)
            n_ff_shexp = n_ff_exp * n_expert_shared
            layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)
            layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd), flags)
            layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp), flags)
        if i >= hp.n_layer:
            c.create_nextn(i, flags)


def build(g: GraphContext) -> None:
    build_dsa(g, LLAMA_ROPE_TYPE_NEOX, lambda il: True)


def build_dsa(g: GraphContext, indexer_rope_type: int, is_indexer_full: Callable[[int], bool]) -> None:
    """llama_model_deepseek32::graph: deepseek2's MLA with the absorption (Q from the normed Q LoRA
    projection viewed without a reshape), its mask narrowed by the lightning indexer's top-k keys
    (the fused GGML_OP_LIGHTNING_INDEXER: cparams.fused_lid is always on). kq_scale carries YaRN's
    mscale in llama.cpp; it is an op parameter only and leaves memory as it is.
    llama_model_glm_dsa::graph is the same with the indexer's rope NORM, and its "shared" layers
    (not is_indexer_full) reuse the top-k of the last full layer instead of running an indexer."""
    model, hp = g.model, g.hparams
    n_tokens = g.ubatch.n_tokens
    n_embd_head_k = hp.n_embd_head_k_mla()
    n_embd_head_qk_rope = hp.n_rot()
    n_embd_head_qk_nope = n_embd_head_k - n_embd_head_qk_rope
    kv_lora_rank = hp.n_lora_kv
    kq_scale = 1.0 / math.sqrt(n_embd_head_k)
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn_dsa = g.build_attn_inp_k_dsa()
    inp_out_ids = g.build_inp_out_ids()
    n_head = hp.n_head()
    top_k = None

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        qr = g.mul_mat_no_lora(layer.wq_a, cur)
        g.cb(qr, "qr", il)
        qr = g.build_norm(qr, layer.attn_q_a_norm, None, LLM_NORM_RMS, il)
        g.cb(qr, "qr", il)

        if is_indexer_full(il):   # a layer with its own lightning indexer
            top_k = build_lightning_indexer(g, inp_attn_dsa, layer, cur, qr, inp_pos, indexer_rope_type, il)
        else:   # a "shared" layer: the last full layer's top-k
            g.cb(top_k, "top_k", il)

        q = g.mul_mat_no_lora(layer.wq_b, qr)
        g.cb(q, "q", il)
        row_q = ggml.row_size(q.type, n_embd_head_k)
        q_nope = ggml.view(q, (n_embd_head_qk_nope, n_head, n_tokens), (row_q, row_q * n_head), 0)
        g.cb(q_nope, "q_nope", il)
        q_pe = ggml.view(q, (n_embd_head_qk_rope, n_head, n_tokens), (row_q, row_q * n_head),
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
        q_pe = ggml.rope_ext(q_pe, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q_pe, "q_pe", il)
        k_pe = ggml.rope_ext(k_pe, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(k_pe, "k_pe", il)
        kv_cmpr = g.build_norm(kv_cmpr, layer.attn_kv_a_norm, None, LLM_NORM_RMS, il)
        g.cb(kv_cmpr, "kv_cmpr", il)

        # MLA attention
        q_cur, k_cur, v_cur = build_mla_absorbed(g, layer, q_nope, q_pe, kv_cmpr, k_pe, il)
        cur = g.build_attn_k_dsa(inp_attn_dsa, layer.wo, None, q_cur, k_cur, v_cur, layer.wv_b, top_k, kq_scale, il)

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

    g.build_output(inp_l, h_nextn=True, lora=False)


def build_lightning_indexer(g: GraphContext, inp_attn_dsa: AttnInputKDSA, layer: Layer, cur: Tensor, qr: Tensor,
                            inp_pos: Tensor, rope_type: int, il: int) -> Tensor:
    """The lightning indexer of a layer (deepseek32.cpp; glm-dsa.cpp and dots3note.cpp repeat it): Q from
    the normed Q LoRA, K from the layer input (LayerNorm), both roped and Hadamard-rotated, the keys
    cached; the fused GGML_OP_LIGHTNING_INDEXER scores them with the pre-scaled head weights; the
    top-k keys per token."""
    hp, n_tokens = g.hparams, g.ubatch.n_tokens
    n_indexer_head, n_embd_indexer_head = hp.indexer_n_head, hp.indexer_head_size
    kv_lid = inp_attn_dsa.kv.lid
    indexer_q = g.mul_mat_no_lora(layer.indexer_attn_q_b, qr)
    g.cb(indexer_q, "indexer_q", il)
    indexer_q = ggml.reshape(indexer_q, n_embd_indexer_head, n_indexer_head, n_tokens)
    indexer_q = ggml.rope_ext(indexer_q, inp_pos, None, hp.n_rot(), rope_type, hp.n_ctx_orig_yarn)
    g.cb(indexer_q, "indexer_q", il)
    indexer_k = g.mul_mat_no_lora(layer.indexer_attn_k, cur)
    g.cb(indexer_k, "indexer_k", il)
    indexer_k = g.build_norm(indexer_k, layer.indexer_k_norm, layer.indexer_k_norm_b, LLM_NORM, il)
    g.cb(indexer_k, "indexer_k", il)
    indexer_k = ggml.reshape(indexer_k, n_embd_indexer_head, 1, n_tokens)
    indexer_k = ggml.rope_ext(indexer_k, inp_pos, None, hp.n_rot(), rope_type, hp.n_ctx_orig_yarn)
    g.cb(indexer_k, "indexer_k", il)
    # the Hadamard transform of the indexer's q and k
    indexer_q = ggml.mul_mat(inp_attn_dsa.k_rot_lid, indexer_q)
    g.cb(indexer_q, "indexer_q", il)
    indexer_k = ggml.mul_mat(inp_attn_dsa.k_rot_lid, indexer_k)
    g.cb(indexer_k, "indexer_k", il)
    ggml.build_forward_expand(g.gf, kv_lid.cpy_k(indexer_k, inp_attn_dsa.k_idxs_lid, il))
    indexer_weights = g.mul_mat_no_lora(layer.indexer_proj, cur)
    g.cb(indexer_weights, "indexer_weights", il)
    indexer_k = kv_lid.get_k(il)
    # the batch split into streams
    n_stream = indexer_k.ne[3]
    indexer_q = ggml.view(indexer_q, (indexer_q.ne[0], indexer_q.ne[1], indexer_q.ne[2] // n_stream, n_stream),
                          (indexer_q.nb[1], indexer_q.nb[2], indexer_q.nb[3] // n_stream), 0)
    indexer_weights = ggml.view(indexer_weights, (indexer_weights.ne[0], indexer_weights.ne[1] // n_stream,
                                                  indexer_weights.ne[2], n_stream),
                                (indexer_weights.nb[1], indexer_weights.nb[2] // n_stream,
                                 indexer_weights.nb[3] // n_stream), 0)
    # pre-scaled weights rather than a scaled score
    indexer_weights = ggml.scale(indexer_weights, c_reciprocal(math.sqrt(n_embd_indexer_head * n_indexer_head)))
    g.cb(indexer_weights, "indexer_weights", il)
    indexer_score = ggml.lightning_indexer(indexer_q, indexer_k, indexer_weights, inp_attn_dsa.kq_mask_lid)
    g.cb(indexer_score, "indexer_score", il)
    top_k = ggml.cont(ggml.top_k(indexer_score, min(indexer_score.ne[0], hp.indexer_top_k)))
    g.cb(top_k, "top_k", il)
    return top_k
