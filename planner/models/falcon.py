"""LLM_ARCH_FALCON (src/models/falcon.cpp): Falcon 7B, 40B, 180B.

A parallel block: the attention and a GELU FFN without gate (no biases) are both added to the
layer input; the FFN reads the attention's input LayerNorm (attn_norm), and Falcon-40B/180B's
attention reads its own (attn_norm_2) where the file holds one. NEOX rope over the whole head
(llama.cpp refuses another rope.dimension_count), a fused QKV without bias (one KV head for 7B,
8 for 40B/180B), an output projection without bias, an output LayerNorm and an lm_head tied
unless present.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_GELU, LLM_FFN_SEQ, LLM_NORM, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon")
    # the graph asserts it (GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()); n_rot is checked by
    # load_hparams' "invalid n_rot" for falcon)
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the falcon graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_embd_gqa = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_embd_v_gqa()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output_norm_b = c.create_tensor(tn("OUTPUT_NORM", "bias"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab), TENSOR_NOT_REQUIRED)
    if model.output is None:
        model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_norm_b = c.create_tensor(tn("ATTN_NORM", "bias", i), (n_embd,))
        layer.attn_norm_2 = c.create_tensor(tn("ATTN_NORM_2", "weight", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.attn_norm_2_b = c.create_tensor(tn("ATTN_NORM_2", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.wqkv = c.create_tensor(tn("ATTN_QKV", "weight", i), (n_embd, n_embd + 2 * n_embd_gqa))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))


def build(g: GraphContext) -> None:
    """llama_model_falcon::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        attn_norm = g.build_norm(inp_l, layer.attn_norm, layer.attn_norm_b, LLM_NORM, il)
        g.cb(attn_norm, "attn_norm", il)
        if layer.attn_norm_2 is not None:   # Falcon-40B
            cur = g.build_norm(inp_l, layer.attn_norm_2, layer.attn_norm_2_b, LLM_NORM, il)
            g.cb(cur, "attn_norm_2", il)
        else:
            cur = attn_norm

        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_l = ggml.get_rows(inp_l, inp_out_ids)
            attn_norm = ggml.get_rows(attn_norm, inp_out_ids)
        ffn_inp = cur

        # the FFN reads the attention's input norm, not its result
        cur = g.build_ffn(attn_norm, layer.ffn_up, None, None, None, layer.ffn_down, None, LLM_FFN_GELU,
                          LLM_FFN_SEQ, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = ggml.add(cur, inp_l)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l, norm=LLM_NORM)
