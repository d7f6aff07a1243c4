"""LLM_ARCH_QWEN2VL (src/models/qwen2vl.cpp): the text models of Qwen2-VL and Qwen2.5-VL.

qwen2's block (Q/K/V biases, SwiGLU FFN, output tied unless present) with M-RoPE over the
rope.dimension_sections (four positions per token); an output bias is loaded where present but
this graph never adds it. Its loader reads only the sections (the RMS epsilon stays 0, which
changes no buffer).
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_MROPE, HParams
from ..model import require_head_sizes_equal
from ..model_loader import ModelLoader
from .qwen2 import load_arch_tensors  # noqa: F401  (llama_model_qwen2vl::load_arch_tensors is qwen2's, line for line)

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_MROPE


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.rope_sections = ml.get_rope_sections()
    # the graph asserts n_embd_head == n_embd_head_k and n_embd_head == n_rot
    require_head_sizes_equal(ml, hp)


def build(g: GraphContext) -> None:
    """llama_model_qwen2vl::graph"""
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
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                          LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    # the lm_head without output_b (qwen2vl.cpp never adds it)
    cur = g.build_norm(inp_l, model.output_norm, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
