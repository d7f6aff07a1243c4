"""LLM_ARCH_MPT (src/models/mpt.cpp): MPT-7B, MPT-30B and their fine-tunes.

ALiBi (attention.max_alibi_bias; 0 for a checkpoint without it) and, where the file holds them,
learned positions; a fused QKV clamped by attention.clamp_kqv (clip_qkv) when set; LayerNorms
and projections whose biases are optional (MPT's no_bias checkpoints have none); a GELU FFN
without gate, divided by AWQ's activation scales where present; an lm_head tied unless present.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_GELU, LLM_FFN_SEQ, LLM_NORM, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NONE, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NONE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon")
    hp.f_clamp_kqv = ml.get_f32("%s.attention.clamp_kqv", 0.0)
    hp.f_max_alibi_bias = ml.get_f32("%s.attention.max_alibi_bias", 0.0)
    # the graph asserts it (GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()))
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the mpt graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_embd_gqa = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_embd_v_gqa()
    opt = TENSOR_NOT_REQUIRED
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.pos_embd = c.create_tensor(tn("POS_EMBD", "weight"), (n_embd, hp.n_ctx_train), opt)
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output_norm_b = c.create_tensor(tn("OUTPUT_NORM", "bias"), (n_embd,), opt)
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), opt)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_norm_b = c.create_tensor(tn("ATTN_NORM", "bias", i), (n_embd,), opt)
        layer.wqkv = c.create_tensor(tn("ATTN_QKV", "weight", i), (n_embd, n_embd + 2 * n_embd_gqa))
        layer.bqkv = c.create_tensor(tn("ATTN_QKV", "bias", i), (n_embd + 2 * n_embd_gqa,), opt)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.bo = c.create_tensor(tn("ATTN_OUT", "bias", i), (n_embd,), opt)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_norm_b = c.create_tensor(tn("FFN_NORM", "bias", i), (n_embd,), opt)
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_down_b = c.create_tensor(tn("FFN_DOWN", "bias", i), (n_embd,), opt)
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        layer.ffn_up_b = c.create_tensor(tn("FFN_UP", "bias", i), (n_ff,), opt)
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd,), opt)
        layer.attn_q_norm_b = c.create_tensor(tn("ATTN_Q_NORM", "bias", i), (n_embd,), opt)
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd,), opt)
        layer.attn_k_norm_b = c.create_tensor(tn("ATTN_K_NORM", "bias", i), (n_embd,), opt)
        layer.ffn_act = c.create_tensor(tn("FFN_ACT", "scales", i), (n_ff,), opt)


def build(g: GraphContext) -> None:
    """llama_model_mpt::graph"""
    model, hp = g.model, g.hparams
    n_embd_head, n_head, n_head_kv = hp.n_embd_head_v(), hp.n_head(), hp.n_head_kv()
    n_tokens = g.ubatch.n_tokens
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_attn = g.build_attn_inp_kv()
    if model.pos_embd is not None:
        inp_pos = g.build_inp_pos()
        pos = ggml.get_rows(model.pos_embd, inp_pos)
        g.cb(pos, "pos_embd", -1)
        inp_l = ggml.add(inp_l, pos)
        g.cb(inp_l, "inpL", -1)
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        attn_norm = g.build_norm(inp_l, layer.attn_norm, layer.attn_norm_b, LLM_NORM, il)
        g.cb(attn_norm, "attn_norm", il)

        q, k, v = g.build_qkv(layer, attn_norm, n_embd_head, n_head, n_head_kv, il)
        if layer.attn_q_norm is not None:
            # Q and K are views of the fused product: ggml_reshape_2d's GGML_ASSERT(ggml_is_contiguous)
            # aborts llama.cpp here (mpt.cpp's FIXME: "test-llama-archs crashes if q_norm is created")
            q = ggml.reshape(q, n_embd_head * n_head, n_tokens)
            k = ggml.reshape(k, n_embd_head * n_head_kv, n_tokens)
            q = g.build_norm(q, layer.attn_q_norm, layer.attn_q_norm_b, LLM_NORM, il)
            k = g.build_norm(k, layer.attn_k_norm, layer.attn_k_norm_b, LLM_NORM, il)
            q = ggml.reshape(q, n_embd_head, n_head, n_tokens)
            k = ggml.reshape(k, n_embd_head, n_head_kv, n_tokens)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, 1.0 / math.sqrt(n_embd_head), il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_l = ggml.get_rows(inp_l, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_l)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, layer.ffn_norm_b, LLM_NORM, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, layer.ffn_up_b, None, None, layer.ffn_down, layer.ffn_down_b,
                          LLM_FFN_GELU, LLM_FFN_SEQ, il, act_scales=layer.ffn_act)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l, norm=LLM_NORM)
