"""LLM_ARCH_JAIS2 (src/models/jais2.cpp): Jais-2 8B, 70B.

LayerNorms with biases, separate Q/K/V with NEOX rope, an attention output bias, an ungated FFN
with biases and the squared ReLU, LayerNorm with bias before the head.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_RELU_SQR, LLM_FFN_SEQ, LLM_NORM, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require_head_sizes_equal
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon")
    require_head_sizes_equal(ml, hp)   # the graph's GGML_ASSERTs


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff = hp.n_embd, hp.n_vocab, hp.n_ff()
    n_q = hp.n_embd_head_k() * hp.n_head()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output_norm_b = c.create_tensor(tn("OUTPUT_NORM", "bias"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_norm_b = c.create_tensor(tn("ATTN_NORM", "bias", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_q, hp.n_embd_k_gqa(), hp.n_embd_v_gqa())
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_q, n_embd))
        layer.bo = c.create_tensor(tn("ATTN_OUT", "bias", i), (n_embd,))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_norm_b = c.create_tensor(tn("FFN_NORM", "bias", i), (n_embd,))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        layer.ffn_up_b = c.create_tensor(tn("FFN_UP", "bias", i), (n_ff,))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_down_b = c.create_tensor(tn("FFN_DOWN", "bias", i), (n_embd,))


def build(g: GraphContext) -> None:
    """llama_model_jais2::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        cur = g.build_norm(inp_l, layer.attn_norm, layer.attn_norm_b, LLM_NORM, il)
        g.cb(cur, "attn_norm", il)
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur_rope", il)
        g.cb(k, "Kcur_rope", il)
        # wo and the FFN's down projection accumulate in F32 (ggml_prec_set_acc: op parameters only)
        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, 1.0 / math.sqrt(n_embd_head), il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_l = ggml.get_rows(inp_l, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_l)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, layer.ffn_norm_b, LLM_NORM, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, layer.ffn_up_b, None, None, layer.ffn_down, layer.ffn_down_b,
                          LLM_FFN_RELU_SQR, LLM_FFN_SEQ, il)
        g.cb(cur, "ffn_out", il)
        inp_l = ggml.add(cur, ffn_inp)
        inp_l = g.build_cvec(inp_l, il)
        g.cb(inp_l, "l_out", il)

    cur = g.build_norm(inp_l, model.output_norm, model.output_norm_b, LLM_NORM, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
