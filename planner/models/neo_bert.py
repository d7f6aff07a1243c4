"""LLM_ARCH_NEO_BERT (src/models/neo-bert.cpp): NeoBERT.

No memory (non-causal attention over the ubatch). Pre-norm blocks with RMS norms and no biases, a
fused QKV, NORM rope, a fused SwiGLU FFN, the encoder's output RMS norm (t_embd); a rank head of
cls (with bias), tanh and cls.output.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_SEQ, LLM_FFN_SWIGLU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Model, TensorCreator, require_equal_head_sizes
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    require_equal_head_sizes(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_ff, n_embd_gqa = hp.n_embd, hp.n_ff(), hp.n_embd_v_gqa()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, hp.n_vocab))
    model.cls = c.create_tensor(tn("CLS", "weight"), (n_embd, n_embd), TENSOR_NOT_REQUIRED)
    model.cls_b = c.create_tensor(tn("CLS", "bias"), (n_embd,), TENSOR_NOT_REQUIRED)
    model.cls_out = c.create_tensor(tn("CLS_OUT", "weight"), (n_embd, hp.n_cls_out), TENSOR_NOT_REQUIRED)
    model.cls_out_b = c.create_tensor(tn("CLS_OUT", "bias"), (hp.n_cls_out,), TENSOR_NOT_REQUIRED)
    model.output_norm_enc = c.create_tensor(tn("ENC_OUTPUT_NORM", "weight"), (n_embd,))
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.wqkv = c.create_tensor(tn("ATTN_QKV", "weight", i), (n_embd, n_embd + 2 * n_embd_gqa))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, 2 * n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))


def build(g: GraphContext) -> None:
    """llama_model_neo_bert::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_pos = g.build_inp_pos()
    inp_l = g.build_inp_embd(model.tok_embd)
    g.cb(inp_l, "inp_embd", -1)
    inp_attn = g.build_attn_inp_no_cache()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
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
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, None, None, layer.ffn_down, None, LLM_FFN_SWIGLU, LLM_FFN_SEQ, il)
        inp_l = ggml.add(cur, ffn_inp)

    cur = g.build_norm(inp_l, model.output_norm_enc, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_embd", -1)
    g.t_embd = cur
    ggml.build_forward_expand(g.gf, cur)
