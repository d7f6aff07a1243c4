"""LLM_ARCH_HUNYUAN_MOE (src/models/hunyuan-moe.cpp): Hunyuan-A13B.

GQA attention whose Q and K are RMS-normed per head after the NEOX rope, then on every layer a
shared expert (built first) beside softmax-routed experts sized by feed_forward_length.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, HParams
from ..model import Model, TensorCreator, require_head_sizes_equal
from ..model_loader import ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)   # read, unused
    hp.n_ff_shexp = ml.get_u32("%s.expert_shared_feed_forward_length", 0)
    require_head_sizes_equal(ml, hp)


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert, n_embd_head_k = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_embd_head_k()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        n_ff = hp.n_ff(i)
        n_ff_shexp = hp.n_ff_shexp if hp.n_ff_shexp > 0 else n_ff
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd_head_k * hp.n_head(i), hp.n_embd_k_gqa(i), hp.n_embd_v_gqa(i))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_head_k * hp.n_head(i), n_embd))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k,))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k,))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
        layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff, n_expert))
        layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff, n_embd, n_expert))
        layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff, n_expert))
        layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp))
        layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp))
        layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd))


def build(g: GraphContext) -> None:
    """llama_model_hunyuan_moe::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    kq_scale = 1.0 / math.sqrt(n_embd_head)
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)

        rope_factors = model.get_rope_factors(g.cparams.n_ctx_seq, il)
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(il), hp.n_head_kv(il), il)
        q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
        g.cb(k, "Kcur_norm", il)
        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        g.cb(q, "Qcur_norm", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, kq_scale, il)
        g.cb(cur, "attn_out", il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        cur_mlp = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp, None,
                              LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur_mlp, "ffn_mlp", il)
        cur_moe = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                                  None, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU, True, hp.expert_weights_scale,
                                  LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il)
        g.cb(cur_moe, "ffn_moe_out", il)
        ffn_out = ggml.add(cur_moe, cur_mlp)
        g.cb(ffn_out, "ffn_out", il)
        cur = ggml.add(ffn_out, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
