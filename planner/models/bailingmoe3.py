"""LLM_ARCH_BAILINGMOE3 (src/models/bailingmoe3.cpp): Ling-3.0-tiny (7.9B-A1.3B), Ling-3.0-flash
(124B-A5.1B) and their VL text models.

Three Kimi Delta Attention layers to one multi-head latent attention layer: the KDA layers (those
without KV heads) keep recurrent state (Q/K/V short convolutions, a bounded sigmoid gate, the
fused gated delta net, a sigmoid-gated output norm); the MLA layers a K-only latent cache (Q through
an optional LoRA, rope over part of the head, M-RoPE in the VL files, a head-wise sigmoid gate
before the output projection). Leading dense layers, then DeepSeek-style routed experts beside a
shared expert, with optional per-layer SwiGLU limits. The multi-token-prediction blocks
(nextn_predict_layers) are counted and skipped; their layers still get attention cache rows.
"""
from __future__ import annotations

import math

from .. import ggml
from ..ggml import Tensor
from ..graph import LLM_FFN_PAR, LLM_FFN_SILU, LLM_NORM_RMS, GraphContext, MemHybridInput
from ..hparams import LLAMA_ROPE_TYPE_MROPE, LLAMA_ROPE_TYPE_NORM, HParams
from ..model import Layer, Model, TensorCreator, require, require_gating_func
from ..model_loader import TENSOR_NOT_REQUIRED, TENSOR_SKIP, ModelLoader, tn
from .delta_net import build_gdn_l2_norm, build_recurrent_attn
from .kimi_linear import causal_conv1d


def LLAMA_ROPE_TYPE(hp: HParams) -> int:
    # VL files carry M-RoPE sections; text-only files keep NORM rope
    return LLAMA_ROPE_TYPE_MROPE if hp.use_mrope() else LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(ml: ModelLoader, hp: HParams) -> None:
    hp.f_norm_rms_eps = ml.get_f32("%s.attention.layer_norm_rms_epsilon")
    hp.n_embd_head_k_mla_impl = ml.get_u32("%s.attention.key_length_mla")
    hp.n_embd_head_v_mla_impl = ml.get_u32("%s.attention.value_length_mla")
    hp.n_lora_kv = ml.get_u32("%s.attention.kv_lora_rank")
    hp.n_lora_q = ml.get_u32("%s.attention.q_lora_rank", 0)
    hp.ssm_d_conv = ml.get_u32("%s.ssm.conv_kernel")
    hp.n_embd_head_kda = ml.get_u32("%s.kda.head_dim")
    kda_safe_gate = ml.get_bool("%s.kda.safe_gate", True)
    hp.kda_gate_lower_bound = ml.get_f32("%s.kda.gate_lower_bound")
    if ml.has("%s.rope.dimension_sections"):
        hp.rope_sections = ml.get_rope_sections()
    hp.n_ff_exp_arr = ml.get_key_or_arr("%s.expert_feed_forward_length", hp.n_layer_all)
    hp.n_ff_shexp = ml.get_u32("%s.expert_shared_feed_forward_length", 0)
    hp.n_expert_shared = ml.get_u32("%s.expert_shared_count")
    hp.n_layer_dense_lead = ml.get_u32("%s.leading_dense_block_count")
    hp.expert_weights_scale = ml.get_f32("%s.expert_weights_scale", 0.0)
    hp.expert_weights_norm = ml.get_bool("%s.expert_weights_norm", False)
    hp.expert_gating_func = ml.get_u32("%s.expert_gating_func")
    hp.swiglu_clamp_exp = ml.get_key_or_arr_f32("%s.swiglu_clamp_exp", hp.n_layer_all, 0.0)
    hp.swiglu_clamp_shexp = ml.get_key_or_arr_f32("%s.swiglu_clamp_shexp", hp.n_layer_all, 0.0)
    if hp.n_ff_shexp == 0:
        hp.n_ff_shexp = hp.n_ff_exp() * max(1, hp.n_expert_shared)
    require(ml, kda_safe_gate, f"{ml.key('%s.kda.safe_gate')} is false (GGML_ASSERT(hparams.kda_safe_gate))")
    require(ml, hp.kda_gate_lower_bound < 0.0, f"{ml.key('%s.kda.gate_lower_bound')} is {hp.kda_gate_lower_bound}, "
            "not negative (GGML_ASSERT(hparams.kda_gate_lower_bound < 0.0f))")
    # the KDA layers are the trunk's layers without KV heads (the converter writes 0 for them)
    hp.is_recr_arr = tuple(il < hp.n_layer and hp.n_head_kv(il) == 0 for il in range(hp.n_layer_all))
    require_gating_func(ml, hp)   # build_moe_ffn aborts on any other
    # no asserts in llama.cpp: an empty head or kernel is a negative view, no experts a null tensor
    if any(hp.is_recr_arr):
        require(ml, hp.n_embd_head_kda > 0, f"{ml.key('%s.kda.head_dim')} is 0 with KDA layers")
        require(ml, hp.ssm_d_conv > 1, f"{ml.key('%s.ssm.conv_kernel')} is {hp.ssm_d_conv}: no conv state for the "
                "KDA layers")
    if hp.n_layer_dense_lead < hp.n_layer_all:
        require(ml, hp.n_expert > 0, f"the {ml.arch} graph needs experts ({ml.key('%s.expert_count')} is 0)")
    require(ml, hp.n_embd_head_k_mla() > hp.n_rot(),
            f"key_length_mla {hp.n_embd_head_k_mla()} must exceed the rope dimensions {hp.n_rot()}")


