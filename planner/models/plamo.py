"""LLM_ARCH_PLAMO (src/models/plamo.cpp): PLaMo-13B.

A parallel block: one RMS norm feeds both the attention (NEOX rope over the whole head, GQA whose
Q/O the converter shuffles so ggml_mul_mat broadcasts the shared heads) and the SwiGLU FFN; the
layer output adds the FFN output, the attention output and the layer input. Untied output.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require_head_sizes_equal
from ..model_loader import ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    """llama_model_plamo::load_arch_hparams"""
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    # the graph asserts n_embd_head == n_embd_head_k and n_embd_head == n_rot
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    """llama_model_plamo::load_arch_tensors"""
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_embd_gqa = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_embd_v_gqa()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd, n_embd_gqa, n_embd_gqa)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))


def build(g: GraphContext) -> None:
    """llama_model_plamo::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        sa_inp = cur

        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        q = ggml.rope_ext(q, inp_pos, None, n_embd_head, hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, n_embd_head, hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            sa_inp = ggml.get_rows(sa_inp, inp_out_ids)
            inp_l = ggml.get_rows(inp_l, inp_out_ids)
        sa_out = cur

        cur = g.build_ffn(sa_inp, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                          LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, sa_out)
        cur = ggml.add(cur, inp_l)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
