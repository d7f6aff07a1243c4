"""LLM_ARCH_COHERE2 (src/models/cohere2.cpp): Command R7B, Command A 111B, Tiny Aya.

Command-R's parallel block (attention and a SwiGLU FFN over one LayerNorm without bias, both
added to the input) with three sliding-window layers per global one (llama_kv_cache_iswa); only
the window layers are roped, the global ones have no position encoding. Tied output times
logit_scale.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NORM, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator, load_swa_pattern, require
from ..model_loader import TENSOR_DUPLICATED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.swa_type = LLAMA_SWA_TYPE_STANDARD
    load_swa_pattern(ml, hp, 4)
    hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train)
    hp.n_swa = ml.get_u32("%s.attention.sliding_window")
    hp.f_logit_scale = ml.get_f32("%s.logit_scale")
    hp.f_norm_eps = ml.get_f32("%s.attention.layer_norm_epsilon")
    # the graph asserts it (GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()))
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the cohere2 graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_embd_gqa = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_embd_v_gqa()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab), TENSOR_DUPLICATED)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd, n_embd_gqa, n_embd_gqa)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))


def build(g: GraphContext) -> None:
    """llama_model_cohere2::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv_iswa()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM, il)
        g.cb(cur, "attn_norm", il)
        ffn_inp = cur

        rope_factors = model.get_rope_factors(g.cparams.n_ctx_seq, il)   # none loaded: null
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        if hp.is_swa(il):
            q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
            k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_l = ggml.get_rows(inp_l, inp_out_ids)
            ffn_inp = ggml.get_rows(ffn_inp, inp_out_ids)
        attn_out = cur

        cur = g.build_ffn(ffn_inp, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                          LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, inp_l)
        cur = ggml.add(cur, attn_out)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l, norm=LLM_NORM, output_scale=hp.f_logit_scale or None)