def load_arch_tensors(c: TensorCreator, model: Model) -> None:
    hp = model.hparams
    n_embd, n_vocab, n_layer = hp.n_embd, hp.n_vocab, hp.n_layer
    model.tok_embd = c.create_tensor(tn("TOKEN_EMBD", "weight"), (n_embd, n_vocab))
    c.create_output(model, n_embd, n_vocab)
    # a --mtp file has no trunk (its tensors are then optional), a trunk-only file no NextN blocks
    trunk_flags = TENSOR_NOT_REQUIRED if c.mtp_only() else 0
    mtp_flags = (TENSOR_NOT_REQUIRED if c.trunk_only() else 0) | TENSOR_SKIP   # load_mtp is off
    for il, layer in enumerate(model.layers):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", il), (n_embd,), trunk_flags)
        if hp.is_recr(il):
            load_kda_tensors(c, layer, il, trunk_flags)
        else:
            load_mla_tensors(c, layer, il, trunk_flags)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", il), (n_embd,), trunk_flags)
        if il < hp.n_layer_dense_lead:
            n_ff = hp.n_ff()   # LLAMA_LOAD_LOCALS' n_ff, layer 0's
            layer.ffn_gate = c.create_tensor(tn("FFN_GATE", "weight", il), (n_embd, n_ff), trunk_flags)
            layer.ffn_up = c.create_tensor(tn("FFN_UP", "weight", il), (n_embd, n_ff), trunk_flags)
            layer.ffn_down = c.create_tensor(tn("FFN_DOWN", "weight", il), (n_ff, n_embd), trunk_flags)
        else:
            load_moe_tensors(c, layer, il, trunk_flags)
    for il, layer in enumerate(model.layers_nextn, start=n_layer):
        layer.attn_norm = c.create_tensor(tn("ATTN_NORM", "weight", il), (n_embd,), mtp_flags)
        load_mla_tensors(c, layer, il, mtp_flags)
        layer.ffn_norm = c.create_tensor(tn("FFN_NORM", "weight", il), (n_embd,), mtp_flags)
        load_moe_tensors(c, layer, il, mtp_flags)
        c.create_tensor(tn("NEXTN_EH_PROJ", "weight", il), (2 * n_embd, n_embd), mtp_flags)
        c.create_tensor(tn("NEXTN_ENORM", "weight", il), (n_embd,), mtp_flags)
        c.create_tensor(tn("NEXTN_HNORM", "weight", il), (n_embd,), mtp_flags)
        c.create_tensor(tn("LAYER_OUT_NORM", "weight", il), (n_embd,), mtp_flags)


