"""LLM_ARCH_OPENELM (src/models/openelm.cpp): Apple OpenELM 270M, 450M, 1.1B, 3B.

Layer-wise scaling: every layer has its own query and KV head counts and FFN width (head_count,
head_count_kv and feed_forward_length are per-layer arrays). The block is llama's with a fused QKV
(one product viewed as Q, K and V heads of n_embd_head_k), per-head Q/K RMS norms before NEOX rope,
and a SwiGLU FFN; the output is always tied to the token embedding.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import TENSOR_DUPLICATED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    # the graph asserts n_embd_head == n_embd_head_k
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the {ml.arch} graph needs equal K and V head sizes ({hp.n_embd_head_k()}, {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_embd_head_k = hp.n_embd, hp.n_vocab, hp.n_embd_head_k()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    for i, layer in enumerate(model.layers):
        n_head, n_ff = hp.n_head(i), hp.n_ff(i)
        n_head_qkv = 2 * hp.n_head_kv(i) + n_head
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.wqkv = c.create_tensor(tn("ATTN_QKV", "weight", i), (n_embd, n_head_qkv * n_embd_head_k))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k,))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k,))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_head * n_embd_head_k, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))


def build(g: GraphContext) -> None:
    """llama_model_openelm::graph"""
    model, hp = g.model, g.hparams
    n_embd_head, n_embd_head_k, n_tokens = hp.n_embd_head_v(), hp.n_embd_head_k(), g.ubatch.n_tokens
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        n_head, n_head_kv = hp.n_head(il), hp.n_head_kv(il)
        n_head_qkv = 2 * n_head_kv + n_head
        residual = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        cur = g.build_lora_mm(layer.wqkv, cur)
        g.cb(cur, "wqkv", il)
        cur = ggml.reshape(cur, n_embd_head_k, n_head_qkv, n_tokens)
        q = ggml.view(cur, (n_embd_head, n_head, n_tokens), (cur.nb[1], cur.nb[2]), 0)
        g.cb(q, "Qcur", il)
        k = ggml.view(cur, (n_embd_head, n_head_kv, n_tokens), (cur.nb[1], cur.nb[2]), cur.nb[1] * n_head)
        g.cb(k, "Kcur", il)
        v = ggml.view(cur, (n_embd_head, n_head_kv, n_tokens), (cur.nb[1], cur.nb[2]),
                      cur.nb[1] * (n_head + n_head_kv))
        g.cb(v, "Vcur", il)
        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        g.cb(q, "Qcur", il)
        k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
        g.cb(k, "Kcur", il)
        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(q, "Vcur", il)   # sic: openelm.cpp names the roped Q "Vcur"
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)

        if il == hp.n_layer - 1:
            residual = ggml.get_rows(residual, inp_out_ids)
            cur = ggml.get_rows(cur, inp_out_ids)
        ffn_inp = ggml.add(residual, cur)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                          LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
