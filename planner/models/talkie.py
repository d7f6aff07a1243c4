"""LLM_ARCH_TALKIE (src/models/talkie.cpp): talkie-1930-13b.

RMS norms without weights (the embeddings too), Q roped then RMS-normed with a per-head gain, K
roped then RMS-normed, the attention output and FFN down projections scaled by per-tensor gains
(their ".scale" tensors), every layer adding the normed embeddings times its layer_output_scale,
the logits times logit_scale.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require_head_sizes_equal
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.f_logit_scale = ml.get_f32("%s.logit_scale")   # required
    require_head_sizes_equal(ml, hp)   # the graph's GGML_ASSERTs


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_head = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_head()
    n_embd_head_k, n_embd_gqa = hp.n_embd_head_k(), hp.n_embd_v_gqa()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))   # required; no output_norm
    for i, layer in enumerate(model.layers):
        c.create_tensor_qkv(layer, i, n_embd, n_embd_head_k * n_head, n_embd_gqa, n_embd_gqa)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_head_k * n_head, n_embd))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (1, n_head))   # a gain per head
        layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.out_scale = c.create_tensor(tn("LAYER_OUT_SCALE", "weight", i), (1,))
    # llama_model_base::load_tensors' generic pass over the optional ".scale" tensors, after every
    # layer's own: of those, the converter writes attn_gain and mlp_gain as the attention output's and
    # the FFN down projection's; the others (NVFP4 checkpoints) are not planned and leave a file with
    # them over-counted
    for i, layer in enumerate(model.layers):
        layer.wo_s = c.create_tensor(tn("ATTN_OUT", "scale", i), (1,), TENSOR_NOT_REQUIRED)
        layer.ffn_down_s = c.create_tensor(tn("FFN_DOWN", "scale", i), (1,), TENSOR_NOT_REQUIRED)


def build(g: GraphContext) -> None:
    """llama_model_talkie::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_k()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_l = g.build_norm(inp_l, None, None, LLM_NORM_RMS, -1)
    g.cb(inp_l, "inp_norm", -1)
    embd_skip = inp_l
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()
    kq_scale = 1.0 / math.sqrt(n_embd_head)

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        inp_skip = embd_skip
        cur = g.build_norm(inp_l, None, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        # the reference applies the QK norms after rope
        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        g.cb(q, "Qcur_norm", il)
        k = g.build_norm(k, None, None, LLM_NORM_RMS, il)
        g.cb(k, "Kcur_norm", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, kq_scale, il, wo_s=layer.wo_s)
        g.cb(cur, "attn_out", il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
            inp_skip = ggml.get_rows(inp_skip, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, None, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                          LLM_FFN_SILU, LLM_FFN_PAR, il, down_s=layer.ffn_down_s)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        skip = ggml.mul(inp_skip, layer.out_scale)
        g.cb(skip, "embd_skip", il)
        cur = ggml.add(cur, skip)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    cur = g.build_norm(inp_l, None, None, LLM_NORM_RMS, -1)
    g.cb(cur, "result_norm", -1)
    g.t_embd = cur
    cur = g.build_lora_mm(model.output, cur)
    cur = ggml.scale(cur, hp.f_logit_scale)
    g.cb(cur, "result_output", -1)
    g.t_logits = cur
    ggml.build_forward_expand(g.gf, cur)