def load_kda_tensors(c: TensorCreator, layer: Layer, il: int, flags: int) -> None:
    hp = c.hparams
    n_embd, n_head, head_dim, d_conv = hp.n_embd, hp.n_head(), hp.n_embd_head_kda, hp.ssm_d_conv
    d_inner = head_dim * n_head
    layer.ssm_q_conv = c.create_tensor(tn("SSM_CONV1D_Q", "weight", il), (d_conv, 1, d_inner, 1), flags)
    layer.ssm_k_conv = c.create_tensor(tn("SSM_CONV1D_K", "weight", il), (d_conv, 1, d_inner, 1), flags)
    layer.ssm_v_conv = c.create_tensor(tn("SSM_CONV1D_V", "weight", il), (d_conv, 1, d_inner, 1), flags)
    c.create_tensor_qkv(layer, il, n_embd, d_inner, d_inner, d_inner, flags)
    if layer.wqkv is not None:
        c.ml.fail(f"blk.{il}.attn_qkv.weight on a KDA layer: bailingmoe3's graph projects Q, K and V through "
                  "attn_q/attn_k/attn_v only, and llama.cpp would multiply by a null tensor (crash)")
    layer.ssm_f_a = c.create_tensor(tn("SSM_F_A", "weight", il), (n_embd, d_inner), flags)
    layer.ssm_beta = c.create_tensor(tn("SSM_BETA", "weight", il), (n_embd, n_head), flags)
    layer.ssm_a = c.create_tensor(tn("SSM_A_NOSCAN", None, il), (1, n_head), flags)
    layer.ssm_dt_b = c.create_tensor(tn("SSM_DT", "bias", il), (d_inner,), flags)
    layer.ssm_g_a = c.create_tensor(tn("SSM_G_A", "weight", il), (n_embd, d_inner), flags)
    layer.ssm_o_norm = c.create_tensor(tn("SSM_NORM", "weight", il), (head_dim,), flags)
    layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", il), (d_inner, n_embd), flags)


def load_mla_tensors(c: TensorCreator, layer: Layer, il: int, flags: int) -> None:
    hp = c.hparams
    n_embd, n_head = hp.n_embd, hp.n_head()
    q_lora_rank, kv_lora_rank, qk_rope_head_dim = hp.n_lora_q, hp.n_lora_kv, hp.n_rot()
    qk_head_dim, v_head_dim = hp.n_embd_head_k_mla(), hp.n_embd_head_v_mla()
    if q_lora_rank > 0:
        layer.wq_a = c.create_tensor(tn("ATTN_Q_A", "weight", il), (n_embd, q_lora_rank), flags)
        layer.attn_q_a_norm = c.create_tensor(tn("ATTN_Q_A_NORM", "weight", il), (q_lora_rank,), flags)
        layer.wq_b = c.create_tensor(tn("ATTN_Q_B", "weight", il), (q_lora_rank, n_head * qk_head_dim), flags)
    else:
        layer.wq = c.create_tensor(tn("ATTN_Q", "weight", il), (n_embd, n_head * qk_head_dim), flags)
    layer.wkv_a_mqa = c.create_tensor(tn("ATTN_KV_A_MQA", "weight", il), (n_embd, kv_lora_rank + qk_rope_head_dim),
                                      flags)
    layer.attn_kv_a_norm = c.create_tensor(tn("ATTN_KV_A_NORM", "weight", il), (kv_lora_rank,), flags)
    layer.wk_b = c.create_tensor(tn("ATTN_K_B", "weight", il), (qk_head_dim - qk_rope_head_dim, kv_lora_rank, n_head),
                                 flags)
    layer.wv_b = c.create_tensor(tn("ATTN_V_B", "weight", il), (kv_lora_rank, v_head_dim, n_head), flags)
    layer.wqkv_gate = c.create_tensor(tn("ATTN_GATE", "weight", il), (n_embd, n_head), flags)
    layer.wo = c.create_tensor(tn("ATTN_OUT", "weight", il), (n_head * v_head_dim, n_embd), flags)


def load_moe_tensors(c: TensorCreator, layer: Layer, il: int, flags: int) -> None:
    hp = c.hparams
    n_embd, n_expert, n_ff_exp, n_ff_shexp = hp.n_embd, hp.n_expert, hp.n_ff_exp(), hp.n_ff_shexp
    layer.ffn_gate_inp = c.create_tensor(tn("FFN_GATE_INP", "weight", il), (n_embd, n_expert), flags)
    layer.ffn_exp_probs_b = c.create_tensor(tn("FFN_EXP_PROBS_B", "bias", il), (n_expert,), flags)
    layer.ffn_gate_exps = c.create_tensor(tn("FFN_GATE_EXPS", "weight", il), (n_embd, n_ff_exp, n_expert), flags)
    layer.ffn_up_exps = c.create_tensor(tn("FFN_UP_EXPS", "weight", il), (n_embd, n_ff_exp, n_expert), flags)
    layer.ffn_down_exps = c.create_tensor(tn("FFN_DOWN_EXPS", "weight", il), (n_ff_exp, n_embd, n_expert), flags)
    layer.ffn_gate_shexp = c.create_tensor(tn("FFN_GATE_SHEXP", "weight", il), (n_embd, n_ff_shexp), flags)
    layer.ffn_up_shexp = c.create_tensor(tn("FFN_UP_SHEXP", "weight", il), (n_embd, n_ff_shexp), flags)
    layer.ffn_down_shexp = c.create_tensor(tn("FFN_DOWN_SHEXP", "weight", il), (n_ff_shexp, n_embd), flags)


