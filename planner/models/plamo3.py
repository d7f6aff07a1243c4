"""LLM_ARCH_PLAMO3 (src/models/plamo3.cpp): PLaMo 3 (NICT 2B/8B, 31B).

Gemma-2-like sandwich norms (RMS norms before and after the attention and the FFN), a fused QKV
split into per-head views, per-head Q/K RMS norms before the NEOX rope, a fused SwiGLU FFN (up of
2 n_ff rows), per-layer head counts and FFN sizes; with attention.sliding_window > 0 a window on
seven layers in eight (load_swa_pattern, default 8) over llama_kv_cache_iswa, else full attention.
Output tied unless present. The post-norms are looked up without a ".weight" suffix
(tn(LLM_TENSOR_ATTN_POST_NORM, i)), and converted files name them so: gguf-py's tensor map lists
"model.layers.layers.{bid}.post_mixer_norm.weight" (and post_mlp_norm) whole, so no suffix is
carried over.
"""
from __future__ import annotations

import math

from .. import ggml
from ..gguf import UINT32
from ..graph import LLM_FFN_SEQ, LLM_FFN_SWIGLU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_NONE, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator, load_swa_pattern
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    """llama_model_plamo3::load_arch_hparams"""
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    found_swa = ml.found("%s.attention.sliding_window", UINT32)
    if found_swa:
        hp.n_swa = ml.get_u32("%s.attention.sliding_window")
    if found_swa and hp.n_swa > 0:
        hp.swa_type = LLAMA_SWA_TYPE_STANDARD
        hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train_swa)
        load_swa_pattern(ml, hp, 8)
    else:
        hp.swa_type = LLAMA_SWA_TYPE_NONE


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    """llama_model_plamo3::load_arch_tensors"""
    hp = model.hparams
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    head_dim_q, head_dim_v = hp.n_embd_head_k(), hp.n_embd_head_v()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    for i, layer in enumerate(model.layers):
        n_head, n_head_kv, n_ff_cur = hp.n_head(i), hp.n_head_kv(i), hp.n_ff(i)
        q_proj_dim, k_proj_dim, v_proj_dim = n_head * head_dim_q, n_head_kv * head_dim_q, n_head_kv * head_dim_v
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.wqkv = c.create_tensor(tn("ATTN_QKV", "weight", i), (n_embd, q_proj_dim + k_proj_dim + v_proj_dim))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (head_dim_q,))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (head_dim_q,))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_head * head_dim_v, n_embd))
        layer.attn_post_norm = c.create_tensor(tn("ATTN_POST_NORM", None, i), (n_embd,))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_post_norm = c.create_tensor(tn("FFN_POST_NORM", None, i), (n_embd,))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff_cur * 2))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff_cur, n_embd))


def build(g: GraphContext) -> None:
    """llama_model_plamo3::graph<iswa>"""
    model, hp, n_tokens = g.model, g.hparams, g.ubatch.n_tokens
    head_dim_q, head_dim_v = hp.n_embd_head_k(), hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv_iswa() if hp.swa_type != LLAMA_SWA_TYPE_NONE else g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        residual = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        qkv = g.build_lora_mm(layer.wqkv, cur)
        g.cb(cur, "wqkv", il)   # sic: names the norm's output, not the product (plamo3.cpp)
        n_head, n_head_kv = hp.n_head(il), hp.n_head_kv(il)
        k_offset = head_dim_q * n_head
        v_offset = k_offset + head_dim_q * n_head_kv
        es, f32 = ggml.type_size(qkv.type), ggml.type_size(ggml.T.F32)
        q = ggml.view(qkv, (head_dim_q, n_head, n_tokens), (head_dim_q * f32, qkv.nb[1]), 0)
        k = ggml.view(qkv, (head_dim_q, n_head_kv, n_tokens), (head_dim_q * f32, qkv.nb[1]), k_offset * es)
        v = ggml.view(qkv, (head_dim_v, n_head_kv, n_tokens), (head_dim_v * f32, qkv.nb[1]), v_offset * es)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)

        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        g.cb(q, "attn_q_norm", il)
        k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
        g.cb(k, "attn_k_norm", il)
        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(head_dim_q), il)
        g.cb(cur, "attn_out", il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            residual = ggml.get_rows(residual, inp_out_ids)
        cur = g.build_norm(cur, layer.attn_post_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_post_norm", il)
        cur = ggml.add(cur, residual)
        g.cb(cur, "attn_residual", il)
        residual = cur

        cur = g.build_norm(cur, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, None, None, layer.ffn_down, None,
                          LLM_FFN_SWIGLU, LLM_FFN_SEQ, il)
        g.cb(cur, "ffn_out", il)
        cur = g.build_norm(cur, layer.ffn_post_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_post_norm", il)
        cur = ggml.add(cur, residual)
        g.cb(cur, "ffn_residual", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    # no result_norm / result_output names here (plamo3.cpp)
    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
