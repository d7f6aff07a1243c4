"""LLM_ARCH_DEEPSEEK (src/models/deepseek.cpp): DeepSeek-MoE-16B (base, chat).

Llama attention (norm rope, Q sized n_embd), leading dense layers, then softmax-routed experts
beside n_expert_shared shared experts fused into one FFN of n_ff_exp * n_expert_shared; deepseek2
without MLA, routing bias or groups.
"""
from __future__ import annotations

from .. import ggml
from ..graph import (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext,
                     kq_scale_for)
from ..hparams import LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Model, TensorCreator, require, require_head_sizes_equal
from ..model_loader import ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count", 0)
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count")
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    require_head_sizes_equal(ml, hp)
    # Q and the output projection are n_embd wide: build_qkv's reshape to heads needs n_embd = heads * head size
    require(ml, all(hp.n_embd == hp.n_head(il) * hp.n_embd_head_k() for il in range(hp.n_layer)),
            f"the deepseek graph needs {ml.key('%s.embedding_length')} ({hp.n_embd}) = heads * head size")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert = hp.n_embd, hp.n_vocab, hp.n_expert
    n_ff_exp, n_ff_shexp = hp.n_ff_exp(), hp.n_ff_exp() * hp.n_expert_shared
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd, hp.n_embd_k_gqa(i), hp.n_embd_v_gqa(i))
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd, n_embd))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        if i < hp.n_layer_dense_lead:
            n_ff = hp.n_ff(i)
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
        else:
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
            require(c.ml, n_expert > 0, "n_expert must be > 0")
            require(c.ml, hp.n_expert_used() > 0, "n_expert_used must be > 0")
            layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert))
            layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
            layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp))
            layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd))
            layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp))


def build(g: GraphContext) -> None:
    """llama_model_deepseek::graph"""
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

        rope_factors = model.get_rope_factors(g.cparams.n_ctx_seq, il)   # none loaded: NULL
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(il), hp.n_head_kv(il), il)
        q = ggml.rope_ext(q, inp_pos, rope_factors, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        k = ggml.rope_ext(k, inp_pos, rope_factors, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, kq_scale, il)

        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)

        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        if il < hp.n_layer_dense_lead:
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                              LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(cur, "ffn_out", il)
        else:
            moe_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                      layer.ffn_down_exps, None, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU, False,
                                      hp.expert_weights_scale, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il)
            g.cb(moe_out, "ffn_moe_out", il)
            ffn_shexp = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp,
                                    None, LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(ffn_shexp, "ffn_shexp", il)
            cur = ggml.add(moe_out, ffn_shexp)
            g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
