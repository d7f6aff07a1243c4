"""LLM_ARCH_STABLELM (src/models/stablelm.cpp): StableLM-3B-4E1T, StableLM 2 1.6B/12B, Zephyr 3B.

LayerNorms with biases, Q/K/V (biases optional), NEOX rope over part of each head, optional
per-head LayerNorms of Q and K before the rope (StableLM 2 12B), no output bias; layers with an
FFN norm run the FFN on the normed residual sum, layers without one (StableLM 2 12B's parallel
residual) on the attention's normed input. Untied output.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon")
    # the graph asserts it (GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()))
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the stablelm graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_embd_gqa, n_embd_head_k = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_embd_v_gqa(), \
        hp.n_embd_head_k()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm_b = c.create_tensor(tn("OUTPUT_NORM", "bias"), (n_embd,))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_norm_b = c.create_tensor(tn("ATTN_NORM", "bias", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd, n_embd_gqa, n_embd_gqa)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        # optional q and k layernorms, present in StableLM 2 12B
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k, hp.n_head()),
                                            TENSOR_NOT_REQUIRED)
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k, hp.n_head_kv()),
                                            TENSOR_NOT_REQUIRED)
        # optional FFN norm, not present in StableLM 2 12B which uses parallel residual
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.ffn_norm_b = c.create_tensor(tn("FFN_NORM", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))


def build(g: GraphContext) -> None:
    """llama_model_stablelm::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        cur = g.build_norm(inp_l, layer.attn_norm, layer.attn_norm_b, LLM_NORM, il)
        g.cb(cur, "attn_norm", il)
        inp_sa = cur

        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        if layer.attn_q_norm is not None:
            q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM, il)
            g.cb(q, "Qcur", il)
        if layer.attn_k_norm is not None:
            k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM, il)
            g.cb(k, "Kcur", il)
        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_l = ggml.get_rows(inp_l, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_l)
        g.cb(ffn_inp, "ffn_inp", il)

        if layer.ffn_norm is not None:
            cur = g.build_norm(ffn_inp, layer.ffn_norm, layer.ffn_norm_b, LLM_NORM, il)
            g.cb(cur, "ffn_norm", il)
        else:   # parallel residual
            cur = inp_sa
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, LLM_FFN_SILU,
                          LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l, norm=LLM_NORM)
