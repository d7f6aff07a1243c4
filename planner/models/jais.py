"""LLM_ARCH_JAIS (src/models/jais.cpp): Jais (13B, 30B) and the Jais family (590M to 30B).

GPT-2 with ALiBi instead of positions: no rope and no position input; attention.max_alibi_bias
(the converter's, from the checkpoint's slopes) goes to the softmax or flash attention, and makes
llama.cpp fill the KQ mask with -|p0 - p1| (use_alibi). LayerNorms with biases, a fused biased QKV,
KQ scaled by 1/n_embd_head (muP), a SwiGLU FFN with biases, an output LayerNorm and an lm_head.
"""
from __future__ import annotations

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NONE, HParams
from ..model import Model, TensorCreator, require
from ..model_loader import ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NONE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon")
    hp.f_max_alibi_bias = ml.get_f32("%s.attention.max_alibi_bias", 0.0)
    # the graph asserts n_embd_head == n_embd_head_k
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the {ml.arch} graph needs equal K and V head sizes ({hp.n_embd_head_k()}, {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_embd_gqa = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_embd_v_gqa()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output_norm_b = c.create_tensor(tn("OUTPUT_NORM", "bias"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_norm_b = c.create_tensor(tn("ATTN_NORM", "bias", i), (n_embd,))
        layer.wqkv = c.create_tensor(tn("ATTN_QKV", "weight", i), (n_embd, n_embd + 2 * n_embd_gqa))
        layer.bqkv = c.create_tensor(tn("ATTN_QKV", "bias", i), (n_embd + 2 * n_embd_gqa,))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.bo = c.create_tensor(tn("ATTN_OUT", "bias", i), (n_embd,))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_norm_b = c.create_tensor(tn("FFN_NORM", "bias", i), (n_embd,))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_down_b = c.create_tensor(tn("FFN_DOWN", "bias", i), (n_embd,))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_gate_b = c.create_tensor(tn("FFN_GATE", "bias", i), (n_ff,))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        layer.ffn_up_b = c.create_tensor(tn("FFN_UP", "bias", i), (n_ff,))


def build(g: GraphContext) -> None:
    """llama_model_jais::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        cur = g.build_norm(inp_l, layer.attn_norm, layer.attn_norm_b, LLM_NORM, il)
        g.cb(cur, "attn_norm", il)

        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, 1.0 / n_embd_head, il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_l = ggml.get_rows(inp_l, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_l)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, layer.ffn_norm_b, LLM_NORM, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, layer.ffn_up_b, layer.ffn_gate, layer.ffn_gate_b, layer.ffn_down,
                          layer.ffn_down_b, LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l, norm=LLM_NORM)
