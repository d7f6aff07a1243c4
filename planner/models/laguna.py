"""LLM_ARCH_LAGUNA (src/models/laguna.cpp): poolside Laguna XS.2, S.2, M.1.

afmoe's MoE and gate structure without its muP scale and post-norms: per-head QK norms, per-layer
head counts (the KV head count uniform), the attention output gated by the softplus of a projection
of the layer input before wo (one scalar per head, broadcast over the head, or one per element: the
gate's stored width says which); with a sliding window (XS.2) three windowed layers to one full one
(llama_kv_cache_iswa, the windowed layers with plain rope over their own dimensions), without one
(M.1) full attention over a plain cache; leading dense layers, then sigmoid-routed experts with a
selection bias beside one always-on shared expert of its own size.
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
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count")
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func", 0)
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    # one shared expert unless the file says otherwise; its size its own (or the experts' times their count)
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count", 1)
    hp.n_ff_shexp = ml.get_u32("%s.expert_shared_feed_forward_length", 0) or hp.n_ff_exp() * hp.n_expert_shared
    hp.n_swa = ml.get_u32("%s.attention.sliding_window", 0)
    if hp.n_swa > 0:
        hp.swa_type = LLAMA_SWA_TYPE_STANDARD
        load_swa_pattern(ml, hp, 4, dense_first=True)   # XS.2: full at il % 4 == 0
        # the windowed layers' rope (their base, and their dimensions as the base loader reads them)
        hp.rope_freq_base_train_swa = ml.get_f32("%s.rope.freq_base_swa", hp.rope_freq_base_train)
    else:
        hp.swa_type = LLAMA_SWA_TYPE_NONE
    hp.expert_gating_func = hp.expert_gating_func or LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
    if hp.n_layer_dense_lead < hp.n_layer:   # build_moe_ffn's GGML_ABORT on an unknown gating function
        require_gating_func(ml, hp)
    require(ml, hp.n_embd_head_v() == hp.n_embd_head_k(),   # the graph's GGML_ASSERT
            f"the laguna graph needs equal K and V head sizes (K {hp.n_embd_head_k()}, V {hp.n_embd_head_v()})")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_expert, n_ff = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_ff()
    n_embd_head_k, n_embd_head_v = hp.n_embd_head_k(), hp.n_embd_head_v()
    n_ff_exp, n_ff_shexp = hp.n_ff_exp(), hp.n_ff_shexp
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    for i, layer in enumerate(model.layers):
        n_head_il, n_head_kv_il = hp.n_head(i), hp.n_head_kv(i)
        n_embd_q_il = n_embd_head_k * n_head_il
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", i), (n_embd,))
        c.create_tensor_qkv(layer, i, n_embd, n_embd_q_il, n_embd_head_k * n_head_kv_il, n_embd_head_v * n_head_kv_il)
        layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", i), (n_embd_q_il, n_embd))
        layer.attn_q_norm = c.create_tensor(tn("ATTN_Q_NORM", "weight", i), (n_embd_head_k,))
        layer.attn_k_norm = c.create_tensor(tn("ATTN_K_NORM", "weight", i), (n_embd_head_k,))
        # the gate's width in the file picks per head or per element; without the tensor, per head
        gate = c.ml.get_weight(tn("ATTN_GATE", "weight", i).name)
        n_gate_out = n_head_il
        if gate is not None:
            n_gate_out = (tuple(gate.info.ne) + (1,))[1]
            if n_gate_out not in (n_head_il, n_embd_q_il):
                c.ml.fail(f"llama.cpp would abort loading this model (GGML_ABORT): Laguna: unexpected attention gate "
                          f"width {n_gate_out} at layer {i} (expected {n_head_il} per-head or {n_embd_q_il} per-element)")
        layer.wqkv_gate = c.create_tensor(tn("ATTN_GATE", "weight", i), (n_embd, n_gate_out))
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", i), (n_embd,))
        if i >= hp.n_layer_dense_lead:
            layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", i), (n_embd, n_expert))
            layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", i), (n_expert,))
            layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
            layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", i), (n_embd, n_ff_exp, n_expert))
            layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", i), (n_ff_exp, n_embd, n_expert))
            layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", i), (n_embd, n_ff_shexp))
            layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", i), (n_embd, n_ff_shexp))
            layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", i), (n_ff_shexp, n_embd))
        else:
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", i), (n_embd, n_ff))
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", i), (n_embd, n_ff))
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", i), (n_ff, n_embd))


def build(g: GraphContext) -> None:
    """llama_model_laguna::graph (the rope's per-layer-type parameters change no shape; only the
    windowed layers' dimensions, n_rot_swa, are carried)"""
    model, hp = g.model, g.hparams
    n_embd_head = hp.n_embd_head_v()
    inp_l = g.build_inp_embd(model.tok_embd)
    inp_pos = g.build_inp_pos()
    has_swa = hp.swa_type != LLAMA_SWA_TYPE_NONE
    inp_attn = g.build_attn_inp_kv_iswa() if has_swa else g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()
    kq_scale = 1.0 / math.sqrt(n_embd_head)

    for il, layer in enumerate(model.layers):
        n_head_il = hp.n_head(il)
        n_rot_l = hp.n_rot_swa if hp.is_swa(il) else hp.n_rot()
        n_ctx_orig_l = hp.n_ctx_train if hp.is_swa(il) else hp.n_ctx_orig_yarn
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        attn_inp = cur
        q, k, v = g.build_qkv(layer, cur, n_embd_head, n_head_il, hp.n_head_kv(il), il)
        gate = g.build_lora_mm(layer.wqkv_gate, attn_inp)
        g.cb(gate, "attn_gate_proj", il)
        q = g.build_norm(q, layer.attn_q_norm, None, LLM_NORM_RMS, il)
        k = g.build_norm(k, layer.attn_k_norm, None, LLM_NORM_RMS, il)
        g.cb(q, "Qcur_normed", il)
        g.cb(k, "Kcur_normed", il)
        q = ggml.rope_ext(q, inp_pos, None, n_rot_l, hp.rope_type, n_ctx_orig_l)
        k = ggml.rope_ext(k, inp_pos, None, n_rot_l, hp.rope_type, n_ctx_orig_l)
        g.cb(q, "Qcur_rope", il)
        g.cb(k, "Kcur_rope", il)
        cur = g.build_attn(inp_attn, None, None, q, k, v, kq_scale, il)   # wo after the gate
        g.cb(cur, "attn_out", il)
        gate = ggml.unary(gate, "SOFTPLUS")
        g.cb(gate, "attn_gate_softplus", il)
        n_tokens = cur.ne[1]
        if layer.wqkv_gate.ne[1] == n_head_il:   # one gate per head, broadcast over the head
            cur = ggml.reshape(cur, n_embd_head, n_head_il, n_tokens)
            gate = ggml.reshape(gate, 1, n_head_il, n_tokens)
            cur = ggml.mul(cur, gate)
            cur = ggml.reshape(cur, n_embd_head * n_head_il, n_tokens)
        else:
            cur = ggml.mul(cur, gate)
        g.cb(cur, "attn_gated", il)
        cur = g.build_lora_mm(layer.wo, cur)
        g.cb(cur, "attn_o_proj", il)
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
            ffn_shexp = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp,
                                    None, LLM_FFN_SILU, LLM_FFN_PAR, il)
            g.cb(ffn_shexp, "ffn_shexp", il)
            cur = ggml.add(moe_out, ffn_shexp)
        else:
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                              LLM_FFN_SILU, LLM_FFN_PAR, il)
        g.cb(cur, "ffn_out", il)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l)