def build(g: GraphContext) -> None:
    """llama_model_bailingmoe3::graph (embeddings_nextn_masked is false: rows picked after the norm)"""
    model, hp = g.model, g.hparams
    inp_l = g.build_inp_embd(model.tok_embd)
    g.cb(inp_l, "model.input_embed", -1)
    inp = g.build_inp_mem_hybrid_k()
    inp_pos = g.build_inp_pos()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(model.layers):
        inp_sa = inp_l
        cur = g.build_norm(inp_l, layer.attn_norm, None, LLM_NORM_RMS, il)
        g.cb(cur, "attn_norm", il)
        if hp.is_recr(il):
            cur = build_kda(g, inp, cur, il)
        else:
            cur = build_mla(g, inp, cur, inp_pos, il)
        ffn_inp = ggml.add(cur, inp_sa)
        cur = g.build_norm(ffn_inp, layer.ffn_norm, None, LLM_NORM_RMS, il)
        if il < hp.n_layer_dense_lead:
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None,
                              LLM_FFN_SILU, LLM_FFN_PAR, il)
        else:
            moe = g.build_moe_ffn(cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                                  layer.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used(), LLM_FFN_SILU,
                                  hp.expert_weights_norm, hp.expert_weights_scale, hp.expert_gating_func, il)
            shared = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp, None,
                                 LLM_FFN_SILU, LLM_FFN_PAR, il)
            cur = ggml.add(moe, shared)
        cur = ggml.add(cur, ffn_inp)
        cur = g.build_cvec(cur, il)
        g.cb(cur, "l_out", il)
        inp_l = cur

    g.build_output(inp_l, h_nextn=True, out_ids=inp_out_ids, lora=False)


def build_kda(g: GraphContext, inp: MemHybridInput, cur: Tensor, il: int) -> Tensor:
    """The KDA layer: Q, K, V through their short convolutions (bailingmoe3_causal_conv1d is
    kimi-linear's causal_conv1d with n_rs_seq 0: one conv state written per sequence), the gate
    lower_bound * sigmoid(A * (f_a(x) + dt_bias)), beta, the delta rule, the RMS-normed output
    gated by sigmoid(g_a(x)), the output projection."""
    hp, layer, ub = g.hparams, g.model.layers[il], g.ubatch
    n_head, head_dim = hp.n_head(), hp.n_embd_head_kda
    d_inner = n_head * head_dim
    n_seqs, n_tokens = ub.n_seqs, ub.n_tokens
    n_seq_tokens = n_tokens // n_seqs
    rs = inp.rs
    cache_head = rs.mem.get_head()
    conv_states_all = rs.mem.r_l[il]
    conv_state_all = g.build_rs(rs, conv_states_all, hp.n_embd_r(), n_seqs)
    q = causal_conv1d(g, conv_states_all, conv_state_all, 0, cur, layer.wq, layer.ssm_q_conv, cache_head)
    k = causal_conv1d(g, conv_states_all, conv_state_all, 1, cur, layer.wk, layer.ssm_k_conv, cache_head)
    v = causal_conv1d(g, conv_states_all, conv_state_all, 2, cur, layer.wv, layer.ssm_v_conv, cache_head)

    gate = g.mul_mat_no_lora(layer.ssm_f_a, cur)
    gate = ggml.add(gate, layer.ssm_dt_b)
    gate = ggml.reshape(gate, head_dim, n_head, n_tokens)
    a = ggml.reshape(layer.ssm_a, 1, n_head, 1)
    gate = ggml.scale(ggml.unary(ggml.mul(gate, a), "SIGMOID"), hp.kda_gate_lower_bound)
    gate = ggml.reshape(gate, head_dim, n_head, n_seq_tokens, n_seqs)
    g.cb(gate, "kda_gate", il)
    beta = g.mul_mat_no_lora(layer.ssm_beta, cur)
    beta = ggml.unary(ggml.reshape(beta, 1, n_head, n_seq_tokens, n_seqs), "SIGMOID")
    q = build_gdn_l2_norm(q, hp.f_norm_rms_eps)
    k = build_gdn_l2_norm(k, hp.f_norm_rms_eps)

    states_all = rs.mem.s_l[il]
    state = g.build_rs(rs, states_all, hp.n_embd_s(), n_seqs)
    state = ggml.reshape(state, head_dim, head_dim, n_head, n_seqs)
    out = ggml.cont(build_recurrent_attn(g, rs, states_all, q, k, v, gate, beta, state, il))

    out_gate = g.mul_mat_no_lora(layer.ssm_g_a, cur)
    out_gate = ggml.reshape(out_gate, head_dim, n_head, n_tokens)
    out = ggml.reshape(out, head_dim, n_head, n_tokens)
    out = g.build_norm(out, layer.ssm_o_norm, None, LLM_NORM_RMS, il)
    out = ggml.mul(out, ggml.unary(out_gate, "SIGMOID"))
    cur = g.mul_mat_no_lora(layer.wo, ggml.cont(out, d_inner, n_tokens))
    g.cb(cur, "kda_out", il)
    return cur


