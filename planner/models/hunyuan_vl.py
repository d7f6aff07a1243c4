"""LLM_ARCH_HUNYUAN_VL (src/models/hunyuan-vl.cpp): HunyuanOCR / Hunyuan-VL text models, and via
llama_model_hunyuan_dense (models.h: the same loader and graph) Hunyuan 0.5B/1.8B/4B/7B dense.

The llama block with per-head Q/K RMS norms applied after the rope (M-RoPE over the sections where
rope.dimension_sections gives them, else NEOX), Q and O sized by key_length x heads, a SwiGLU FFN,
output tied unless present. (The loader's XDRoPE alpha rescales freq_base, which no buffer reads.)
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_MROPE, LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require_head_sizes_equal
from ..model_loader import ModelLoader, tn


def LLAMA_ROPE_TYPE(hp: HParams) -> int:
    """llama_model_rope_type: M-RoPE where the sections say so"""
    return LLAMA_ROPE_TYPE_MROPE if hp.use_mrope() else LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    """llama_model_hunyuan_vl::load_arch_hparams"""
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    if ml.has("%s.rope.dimension_sections"):
        hp.rope_sections = ml.get_rope_sections()
    # the graph asserts n_embd_head == n_embd_head_k and n_embd_head == n_rot
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    """llama_model_hunyuan_vl::load_arch_tensors"""
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_embd_head_k = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_embd_head_k()
    n_embd_q = n_embd_head_k * hp.n_head()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd_q, hp.n_embd_k_gqa(), hp.n_embd_v_gqa())
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_q, n_embd))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k,))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k,))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))


def build(g: GraphContext) -> None:
    """llama_model_hunyuan_vl::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    use_mrope = hp.use_mrope()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    kq_scale = 1.0 / math.sqrt(n_embd_head)
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        g.t_layer_inp[il] = inp_l
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        rope_factors = model.get_rope_factors(g.cparams.n_ctx_seq, il)
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        if use_mrope:
            q = ggml.rope_multi(q, inp_pos, rope_factors, hp.n_rot(), hp.rope_sections, hp.rope_type,
                                hp.n_ctx_orig_yarn)
            k = ggml.rope_multi(k, inp_pos, rope_factors, hp.n_rot(), hp.rope_sections, hp.rope_type,
                                hp.n_ctx_orig_yarn)
        else:
            q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
        g.cb(k, "Kcur_norm", il)
        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        g.cb(q, "Qcur_norm", il)
        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, kq_scale, il)
        g.cb(cur, "attn_out", il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur_mlp = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, LLM_FFN_SILU,
                              LLM_FFN_PAR, il)
        g.cb(cur_mlp, "ffn_out", il)
        cur = ggml.add(cur_mlp, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
