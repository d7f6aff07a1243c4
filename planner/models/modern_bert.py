"""LLM_ARCH_MODERN_BERT (src/models/modern-bert.cpp): ModernBERT base/large, gte-modernbert,
gte-reranker-modernbert, IBM Granite Embedding R2.

No memory (non-causal attention over the ubatch); with attention.sliding_window, symmetric
sliding-window layers and a full one every third layer, the first full (load_swa_pattern(3, true)).
The embeddings LayerNorm-ed without bias, pre-norm blocks without biases (layer 0 may have no
attention norm: identity), a fused QKV, NEOX rope, a fused GEGLU FFN (hidden_activation may pick
SwiGLU, ReLU or ReGLU), a final LayerNorm (t_embd). A rank head: cls, GELU, cls.norm, cls.output,
pooled as classifier.pooling_type says (mean by default).
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_GEGLU, LLM_FFN_REGLU, LLM_FFN_RELU, LLM_FFN_SEQ, LLM_FFN_SWIGLU, LLM_NORM, GraphContext
from ..hparams import (LLAMA_POOLING_TYPE_MEAN, LLAMA_POOLING_TYPE_UNSPECIFIED, LLAMA_ROPE_TYPE_NEOX,
                       LLAMA_SWA_TYPE_NONE, LLAMA_SWA_TYPE_SYMMETRIC, HParams)
from ..model import Model, TensorCreator, load_swa_pattern, require_equal_head_sizes
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX

# LLM_FFN_OP_TYPES_FROM_STRING (src/llama-model.cpp)
LLM_FFN_OP_TYPES_FROM_STRING = {"gelu": LLM_FFN_GEGLU, "geglu": LLM_FFN_GEGLU, "silu": LLM_FFN_SWIGLU,
                                "swish": LLM_FFN_SWIGLU, "swiglu": LLM_FFN_SWIGLU, "relu": LLM_FFN_RELU,
                                "reglu": LLM_FFN_REGLU}


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.n_swa = ml.get_u32("%s.attention.sliding_window", 0)
    if hp.n_swa > 0:
        hp.swa_type = LLAMA_SWA_TYPE_SYMMETRIC
        hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train_swa)
        load_swa_pattern(ml, hp, 3, True)
    else:
        hp.swa_type = LLAMA_SWA_TYPE_NONE
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon")
    hidden_act = ml.get_str("%s.hidden_activation", "")
    hp.llm_ffn_op = LLM_FFN_OP_TYPES_FROM_STRING.get(hidden_act, LLM_FFN_GEGLU)
    # GGUFs without a classifier pooling type use mean (gte-reranker-modernbert-base)
    if hp.pooling_type_cls == LLAMA_POOLING_TYPE_UNSPECIFIED:
        hp.pooling_type_cls = LLAMA_POOLING_TYPE_MEAN
    require_equal_head_sizes(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_ff = hp.n_embd, hp.n_ff()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, hp.n_vocab))
    model.tok_norm = c.create_tensor(tn("TOKEN_EMBD_NORM", "weight", 0), (n_embd,))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    for i, layer in enumerate(model.layers):
        # layer 0 uses identity
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,), 0 if i != 0 else TENSOR_NOT_REQUIRED)
        layer.wqkv = c.create_tensor(tn("ATTN_QKV", "weight", i), (n_embd, 3 * n_embd))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, 2 * n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
    model.cls_out = c.create_tensor(tn("CLS_OUT", "weight"), (n_embd, hp.n_cls_out), TENSOR_NOT_REQUIRED)
    model.cls_out_b = c.create_tensor(tn("CLS_OUT", "bias"), (hp.n_cls_out,), TENSOR_NOT_REQUIRED)
    model.cls = c.create_tensor(tn("CLS", "weight"), (n_embd, n_embd), TENSOR_NOT_REQUIRED)
    model.cls_norm = c.create_tensor(tn("CLS_NORM", "weight"), (n_embd,), TENSOR_NOT_REQUIRED)


def build(g: GraphContext) -> None:
    """llama_model_modern_bert::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_pos = g.build_inp_pos()
    inp_l = g.build_inp_embd(model.tok_embd)
    g.cb(inp_l, "inp_embd", -1)
    inp_l = g.build_norm(inp_l, model.tok_norm, None, LLM_NORM, 0)
    g.cb(inp_l, "inp_norm", 0)
    inp_out_ids = g.build_inp_out_ids()
    inp_attn = g.build_attn_inp_no_cache()

    for il, layer in enumerate(model.layers):
        cur = inp_l
        if layer.attn_norm is not None:
            cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM, il)
            g.cb(cur, "attn_norm", il)
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il, wo_s=layer.wo_s)
        g.cb(cur, "kqv_out", il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_l = ggml.get_rows(inp_l, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_l)   # re-add the layer input
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, None, None, layer.ffn_down, None, hp.llm_ffn_op, LLM_FFN_SEQ, il)
        inp_l = ggml.add(cur, ffn_inp)

    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM, -1)
    g.cb(cur, "final_norm_out", -1)
    g.t_embd = cur
    ggml.build_forward_expand(g.gf, cur)
