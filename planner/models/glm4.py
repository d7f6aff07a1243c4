"""LLM_ARCH_GLM4 (src/models/glm4.cpp): GLM-4-0414 9B/32B, GLM-Z1, GLM-4.1V (text), GLM-OCR.

The llama block with norms after attention and after the FFN, a fused gate+up SwiGLU FFN
(ffn_up of 2 * n_ff rows), rope over part of the head (NORM, or M-RoPE when the header has rope
sections: GLM-4.1V), optional Q/K/V biases. GLM-OCR's multi-token-prediction block
(nextn_predict_layers, the last blocks) is counted and skipped (TENSOR_SKIP); the graph runs the trunk.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_SEQ, LLM_FFN_SWIGLU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_MROPE, LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import TENSOR_SKIP, ModelLoader, tn


def LLAMA_ROPE_TYPE(hp: HParams) -> int:
    """llama_model_rope_type: M-RoPE when the header has rope sections, else NORM."""
    return LLAMA_ROPE_TYPE_MROPE if hp.use_mrope() else LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    if ml.has("%s.rope.dimension_sections"):
        hp.rope_sections = ml.get_rope_sections()
    # the graph asserts it (GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()))
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the glm4 graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_layer, n_embd_head_k = hp.n_embd, hp.n_vocab, hp.n_layer, hp.n_embd_head_k()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers + model.layers_nextn):
        flags = TENSOR_SKIP if i >= n_layer else 0    # the NextN blocks: counted, not loaded
        n_ff, n_q = hp.n_ff(), n_embd_head_k * hp.n_head()
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,), flags)
        c.create_tensor_qkv(layer, i, n_embd, n_q, hp.n_embd_k_gqa(), hp.n_embd_v_gqa(), flags)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_q, n_embd), flags)
        layer.attn_post_norm = c.create_tensor(tn("ATTN_POST_NORM", "weight", i), (n_embd,), flags)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,), flags)
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd), flags)
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff * 2), flags)
        layer.ffn_post_norm = c.create_tensor(tn("FFN_POST_NORM", "weight", i), (n_embd,), flags)
        if i >= n_layer:
            c.create_nextn(i, flags)


def build(g: GraphContext) -> None:
    """llama_model_glm4::graph (token input: the multimodal-embedding abort does not apply)"""
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

        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        if hp.use_mrope():
            q = ggml.rope_multi(q, inp_pos, None, hp.n_rot(), hp.rope_sections, hp.rope_type, hp.n_ctx_orig_yarn)
            k = ggml.rope_multi(k, inp_pos, None, hp.n_rot(), hp.rope_sections, hp.rope_type, hp.n_ctx_orig_yarn)
        else:
            q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        cur = g.build_norm(cur, layer.attn_post_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "post_attn_norm", il)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, None, None, layer.ffn_down, None, LLM_FFN_SWIGLU, LLM_FFN_SEQ, il)
        g.cb(cur, "ffn_out", il)
        cur = g.build_norm(cur, layer.ffn_post_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "post_mlp_norm", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
