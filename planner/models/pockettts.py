"""LLM_ARCH_POCKETTTS (src/models/pockettts.cpp): the backbone of Kyutai's Pocket TTS.

The "text" transformer of a flow language model (llama-tts runs it with embeddings on and hands
its hidden state to the flow net in the projector): LayerNorms with biases, Q/K/V without biases
(each optional, or a fused attn_qkv), NORM rope over the whole head, a GELU FFN without gate or
biases, an output LayerNorm with bias. It has no lm_head: the token embedding is loaded again as
the output, so a sampler can still run on the (unused) logits.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_GELU, LLM_FFN_SEQ, LLM_NORM, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Model, TensorCreator, require_head_sizes_equal
from ..model_loader import TENSOR_DUPLICATED, TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon")
    # the graph asserts both (GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()), == n_rot)
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_embd_gqa = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_embd_v_gqa()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output_norm_b = c.create_tensor(tn("OUTPUT_NORM", "bias"), (n_embd,))
    # no output head: the embedding table again, whether or not the file holds an output.weight
    model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_norm_b = c.create_tensor(tn("ATTN_NORM", "bias", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd, n_embd_gqa, n_embd_gqa, TENSOR_NOT_REQUIRED)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_norm_b = c.create_tensor(tn("FFN_NORM", "bias", i), (n_embd,))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))


def build(g: GraphContext) -> None:
    """llama_model_pockettts::graph"""
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
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il, wo_s=layer.wo_s)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_l = ggml.get_rows(inp_l, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_l)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, layer.ffn_norm_b, LLM_NORM, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, None, None, layer.ffn_down, None,
                          LLM_FFN_GELU, LLM_FFN_SEQ, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l, norm=LLM_NORM)
