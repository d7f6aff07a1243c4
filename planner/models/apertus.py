"""LLM_ARCH_APERTUS (src/models/apertus.cpp): Apertus 8B, 70B.

The llama block with per-head QK RMS norms before rope (their optional biases loaded, not used),
optional rope factors, and an ungated FFN whose activation is xIELU with per-layer parameters
(xielu.alpha_n, alpha_p, beta, eps).
"""
from __future__ import annotations

from .. import ggml
from ..graph import LLM_NORM_RMS, GraphContext, kq_scale_for
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require_head_sizes_equal
from ..model_loader import TENSOR_NOT_REQUIRED, ModelLoader, tn
from .llama import create_rope_factors

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    # per-layer float arrays of the trunk's layers, under keys without the architecture's prefix
    hp.xielu_alpha_n = ml.get_key_or_arr_f32("xielu.alpha_n", hp.n_layer)
    hp.xielu_alpha_p = ml.get_key_or_arr_f32("xielu.alpha_p", hp.n_layer)
    hp.xielu_beta = ml.get_key_or_arr_f32("xielu.beta", hp.n_layer)
    hp.xielu_eps = ml.get_key_or_arr_f32("xielu.eps", hp.n_layer)
    require_head_sizes_equal(ml, hp)   # the graph's GGML_ASSERTs


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_ff, n_embd_head_k = hp.n_embd, hp.n_vocab, hp.n_ff(), hp.n_embd_head_k()
    n_embd_q, n_embd_gqa = n_embd_head_k * hp.n_head(), hp.n_embd_v_gqa()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    model.output_norm = c.create_tensor(tn("OUTPUT_NORM", "weight"), (n_embd,))
    model.output = c.create_tensor(tn("OUTPUT", "weight"), (n_embd, n_vocab))
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        create_rope_factors(c, layer, i, hp, hp.n_rot())
        c.create_tensor_qkv(layer, i, n_embd, n_embd_q, n_embd_gqa, n_embd_gqa)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_q, n_embd))
        layer.bo = c.create_tensor(tn("ATTN_OUT", "bias", i), (n_embd,), TENSOR_NOT_REQUIRED)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
        layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k,))
        c.create_tensor(tn("ATTN_Q_NORM", "bias", i), (n_embd_head_k,), TENSOR_NOT_REQUIRED)
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k,))
        c.create_tensor(tn("ATTN_K_NORM", "bias", i), (n_embd_head_k,), TENSOR_NOT_REQUIRED)


def build(g: GraphContext) -> None:
    """llama_model_apertus::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    kq_scale = kq_scale_for(hp, n_embd_head)
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        rope_factors = model.get_rope_factors(g.cparams.n_ctx_seq, il)
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        g.cb(q, "Qcur_normed", il)
        k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
        g.cb(k, "Kcur_normed", il)
        q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur_pos", il)
        g.cb(k, "Kcur_pos", il)
        g.cb(v, "Vcur_pos", il)
        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, kq_scale, il)
        g.cb(cur, "attn_out", il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        up = g.build_lora_mm(layer.ffn_up, cur)
        g.cb(up, "ffn_up", il)
        activated = ggml.xielu(up, hp.xielu_alpha_n[il], hp.xielu_alpha_p[il], hp.xielu_beta[il], hp.xielu_eps[il])
        g.cb(activated, "ffn_xielu", il)
        cur = g.build_lora_mm(layer.ffn_down, activated)
        g.cb(cur, "ffn_down", il)
        cur = ggml.add(cur, ffn_inp)
        g.cb(cur, "ffn_out", il)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
