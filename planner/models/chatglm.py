"""LLM_ARCH_CHATGLM (src/models/chatglm.cpp): ChatGLM3-6B, GLM-4-9B-chat (the THUDM checkpoints).

The llama block with a fused, biased QKV (create_tensor_qkv takes attn_qkv + its bias as the
converter writes them), NORM rope over rope.dimension_count (the converter's half of the head), a
fused gate+up SwiGLU FFN (ffn_up of 2 * n_ff rows), output tied unless present.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_SEQ, LLM_FFN_SWIGLU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    """llama_model_chatglm::load_arch_hparams"""
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    # the graph asserts it (GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()))
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the chatglm graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    """llama_model_chatglm::load_arch_tensors"""
    hp = model.hparams
    n_embd, n_vocab, n_ff = hp.n_embd, hp.n_vocab, hp.n_ff()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, hp.n_embd_head_k() * hp.n_head(), hp.n_embd_k_gqa(),
                            hp.n_embd_v_gqa())
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff * 2))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))


def build(g: GraphContext) -> None:
    """llama_model_chatglm::graph"""
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
        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, None, None, layer.ffn_down, None, LLM_FFN_SWIGLU, LLM_FFN_SEQ, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
