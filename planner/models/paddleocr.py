"""LLM_ARCH_PADDLEOCR (src/models/paddleocr.cpp): PaddleOCR-VL (text: ERNIE-4.5-0.3B).

models.h: llama_model_paddleocr derives from llama_model_ernie4_5 and reuses its loader (hparams
with the optional rope sections, tensors with the optional attention output bias). Its graph is
qwen2vl's block (M-RoPE over the sections, four positions per token; Q/K/V biases optional), with
the attention output bias added where present, a SwiGLU FFN, output tied unless present.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_MROPE
from .ernie4_5 import load_arch_hparams, load_arch_tensors  # noqa: F401  (llama_model_ernie4_5's, as models.h has it)

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_MROPE


def build(g: GraphContext) -> None:
    """llama_model_paddleocr::graph (the loader's require_head_sizes_equal stands for its asserts)"""
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
        q = ggml.rope_multi(q, inp_pos, None, hp.n_rot(), hp.rope_sections, hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_multi(k, inp_pos, None, hp.n_rot(), hp.rope_sections, hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, 1.0 / math.sqrt(n_embd_head), il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, LLM_FFN_SILU,
                          LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
