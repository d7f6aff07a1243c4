"""LLM_ARCH_ERNIE4_5 (src/models/ernie4-5.cpp): ERNIE-4.5-0.3B.

Its loader (hparams and tensors) serves ernie4_5-moe and paddleocr too (models.h: both derive
from llama_model_ernie4_5): the llama block with NORM rope over the whole head, an optional
attention output bias that no graph adds, and for ernie4_5-moe experts after the leading dense
layers. This graph is the dense one: a SwiGLU FFN everywhere, output tied unless present.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Model, TensorCreator, require_head_sizes_equal
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM

ERNIE4_5_MOE = "ernie4_5-moe"


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    """llama_model_ernie4_5::load_arch_hparams"""
    if ml.has("%s.rope.dimension_sections"):   # paddleocr's M-RoPE sections (optional here)
        hp.rope_sections = ml.get_rope_sections()
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    if hp.arch == ERNIE4_5_MOE:
        hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
        hp.n_ff_shexp = ml.get_u32("%s.expert_shared_feed_forward_length", 0)
        hp.n_moe_layer_step = ml.get_u32("%s.interleave_moe_layer_step")
        hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count", 0)
    # the three graphs assert n_embd_head == n_embd_head_k and n_embd_head == n_rot
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    """llama_model_ernie4_5::load_arch_tensors"""
    hp = model.hparams
    n_embd, n_vocab, n_expert, n_ff = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_ff()
    n_embd_q, n_embd_gqa = hp.n_embd_head_k() * hp.n_head(), hp.n_embd_v_gqa()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd_q, n_embd_gqa, n_embd_gqa)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_q, n_embd))
        layer.bo = c.create_tensor(tn("ATTN_OUT", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        if hp.arch == ERNIE4_5_MOE and i >= hp.n_layer_dense_lead:   # every later layer, whatever the step
            n_ff_exp = hp.n_ff_exp()
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
            layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,), TENSOR_NOT_REQUIRED)
            layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert),
                                                  TENSOR_NOT_REQUIRED)
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert))
            layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
            if hp.n_ff_shexp > 0:
                layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, hp.n_ff_shexp))
                layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (hp.n_ff_shexp, n_embd))
                layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, hp.n_ff_shexp))
        else:
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))


def build(g: GraphContext) -> None:
    """llama_model_ernie4_5::graph"""
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
        # the output bias is loaded but not added (build_attn gets NULL)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0 / math.sqrt(n_embd_head), il)

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