def build_mla(g: GraphContext, inp: MemHybridInput, cur: Tensor, inp_pos: Tensor, il: int) -> Tensor:
    """The MLA layer: Q (through the LoRA if any) split into its no-rope and rope parts, the
    compressed KV and its rope part, both rope parts roped (M-RoPE with sections), the absorbed
    attention over the K-only cache, then the head-wise sigmoid gate of the layer input and wo."""
    hp, layer, n_tokens = g.hparams, g.model.layers[il], g.ubatch.n_tokens
    n_head = hp.n_head()
    qk_head_dim, v_head_dim, qk_rope_head_dim = hp.n_embd_head_k_mla(), hp.n_embd_head_v_mla(), hp.n_rot()
    qk_nope_head_dim = qk_head_dim - qk_rope_head_dim
    kv_lora_rank = hp.n_lora_kv
    kq_scale = 1.0 / math.sqrt(qk_head_dim)

    def rope(x: Tensor) -> Tensor:
        if hp.use_mrope():
            return ggml.rope_multi(x, inp_pos, None, qk_rope_head_dim, hp.rope_sections, hp.rope_type,
                                   hp.n_ctx_orig_yarn)
        return ggml.rope_ext(x, inp_pos, None, qk_rope_head_dim, hp.rope_type, hp.n_ctx_orig_yarn)

    attn_input = cur
    if layer.wq_a is not None:
        q_all = g.mul_mat_no_lora(layer.wq_a, cur)
        g.cb(q_all, "q_a", il)
        q_all = g.build_norm(q_all, layer.attn_q_a_norm, None, LLM_NORM_RMS, il)
        g.cb(q_all, "q_a_norm", il)
        q_all = g.mul_mat_no_lora(layer.wq_b, q_all)
        g.cb(q_all, "q_b", il)
    else:
        q_all = g.mul_mat_no_lora(layer.wq, cur)
    q_row = ggml.row_size(q_all.type, qk_head_dim)
    q_nope = ggml.view(q_all, (qk_nope_head_dim, n_head, n_tokens), (q_row, q_row * n_head), 0)
    q_pe = ggml.view(q_all, (qk_rope_head_dim, n_head, n_tokens), (q_row, q_row * n_head),
                     ggml.row_size(q_all.type, qk_nope_head_dim))
    kv_all = g.mul_mat_no_lora(layer.wkv_a_mqa, cur)
    kv_row = ggml.row_size(kv_all.type, kv_lora_rank + qk_rope_head_dim)
    kv = ggml.view(kv_all, (kv_lora_rank, n_tokens), (kv_row,), 0)
    k_pe = ggml.view(kv_all, (qk_rope_head_dim, 1, n_tokens), (kv_row, kv_row), ggml.row_size(kv_all.type, kv_lora_rank))
    q_pe = rope(q_pe)
    k_pe = rope(k_pe)
    kv = g.build_norm(kv, layer.attn_kv_a_norm, None, LLM_NORM_RMS, il)

    q_nope = ggml.permute(q_nope, 0, 2, 1, 3)
    q_nope = g.mul_mat_no_lora(layer.wk_b, q_nope)
    q_nope = ggml.permute(q_nope, 0, 2, 1, 3)
    q = ggml.concat(q_nope, q_pe, 0)
    kv = ggml.reshape(kv, kv_lora_rank, 1, n_tokens)
    k = ggml.concat(kv, k_pe, 0)
    cur = g.build_attn(inp.attn, None, None, q, k, kv, kq_scale, il, v_mla=layer.wv_b)

    attn_gate = g.mul_mat_no_lora(layer.wqkv_gate, attn_input)
    attn_gate = ggml.unary(ggml.reshape(attn_gate, 1, n_head, n_tokens), "SIGMOID")
    cur = ggml.reshape(cur, v_head_dim, n_head, n_tokens)
    cur = ggml.mul(cur, attn_gate)
    cur = g.mul_mat_no_lora(layer.wo, ggml.cont(cur, v_head_dim * n_head, n_tokens))
    g.cb(cur, "mla_out", il)
    return cur
