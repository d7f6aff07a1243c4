"""LLM_ARCH_AFMOE (src/models/afmoe.cpp): Arcee Trinity Nano, Mini, Large (AFMoE).

Embeddings scaled by sqrt(n_embd) (muP); three sliding-window layers to one full layer
(llama_kv_cache_iswa) with no rope on every fourth layer (n_no_rope_layer_step); norms before and
after both attention and FFN; per-head QK norms; the attention output gated by the sigmoid of a
projection of the layer input before wo; leading dense layers, then sigmoid-routed experts with a
selection bias beside optional shared experts.
"""
from __future__ import annotations

import math

from .. import ggml
from ..graph import LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext
from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_SWA_TYPE_NONE, LLAMA_SWA_TYPE_STANDARD, HParams
from ..model import Model, TensorCreator, load_swa_pattern, require, require_gating_func
from ..model_loader import ModelLoader, tn

LLAMA_ROPE_TYPE = LLAMA_ROPE_TYPE_NEOX


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count", 0)
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count")
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func", 0) or LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    hp.n_swa = ml.get_u32("%s.attention.sliding_window", 0)
    if hp.n_swa > 0:
        hp.swa_type = LLAMA_SWA_TYPE_STANDARD
        load_swa_pattern(ml, hp, 4)
        hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train)
    else:
        hp.swa_type = LLAMA_SWA_TYPE_NONE
    require_gating_func(ml, hp)
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),
            f"the afmoe graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")
    # the graph builds the sliding-window cache's inputs unconditionally: without a window the cache
    # is a plain one, read as the iswa cache's context (a bad cast: llama.cpp dies of SIGSEGV, checked)
    if hp.swa_type != LLAMA_SWA_TYPE_STANDARD:
        ml.fail(f"{ml.key('%s.attention.sliding_window')} is 0 or absent: llama.cpp's afmoe graph reads the "
                "sliding-window cache it then does not create and crashes (SIGSEGV)")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert, n_ff = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_ff()
    n_embd_q, n_ff_exp = hp.n_embd_head_k() * hp.n_head(), hp.n_ff_exp()
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        layer.attn_post_norm = c.create_tensor(tn("ATTN_POST_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd_q, hp.n_embd_k_gqa(), hp.n_embd_v_gqa())
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_q, n_embd))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (hp.n_embd_head_k(),))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (hp.n_embd_head_k(),))
        layer.wqkv_gate = c.create_tensor(tn("ATTN_GATE", "weight", i), (n_embd, n_embd_q))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        layer.ffn_post_norm = c.create_tensor(tn("FFN_POST_NORM", "weight", i), (n_embd,))
        if i >= hp.n_layer_dense_lead:
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
            layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,))
            layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert))
            layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
            if hp.n_expert_shared > 0:
                n_ff_shexp = n_ff_exp * hp.n_expert_shared
                layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp))
                layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd))
                layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp))
        else:
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))


def build(g: GraphContext) -> None:
    """llama_model_afmoe::graph"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_l = ggml.scale(inp_l, math.sqrt(hp.n_embd))   # muP
    g.cb(inp_l, "inp_embd_scaled", -1)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv_iswa()
    inp_out_ids = g.build_inp_out_ids()
    kq_scale = 1.0 / math.sqrt(n_embd_head)

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        use_rope = hp.n_no_rope_layer_step > 0 and (il + 1) % hp.n_no_rope_layer_step != 0
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        attn_inp = cur
        q, k, v = g.build_qkv(layer, cur, n_embd_head, hp.n_head(), hp.n_head_kv(), il)
        gate = g.build_lora_mm(layer.wqkv_gate, attn_inp)
        g.cb(gate, "attn_gate_proj", il)
        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
        g.cb(q, "Qcur_normed", il)
        g.cb(k, "Kcur_normed", il)
        if use_rope:
            q = ggml.rope_ext(q, inp_pos, None, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
            g.cb(q, "Qcur_rope", il)
            k = ggml.rope_ext(k, inp_pos, None, hp.n_rot(il), hp.rope_type, hp.n_ctx_orig_yarn)
            g.cb(k, "Kcur_rope", il)
        cur = g.build_attn(inp_attn, None, None, q, k, v, kq_scale, il)   # wo after the gate
        g.cb(cur, "attn_out", il)
        cur = build_attn_gated_out(g, layer, cur, gate, il)
        cur = g.build_norm(cur, layer.attn_post_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_post_norm", il)
        if il == hp.n_layer - 1:
            cur = ggml.get_rows(cur, inp_out_ids)
            inp_sa = ggml.get_rows(inp_sa, inp_out_ids)
        ffn_inp = ggml.add(cur, inp_sa)
        g.cb(ffn_inp, "ffn_inp", il)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_norm", il)
        if il >= hp.n_layer_dense_lead:
            moe_out = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps,
                                      layer.ffn_down_exps, layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(),
                                      LLM_FFN_SILU, hp.expert_weights_norm, hp.expert_weights_scale,
                                      hp.expert_gating_func, il)
            g.cb(moe_out, "ffn_moe_out", il)
            if hp.n_expert_shared > 0:
                ffn_shexp = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None,
                                        layer.ffn_down_shexp, None, LLM_FFN_SILU, LLM_FFN_PAR, il)
                g.cb(ffn_shexp, "ffn_shexp", il)
                cur = ggml.add(moe_out, ffn_shexp)
                g.cb(cur, "ffn_out", il)
            else:
                cur = moe_out
        else:
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                              LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(cur, "ffn_out", il)
        cur = g.build_norm(cur, layer.ffn_post_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "ffn_post_norm", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)


def build_attn_gated_out(g: GraphContext, layer, cur, gate, il: int):
    """afmoe.cpp's attention gate (muse-glimmer.cpp repeats it): the attention output times the
    sigmoid of the gate projection, element-wise, then wo."""
    gate = ggml.unary(gate, "SIGMOID")
    g.cb(gate, "attn_gate_sig", il)
    cur = ggml.mul(cur, gate)
    g.cb(cur, "attn_gated", il)
    cur = g.build_lora_mm(layer.wo, cur)
    g.cb(cur, "attn_o_proj", il)
    return cur
